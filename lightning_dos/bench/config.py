"""Owns the benchmark's configuration: the resolved bench settings and the list of configurations they expand to.

``BenchConfig`` holds everything one ``lightning-dos bench`` invocation shares (model, data, batch, steps,
which strategies); ``RunSpec`` is one configuration, one repeat, as handed to a worker process. Both are plain
dataclasses that round-trip through JSON, so the parent can write a worker's config file and the report can
print the full resolved configuration. No torch import here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

#: Strategy kinds the harness compares, in the order they run and are reported.
STRATEGIES = ("zero3_offload", "static_split", "deep_optimizer_states", "no_offload")
#: The control every speedup and loss comparison is measured against.
BASELINE = "zero3_offload"
#: DOS plans always benchmarked, before any fixed plans asked for.
DEFAULT_PLANS = ("auto",)
#: DeepSpeed static-split ratios (fraction of the optimizer state kept on the host).
DEFAULT_RATIOS = (0.25, 0.5, 0.75)
#: Phases timed in every iteration, in milliseconds.
PHASES = ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")
#: Per-iteration host accounting of the fwd, bwd and step phases (``lightning_dos.bench.timing``): the CPU ms of the
#: threads other than the training thread, and the training thread's involuntary context switches.
HOST_KEYS = tuple(f"{phase}_{kind}" for phase in ("fwd", "bwd", "step") for kind in ("other_cpu_ms", "preempted"))
#: Data sources a bench can feed the model.
DATA_SOURCES = ("synthetic", "text")

PlanValue = Union[str, float, None]


@dataclass
class BenchConfig:
    """Settings shared by every configuration of one bench invocation."""

    model: str = "gpt-2.7b"
    """Model preset from ``lightning_dos.models.gpt.PRESETS``; the shape fields below override it."""
    n_layer: int | None = None
    """Transformer blocks; None keeps the preset's."""
    n_embd: int | None = None
    """Hidden size; None keeps the preset's."""
    n_head: int | None = None
    """Query heads; None keeps the preset's."""
    vocab_size: int | None = None
    """Token ids in the embedding; None keeps the preset's (with text data it must cover the tokenizer)."""
    seq_len: int = 2048
    """Tokens per sequence (also the model's block size)."""
    micro_batch: int = 4
    """Sequences per iteration on the one device."""
    precision: str = "bf16-mixed"
    """Lightning precision string, e.g. ``bf16-mixed`` on a GPU, ``32-true`` on a CPU."""
    activation_checkpointing: bool = True
    """Recompute block activations in the backward pass."""
    sub_group_size: int = 100_000_000
    """Parameters per optimizer-state subgroup, the same for every strategy."""
    steps: int = 10
    """Training iterations per run, warm-up included."""
    warmup: int = 3
    """Leading iterations excluded from every statistic."""
    repeats: int = 1
    """Runs of each configuration, each in a fresh process, interleaved across configurations."""
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    """Strategy kinds to run: any of zero3_offload, static_split, deep_optimizer_states, no_offload."""
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    """Static-split ratios (share of the optimizer state DeepSpeed keeps on the host)."""
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_PLANS))
    """DOS plans: ``auto`` plus any fixed plans (host, device, a fraction, stride:K, or lanes joined by commas)."""
    data: str = "synthetic"
    """Token source: ``synthetic`` (deterministic random tokens) or ``text`` (a tokenised corpus)."""
    data_paths: list[str] | None = None
    """Text files, directories or globs for ``data=text``; None uses the Python standard library's sources."""
    tokenizer: str | None = None
    """Tokenizer file for ``data=text``; None trains a BPE tokenizer on the corpus once and caches it."""
    bpe_vocab_size: int = 4096
    """Vocabulary of the BPE tokenizer trained for ``data=text`` when no tokenizer file is given."""
    max_bytes: int | None = 16_000_000
    """Corpus bytes read for ``data=text``; None reads it all."""
    recipe: str | None = None
    """Training recipe (YAML) the model, data and precision settings were read from, if any."""
    seed: int = 1234
    """Seed of the model initialisation and of the data; identical for every configuration."""
    learning_rate: float = 3e-4
    """AdamW learning rate (constant: no warm-up, cosine to the end of ``steps``)."""
    accelerator: str = "auto"
    """Lightning accelerator for the workers: ``auto``, ``gpu``/``cuda`` or ``cpu``."""
    pin_memory: bool = True
    """Page-locked host memory for offloaded optimizer state (every offloading strategy)."""
    memory_budget_gib: float | None = None
    """Device memory the DOS device lane may use; None lets DOS use what is free."""
    timeout_s: float = 1800.0
    """Wall-clock limit of one configuration's process, start-up included."""
    force_no_offload: bool = False
    """Run no_offload even when the model and optimizer state clearly exceed the GPU's memory."""
    out: str = ""
    """Output directory for results.json, report.md, chart.png and the per-run logs; empty picks one under runs/."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchConfig:
        """The config written by :meth:`to_dict`; unknown keys are an error naming the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"bench config: unknown keys {unknown}; known keys: {sorted(known)}")
        return cls(**data)

    @property
    def measured_steps(self) -> int:
        """Iterations per run that enter the statistics."""
        return self.steps - self.warmup

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens one iteration trains on."""
        return self.micro_batch * self.seq_len

    def validate(self) -> None:
        """Raise ``ValueError`` listing every setting that cannot run."""
        problems = []
        for name in ("seq_len", "micro_batch", "steps", "repeats", "sub_group_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name}: {value!r} must be an integer >= 1")
        for name in ("n_layer", "n_embd", "n_head", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                problems.append(f"{name}: {value!r} must be an integer >= 1, or unset for the preset's")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            problems.append(f"warmup: {self.warmup!r} must be an integer >= 0")
        elif isinstance(self.steps, int) and self.warmup >= self.steps:
            problems.append(f"warmup: {self.warmup} leaves no measured iteration of {self.steps} steps; "
                            "set steps > warmup")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            problems.append(f"strategies: {self.strategies!r}; choose one or more of {', '.join(STRATEGIES)}")
        for ratio in self.ratios:
            if not 0.0 <= ratio < 1.0:
                problems.append(f"ratios: {ratio} must be in [0, 1) (1.0 is zero3_offload itself)")
        if self.data not in DATA_SOURCES:
            problems.append(f"data: {self.data!r}; choose one of {', '.join(DATA_SOURCES)}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s: {self.timeout_s} must be > 0 seconds")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate: {self.learning_rate} must be > 0")
        if self.memory_budget_gib is not None and self.memory_budget_gib < 0:
            problems.append(f"memory_budget_gib: {self.memory_budget_gib} must be >= 0 GiB or unset")
        if problems:
            raise ValueError("bench: " + "; ".join(problems))


@dataclass
class RunSpec:
    """One configuration, one repeat: what a worker process runs."""

    label: str
    """Unique, human-readable name, e.g. ``zero3_offload``, ``static_split(0.5)``, ``dos(auto)``."""
    strategy: str
    """Strategy kind, one of :data:`STRATEGIES`."""
    plan: PlanValue
    """DOS plan as given, the static-split ratio (1.0 for zero3_offload), or None for no_offload."""
    repeat: int = 0
    """Index of this repeat, from 0."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @property
    def slug(self) -> str:
        """The label as a file-name-safe string."""
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.label).strip("_")


