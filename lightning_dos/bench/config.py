"""Owns the bench's settings: what one invocation measures, in either mode, with no torch import.

:class:`BenchConfig` holds everything one ``lightning-dos bench`` invocation shares (model, data, batch, steps,
which strategies); it round-trips through JSON, so the parent can write a worker's config file and the report can
print the full resolved configuration. :class:`SweepConfig` is the plan sweep's (``--sweep``): the bench settings,
the fixed plans swept, iterations per plan and the memory budgets (:class:`Budget`). For each budget one training
process runs every fixed plan for ``steps_per_plan`` iterations and ``auto`` for ``bench.steps`` iterations,
interleaved (:func:`sweep_schedule`): the host's speed drifts by more than 10% over tens of seconds, and plans held in
turn each met a different spell of it. ``auto`` starts cold (starting cost values, then its probe) and keeps its
own calibration. A budget is ``unlimited`` (no limit but the free device memory), ``quarter`` (room for a quarter of
the optimizer state: 0.25 x 12 bytes x the model's parameters) or a number of GiB.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from lightning_dos.bench.strategies import DEFAULT_PLANS, DEFAULT_RATIOS, STRATEGIES, plan_argument

#: Phases timed in every iteration, in milliseconds.
PHASES = ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")
#: Per-iteration host accounting of the fwd, bwd and step phases (``lightning_dos.bench.timing``): the CPU ms of the
#: threads other than the training thread, and the training thread's involuntary context switches.
HOST_KEYS = tuple(f"{phase}_{kind}" for phase in ("fwd", "bwd", "step") for kind in ("other_cpu_ms", "preempted"))
#: Per-iteration peak GPU memory (allocated, GiB) of the fwd, bwd and step phases of a synchronised iteration
#: (``lightning_dos.bench.timing``; GPU only): the step's runs from the end of the backward to the iteration's end.
PHASE_PEAKS = tuple(f"{phase}_peak_gpu_gib" for phase in ("fwd", "bwd", "step"))
#: Data sources a bench can feed the model.
DATA_SOURCES = ("synthetic", "text")


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
    """Sequences per iteration on each device (each data-parallel rank)."""
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
    e2e_steps: int | None = None
    """Iterations right after the warm-up timed end to end with no synchronisation (what a user sees); the rest are
    timed phase by phase, synchronised. None: half the measured iterations, rounded down (0 with one measured)."""
    repeats: int = 1
    """Runs of each configuration, each in a fresh process, interleaved across configurations."""
    devices: list[int] = field(default_factory=lambda: [1])
    """Data-parallel device counts: every configuration runs once on each (one rank per device, on this host)."""
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    """Strategy kinds to run: any of zero3_offload, static_split, deep_optimizer_states, no_offload."""
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    """Static-split ratios (share of the optimizer state DeepSpeed keeps on the host)."""
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_PLANS))
    """DOS plans: ``auto`` plus any fixed plans (host, device, a fraction, stride:K, or lanes joined by commas)."""
    overlap: list[bool] = field(default_factory=lambda: [False])
    """DOS runs with the update phase overlapped with the next forward (True), without (False), or both, in order.
    Explicit either way (the strategy's own default, ``"auto"``, is True at one device): only a serial row's phases
    hold the whole update."""
    leaf_blocks: list[bool] = field(default_factory=lambda: [True])
    """DOS runs with ZeRO-3 hooking each transformer block once (True, the strategy's default on one device), every
    layer (False), or both, in order."""
    resident_gib: list[Union[float, str]] = field(default_factory=lambda: ["auto"])
    """DOS runs with this many GiB of device memory for resident subgroups (``resident_gib``), one row each; 0: none;
    ``"auto"`` (the strategy's default): as many as fit beside the measured peak."""
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
    """Output directory for the outputs and the per-run logs; empty picks one under runs/."""

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
    def e2e_count(self) -> int:
        """Measured iterations timed end to end: ``e2e_steps``, or half the measured ones (rounded down) if unset."""
        return self.measured_steps // 2 if self.e2e_steps is None else self.e2e_steps

    @property
    def e2e_iterations(self) -> range:
        """Indices (from 0) of the iterations timed end to end, unsynchronised: right after the warm-up."""
        return range(self.warmup, self.warmup + self.e2e_count)

    @property
    def phase_iterations(self) -> range:
        """Indices (from 0) of the iterations timed phase by phase, synchronised: every one after the e2e window."""
        return range(self.warmup + self.e2e_count, self.steps)

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens one iteration trains on, per device."""
        return self.micro_batch * self.seq_len

    def global_tokens_per_iteration(self, devices: int) -> int:
        """Tokens one iteration trains on over ``devices`` data-parallel ranks (each its own micro-batch)."""
        return self.tokens_per_iteration * devices

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
        e2e = self.e2e_steps
        if e2e is not None and (isinstance(e2e, bool) or not isinstance(e2e, int) or e2e < 0):
            problems.append(f"e2e_steps: {e2e!r} must be an integer >= 0, or unset for half the measured iterations")
        elif (e2e is not None and isinstance(self.steps, int) and isinstance(self.warmup, int)
              and 0 <= self.warmup < self.steps <= self.warmup + e2e):
            problems.append(f"e2e_steps: {e2e} end-to-end iterations after {self.warmup} of warm-up leave no "
                            f"synchronised iteration of {self.steps} steps; set --steps above --warmup + --e2e-steps "
                            f"({self.warmup + e2e + 1} or more) or lower --e2e-steps")
        problems += devices_problems(self.devices)
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            problems.append(f"strategies: {self.strategies!r}; choose one or more of {', '.join(STRATEGIES)}")
        for ratio in self.ratios:
            if not 0.0 <= ratio < 1.0:
                problems.append(f"ratios: {ratio} must be in [0, 1) (1.0 is zero3_offload itself)")
        if (not isinstance(self.overlap, list) or not self.overlap
                or not all(isinstance(value, bool) for value in self.overlap)):
            problems.append(f"overlap: {self.overlap!r} must be a non-empty list of true/false (--overlap off on)")
        if (not isinstance(self.leaf_blocks, list) or not self.leaf_blocks
                or not all(isinstance(value, bool) for value in self.leaf_blocks)):
            problems.append(f"leaf_blocks: {self.leaf_blocks!r} must be a non-empty list of true/false "
                            "(--leaf-blocks on off)")
        if (not isinstance(self.resident_gib, list) or not self.resident_gib
                or not all(v == "auto" or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                             and 0 <= v < float("inf")) for v in self.resident_gib)):
            problems.append(f"resident_gib: {self.resident_gib!r} must be a non-empty list of auto or sizes >= 0 in "
                            "GiB (--resident-gib auto 0 3.5)")
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


def devices_problems(devices: Any) -> list[str]:
    """What is wrong with a list of device counts (``--devices``): empty, not integers >= 1, or repeated."""
    if not isinstance(devices, (list, tuple)) or not devices:
        return [f"devices: {devices!r}; give one or more device counts, e.g. --devices 1 2"]
    bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, int) or d < 1]
    if bad:
        return [f"devices: {bad!r} must be integers >= 1 (data-parallel ranks per configuration), e.g. --devices 1 2"]
    repeated = sorted({d for d in devices if list(devices).count(d) > 1})
    if repeated:
        return [f"devices: {repeated} given more than once; give each device count once, e.g. --devices 1 2"]
    return []


GIB = 1024**3
#: Fixed plans swept by default: fractions 0.0-1.0 by 0.1, then stride:2..6.
DEFAULT_SWEEP_PLANS = tuple(f"{k / 10:.1f}" for k in range(11)) + tuple(f"stride:{k}" for k in range(2, 7))
#: Budgets swept by default.
DEFAULT_BUDGETS = ("unlimited", "quarter")
#: Share of the optimizer state (fp32 master, m and v: 12 bytes per parameter) the ``quarter`` budget holds.
QUARTER_SHARE = 0.25
STATE_BYTES_PER_PARAM = 12
#: Iterations of each plan left out of its statistics (the first: buffers and gradients change with the plan).
PLAN_WARMUP = 1
#: The plan name of ``auto``'s iterations in a sweep's schedule.
AUTO = "auto"
#: Leading iterations of an ``auto`` run always left out: its two probe steps (the host lane alone, then half the
#: subgroups on each lane) and the first step of the chosen plan.
AUTO_MIN_EXCLUDED = 3


def sweep_schedule(plans: Sequence[str], rounds: int, auto_steps: int = 0) -> list[str]:
    """The plan of each iteration of a sweep process, in order.

    ``rounds`` rounds of every fixed plan, one iteration each, in the order given. The first round runs alone (it is
    every plan's warm-up, left out of the figures); ``auto_steps`` iterations of ``auto`` (:data:`AUTO`) are spread
    evenly over the later rounds, so that slow and fast spells of the host fall on ``auto`` and on every fixed plan
    alike. ``auto``'s k-th iteration comes just before iteration ``k * n // auto_steps`` of those ``n`` later ones.
    """
    first, later = list(plans), list(plans) * (rounds - 1)
    if auto_steps <= 0:
        return first + later
    slots = [k * len(later) // auto_steps for k in range(auto_steps)]
    out = first
    for i, plan in enumerate(later):
        out += [AUTO] * slots.count(i)
        out.append(plan)
    return out + [AUTO] * sum(slot >= len(later) for slot in slots)


@dataclass(frozen=True)
class Budget:
    """One memory budget of the sweep, resolved for the model."""

    name: str
    """As given: ``unlimited``, ``quarter`` or a number of GiB."""
    gib: float | None
    """The DOS ``memory_budget_gib`` it stands for; None for no limit beyond the free device memory."""

    @property
    def label(self) -> str:
        """E.g. ``unlimited``, ``quarter (7.81 GiB)``, ``12 GiB``."""
        if self.gib is None:
            return self.name
        if self.name == "quarter":
            return f"quarter ({self.gib:.2f} GiB)"
        return f"{self.gib:g} GiB"

    @property
    def slug(self) -> str:
        """A file-name-safe form of the name."""
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy, with the label."""
        return {"name": self.name, "gib": self.gib, "label": self.label}


def check_budget(text: str) -> str:
    """``text`` normalised (``unlimited``, ``quarter`` or a number of GiB); ``ValueError`` for anything else."""
    value = str(text).strip().lower()
    if value in ("unlimited", "quarter"):
        return value
    try:
        gib = float(value)
    except ValueError:
        raise ValueError(f"budgets: {text!r} is not a budget; use 'unlimited', 'quarter' or a number of GiB") from None
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"budgets: {text!r} must be a number of GiB >= 0")
    return f"{gib:g}"


def resolve_budget(text: str, params: int) -> Budget:
    """The budget ``text`` for a model of ``params`` parameters (one rank holds them all)."""
    name = check_budget(text)
    if name == "unlimited":
        return Budget(name, None)
    if name == "quarter":
        return Budget(name, QUARTER_SHARE * STATE_BYTES_PER_PARAM * params / GIB)
    return Budget(name, float(name))


@dataclass
class SweepConfig:
    """What a plan sweep runs: the bench settings, the fixed plans, iterations per plan and the budgets.

    Each budget's process interleaves the fixed plans and ``bench.steps`` iterations of ``auto``
    (:func:`sweep_schedule`); of ``auto``'s, the first ``bench.warmup`` (at least the two probe steps and the first step
    of the plan chosen after them) are left out.
    """

    bench: BenchConfig
    """Model, data, precision, timing and output settings, shared with ``lightning-dos bench``."""
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_SWEEP_PLANS))
    """Fixed plans swept in one process per budget: ``host``, ``device``, a fraction, ``stride:K`` or lanes."""
    steps_per_plan: int = 3
    """Iterations each fixed plan runs, one per round; the first (the first round) is warm-up."""
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    """Memory budgets: ``unlimited``, ``quarter`` or a number of GiB."""

    @property
    def fixed_steps(self) -> int:
        """Iterations of the fixed plans in one budget's process."""
        return len(self.plans) * self.steps_per_plan

    @property
    def auto_steps(self) -> int:
        """Iterations of ``auto``, interleaved with the fixed plans' rounds after the first."""
        return self.bench.steps

    @property
    def process_steps(self) -> int:
        """Iterations of one budget's process: the fixed plans' and ``auto``'s."""
        return self.fixed_steps + self.auto_steps

    @property
    def auto_excluded(self) -> int:
        """Leading iterations of ``auto`` left out: its warm-up, at least the probe steps and one more."""
        return max(self.bench.warmup, AUTO_MIN_EXCLUDED)

    def to_dict(self) -> dict[str, Any]:
        """The sweep's own settings (the bench settings are recorded separately)."""
        return {"plans": list(self.plans), "steps_per_plan": self.steps_per_plan, "plan_warmup": PLAN_WARMUP,
                "budgets": list(self.budgets), "auto_steps": self.auto_steps, "auto_excluded": self.auto_excluded}

    def process_config(self, budget: Budget) -> BenchConfig:
        """The bench settings of the process of ``budget`` (every fixed plan and ``auto``, interleaved)."""
        # e2e_steps=0: every iteration synchronised; the sweep's figures are update phases, indexed by iteration
        return dataclasses.replace(self.bench, memory_budget_gib=budget.gib, steps=self.process_steps,
                                   warmup=PLAN_WARMUP, e2e_steps=0, strategies=["deep_optimizer_states"],
                                   plans=[*self.plans, "auto"])

    def validate(self) -> None:
        """Raise ``ValueError`` listing every setting the sweep cannot run (the bench settings' own included)."""
        from lightning_dos.planning.plan import parse_plan

        problems = []
        try:
            self.bench.validate()
        except ValueError as err:
            problems.append(str(err))
        if list(self.bench.devices) != [1]:
            problems.append(f"devices: {self.bench.devices!r}; the plan sweep runs on one device: drop --devices or "
                            "set --devices 1")
        if not self.plans:
            problems.append("sweep plans: give at least one fixed plan")
        for plan in self.plans:
            try:
                spec = parse_plan(plan_argument(str(plan)))
            except ValueError as err:
                problems.append(str(err))
                continue
            if spec.kind == "auto":
                problems.append("sweep plans: 'auto' is not a fixed plan; the sweep runs it between the fixed plans "
                                "(--steps iterations)")
        lowered = [str(p).strip().lower() for p in self.plans]
        repeated = sorted({p for p in lowered if lowered.count(p) > 1})
        if repeated:
            problems.append(f"sweep plans: {repeated} given more than once")
        steps = self.steps_per_plan
        if isinstance(steps, bool) or not isinstance(steps, int) or steps <= PLAN_WARMUP:
            problems.append(f"steps per plan: {steps!r} must be an integer >= {PLAN_WARMUP + 1} "
                            f"(the first {PLAN_WARMUP} of each plan is warm-up)")
        if not self.budgets:
            problems.append("budgets: give at least one budget")
        for budget in self.budgets:
            try:
                check_budget(budget)
            except ValueError as err:
                problems.append(str(err))
        if isinstance(self.bench.steps, int) and self.bench.steps <= self.auto_excluded:
            problems.append(f"steps: auto's first {self.auto_excluded} iterations are left out (the "
                            f"probe, the first step of its plan, warm-up); set steps > {self.auto_excluded}")
        if problems:
            raise ValueError("sweep: " + "; ".join(problems))
