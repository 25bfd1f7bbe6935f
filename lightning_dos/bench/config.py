"""Owns the bench's settings: what one invocation measures, in any mode, with no torch import.

:class:`BenchConfig` holds the bench's own settings and the workload flags given, each None unless given (then the
recipe's: :mod:`~lightning_dos.bench.compose`). It round-trips through JSON, for a worker's config file and the
report. The sweep's and the ROK curve's own settings are in their packages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

from lightning_dos.bench.checks import is_count, raise_problems, repeated
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

    # the workload: each overrides the recipe's (the lightning-dos fit argument named) when given
    recipe: str | None = None  # the recipe every configuration starts from; None: compose.BENCH_RECIPE
    model: str | None = None  # model.name: a preset of lightning_dos.models.gpt.PRESETS
    n_layer: int | None = None  # model.n_layer
    n_embd: int | None = None  # model.n_embd
    n_head: int | None = None  # model.n_head
    vocab_size: int | None = None  # the data's vocabulary, the model's too (data.vocab_size or data.bpe_vocab_size)
    seq_len: int | None = None  # data.seq_len, the model's block size too
    micro_batch: int | None = None  # data.batch_size: sequences per iteration on each device
    precision: str | None = None  # trainer.precision
    activation_checkpointing: bool | None = None  # model.activation_checkpointing
    data: str | None = None  # synthetic (SyntheticDataModule) or text (TextDataModule); None: the recipe's
    data_paths: list[str] | None = None  # data.paths: text files, directories or globs
    tokenizer: str | None = None  # data.tokenizer
    bpe_vocab_size: int | None = None  # data.bpe_vocab_size
    max_bytes: int | None = None  # data.max_bytes
    seed: int | None = None  # seed_everything: model initialisation and data, the same for every configuration
    learning_rate: float | None = None  # model.learning_rate
    accelerator: str | None = None  # trainer.accelerator: auto, gpu/cuda or cpu
    sub_group_size: int | None = None  # for every fragment that has subgroups; None: each fragment's
    pin_memory: bool | None = None  # for every fragment that pins offloaded state; None: each fragment's (on)
    memory_budget_gib: float | None = None  # the most GPU memory DOS's optimizer state may use; None: what is free
    # the bench's own
    steps: int = 10  # training iterations per run, warm-up included
    warmup: int = 3  # leading iterations left out of every statistic
    e2e_steps: int | None = None  # iterations after the warm-up timed end to end (None: half the measured ones)
    repeats: int = 1  # fresh-process runs of each configuration, interleaved
    devices: list[int] = field(default_factory=lambda: [1])  # data-parallel device counts, every configuration on each
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))  # the strategy kinds to run
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))  # static-split ratios
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_PLANS))  # DOS plans: auto, then any fixed ones
    overlap: list[Union[bool, str]] = field(default_factory=lambda: ["auto"])  # DOS rows: auto, True, False
    leaf_blocks: list[bool] = field(default_factory=lambda: [True])  # DOS rows: hooks on each block, or every layer
    resident_gib: list[Union[float, str]] = field(default_factory=lambda: ["auto"])  # DOS rows: GiB resident, or auto
    timeout_s: float = 1800.0  # wall-clock limit of one worker process, start-up included
    force_no_offload: bool = False  # run no_offload even when the states clearly cannot fit the GPU
    out: str = ""  # output directory; empty picks one under runs/

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
        problems = [f"{name}: {getattr(self, name)!r} must be an integer >= 1" for name in ("steps", "repeats")
                    if not is_count(getattr(self, name), 1)]
        if not isinstance(self.warmup, int) or self.warmup < 0:
            problems.append(f"warmup: {self.warmup!r} must be an integer >= 0")
        elif isinstance(self.steps, int) and self.warmup >= self.steps:
            problems.append(f"warmup: {self.warmup} leaves no measured iteration of {self.steps} steps; "
                            "set steps > warmup")
        e2e = self.e2e_steps
        if e2e is not None and not is_count(e2e, 0):
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
        for name, valid, allowed in (
                ("overlap", lambda v: v in ("auto", True, False), "auto, true or false (--overlap auto off on)"),
                ("leaf_blocks", lambda v: isinstance(v, bool), "true/false (--leaf-blocks on off)"),
                ("resident_gib", lambda v: v == "auto" or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                           and 0 <= v < float("inf")),
                 "auto or sizes >= 0 in GiB (--resident-gib auto 0 3.5)")):
            values = getattr(self, name)
            if not isinstance(values, list) or not values or not all(valid(v) for v in values):
                problems.append(f"{name}: {values!r} must be a non-empty list of {allowed}")
        if self.data is not None and self.data not in DATA_SOURCES:
            problems.append(f"data: {self.data!r}; choose one of {', '.join(DATA_SOURCES)}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s: {self.timeout_s} must be > 0 seconds")
        if self.memory_budget_gib is not None and self.memory_budget_gib < 0:
            problems.append(f"memory_budget_gib: {self.memory_budget_gib} must be >= 0 GiB or unset")
        raise_problems("bench: ", problems)


def devices_problems(devices: Any) -> list[str]:
    """What is wrong with a list of device counts (``--devices``): empty, not integers >= 1, or repeated."""
    if not isinstance(devices, (list, tuple)) or not devices:
        return [f"devices: {devices!r}; give one or more device counts, e.g. --devices 1 2"]
    bad = [d for d in devices if not is_count(d, 1)]
    if bad:
        return [f"devices: {bad!r} must be integers >= 1 (data-parallel ranks per configuration), e.g. --devices 1 2"]
    if repeated(devices):
        return [f"devices: {repeated(devices)} given more than once; give each device count once, e.g. --devices 1 2"]
    return []