def plan_argument(plan: str) -> str | float | list[str]:
    """The DOS strategy's ``plan`` argument for a plan given on the command line.

    ``"0.5"`` becomes the fraction 0.5, ``"host,device,host"`` a list of lanes, anything else stays a string.
    """
    text = plan.strip()
    if "," in text:
        return [part.strip() for part in text.split(",")]
    try:
        return float(text)
    except ValueError:
        return text


def dos_plans(config: BenchConfig) -> list[str]:
    """The DOS plans to run: ``auto`` first, then the fixed plans asked for, without repeats."""
    plans: list[str] = []
    for plan in [*DEFAULT_PLANS, *config.plans]:
        text = str(plan).strip()
        if text.lower() not in [p.lower() for p in plans]:
            plans.append(text)
    return plans


def expand(config: BenchConfig) -> list[RunSpec]:
    """One ``RunSpec`` per configuration for repeat 0, in report order (the baseline first)."""
    specs: list[RunSpec] = []
    for strategy in STRATEGIES:
        if strategy not in config.strategies:
            continue
        if strategy == "zero3_offload":
            specs.append(RunSpec(label="zero3_offload", strategy=strategy, plan=1.0))
        elif strategy == "static_split":
            for ratio in dict.fromkeys(float(r) for r in config.ratios):
                specs.append(RunSpec(label=f"static_split({ratio:g})", strategy=strategy, plan=ratio))
        elif strategy == "deep_optimizer_states":
            for plan in dos_plans(config):
                specs.append(RunSpec(label=f"dos({plan})", strategy=strategy, plan=plan))
        else:
            specs.append(RunSpec(label="no_offload", strategy=strategy, plan=None))
    return specs


def schedule(specs: list[RunSpec], repeats: int) -> list[RunSpec]:
    """Every configuration ``repeats`` times, round-robin, so slow drift of the host spreads over all of them."""
    return [dataclasses.replace(spec, repeat=r) for r in range(repeats) for spec in specs]
