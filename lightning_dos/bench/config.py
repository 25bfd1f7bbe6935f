"""Owns the bench's settings: what one invocation measures, in any mode, with no torch import.

:class:`BenchConfig` holds the bench's own settings and the workload flags given, each None unless given (then the
recipe's: :mod:`~lightning_dos.bench.compose`). It round-trips through JSON, for a worker's config file and the
report. The sweep's and the ROK curve's own settings are in their packages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

from lightning_dos.bench.kinds import DEFAULT_PLANS, DEFAULT_RATIOS, STRATEGIES

#: Phases timed in every iteration, in milliseconds.
PHASES = ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")
#: Per-iteration host accounting of the fwd, bwd and step phases (``lightning_dos.bench.timing``): the CPU ms of the
#: threads other than the training thread, and the training thread's involuntary context switches.
HOST_KEYS = tuple(f"{phase}_{kind}" for phase in ("fwd", "bwd", "step") for kind in ("other_cpu_ms", "preempted"))
#: Per-iteration peak GPU memory (allocated, GiB) of the fwd, bwd and step phases of a synchronised iteration
#: (``lightning_dos.bench.timing``; GPU only): the step's runs from the end of the backward to the iteration's end.
PHASE_PEAKS = tuple(f"{phase}_peak_gpu_gib" for phase in ("fwd", "bwd", "step"))
#: Data sources the bench's flags can pick (``--synthetic``, ``--text``).
DATA_SOURCES = ("synthetic", "text")


@dataclass
class BenchConfig:
    """Settings shared by every configuration of one bench invocation (workload flags: None = the recipe's)."""

    recipe: str | None = None
    """Training recipe (the YAML of ``lightning-dos fit --config``) every configuration starts from; None: the
    bench's own (:data:`~lightning_dos.bench.compose.BENCH_RECIPE`: gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed)."""
    model: str | None = None
    """Model preset of ``lightning_dos.models.gpt.PRESETS`` (``model.name``)."""
    n_layer: int | None = None
    """Transformer blocks (``model.n_layer``)."""
    n_embd: int | None = None
    """Hidden size (``model.n_embd``)."""
    n_head: int | None = None
    """Query heads (``model.n_head``)."""
    vocab_size: int | None = None
    """The data's vocabulary, which the model's follows (synthetic ``vocab_size``, text ``bpe_vocab_size``)."""
    seq_len: int | None = None
    """Tokens per sequence (``data.seq_len``; also the model's block size)."""
    micro_batch: int | None = None
    """Sequences per iteration on each device (``data.batch_size``)."""
    precision: str | None = None
    """Lightning precision (``trainer.precision``), e.g. ``32-true`` on a CPU."""
    activation_checkpointing: bool | None = None
    """Recompute block activations in the backward pass (``model.activation_checkpointing``)."""
    data: str | None = None
    """``synthetic`` (SyntheticDataModule) or ``text`` (TextDataModule); None: the recipe's data module."""
    data_paths: list[str] | None = None
    """Text files, directories or globs (``data.paths``; None: the Python standard library's sources)."""
    tokenizer: str | None = None
    """Tokenizer file (``data.tokenizer``; None: a BPE trained on the corpus once and cached)."""
    bpe_vocab_size: int | None = None
    """Vocabulary of the BPE trained when no tokenizer is given (``data.bpe_vocab_size``)."""
    max_bytes: int | None = None
    """Corpus bytes read (``data.max_bytes``)."""
    seed: int | None = None
    """Seed of the model initialisation and of the data (``seed_everything``); identical for every configuration."""
    learning_rate: float | None = None
    """Peak AdamW learning rate (``model.learning_rate``)."""
    accelerator: str | None = None
    """Lightning accelerator (``trainer.accelerator``): ``auto``, ``gpu``/``cuda`` or ``cpu``."""
    sub_group_size: int | None = None
    """Parameters per optimizer-state subgroup, for every fragment that has subgroups; None: each fragment's."""
    pin_memory: bool | None = None
    """Page-locked host memory for offloaded state, for every fragment that pins; None: each fragment's (on)."""
    memory_budget_gib: float | None = None
    """Device memory the DOS optimizer state may use; None: the fragment's (what is free)."""
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
    """Strategy kinds to run (:data:`~lightning_dos.bench.kinds.STRATEGIES`)."""
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    """Static-split ratios (share of the optimizer state DeepSpeed keeps on the host)."""
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_PLANS))
    """DOS plans: ``auto`` plus any fixed plans (host, device, a fraction, stride:K, or lanes joined by commas)."""
    overlap: list[Union[bool, str]] = field(default_factory=lambda: ["auto"])
    """DOS rows with the update overlapped with the next forward (True), serial (False), or as the strategy decides
    (``"auto"``: overlapped on CUDA devices), one row each, in order."""
    leaf_blocks: list[bool] = field(default_factory=lambda: [True])
    """DOS rows with ZeRO-3 hooking each transformer block once (True, the strategy's default on one device), every
    layer (False), or both, in order."""
    resident_gib: list[Union[float, str]] = field(default_factory=lambda: ["auto"])
    """DOS rows with this many GiB of device memory for resident subgroups (``resident_gib``), one row each; 0: none;
    ``"auto"`` (the strategy's default): as many as fit beside the measured peak."""
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
    def tokens_per_iteration(self) -> int | None:
        """Tokens one iteration trains on, per device (None before the workload is resolved)."""
        return None if self.micro_batch is None or self.seq_len is None else self.micro_batch * self.seq_len

    def global_tokens_per_iteration(self, devices: int) -> int | None:
        """Tokens one iteration trains on over ``devices`` data-parallel ranks (each its own micro-batch)."""
        tokens = self.tokens_per_iteration
        return None if tokens is None else tokens * devices

    def validate(self) -> None:
        """Raise ``ValueError`` listing every bench setting that cannot run (the workload's are the CLI's to check)."""
        problems = []
        for name in ("steps", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name}: {value!r} must be an integer >= 1")
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
                or not all(value in ("auto", True, False) for value in self.overlap)):
            problems.append(f"overlap: {self.overlap!r} must be a non-empty list of auto, true or false "
                            "(--overlap auto off on)")
        if (not isinstance(self.leaf_blocks, list) or not self.leaf_blocks
                or not all(isinstance(value, bool) for value in self.leaf_blocks)):
            problems.append(f"leaf_blocks: {self.leaf_blocks!r} must be a non-empty list of true/false "
                            "(--leaf-blocks on off)")
        if (not isinstance(self.resident_gib, list) or not self.resident_gib
                or not all(v == "auto" or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                             and 0 <= v < float("inf")) for v in self.resident_gib)):
            problems.append(f"resident_gib: {self.resident_gib!r} must be a non-empty list of auto or sizes >= 0 in "
                            "GiB (--resident-gib auto 0 3.5)")
        if self.data is not None and self.data not in DATA_SOURCES:
            problems.append(f"data: {self.data!r}; choose one of {', '.join(DATA_SOURCES)}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s: {self.timeout_s} must be > 0 seconds")
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
