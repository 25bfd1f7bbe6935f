"""Owns the ROK mode's settings: the placements (activation checkpointing, and where the offload puts the tensors saved
for backward: TBA's offloading *instead of* recomputation), the offload's knobs, the micro-batch search's budget and
every check they get, in one ``ValueError`` naming the flags; and what each worker runs: a placement's run, or a
search probe (``--warmup`` + 2 iterations at another micro-batch). No torch import here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from lightning_dos.activations.options import DEFAULT_KEEP_LAST_LAYERS, DEFAULT_MIN_TENSOR_BYTES
from lightning_dos.bench import checks
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import RunSpec, plan_argument

__all__ = ["DEFAULT_STRATEGY", "PLACEMENTS", "PROBE_MEASURED_STEPS", "ROK_STRATEGIES", "Placement", "RokConfig"]

#: The training strategies a ROK curve may run under (one per invocation).
ROK_STRATEGIES = ("deep_optimizer_states", "zero3_offload")
DEFAULT_STRATEGY = "deep_optimizer_states"
#: Measured iterations of a search probe, after the bench's warm-up.
PROBE_MEASURED_STEPS = 2
#: The most a search doubles the micro-batch to, by default.
DEFAULT_MAX_MICRO_BATCH = 1024
#: Size of the file the NVMe directory's bandwidth is measured with, by default.
DEFAULT_DISK_PROBE_MIB = 256


@dataclass(frozen=True)
class Placement:
    """One point of the ROK curve."""

    name: str  # what --activations takes
    checkpointing: bool  # activation checkpointing: each block's internals recomputed in backward
    offload: str | None  # where the offload moves saved tensors ("host", "nvme"); None: nothing moves

    @property
    def hook_placement(self) -> str:
        """The ``ActivationOffloadCallback`` placement of a run with the hooks on: ``"keep"`` measures only."""
        return self.offload or "keep"


#: Every placement, in the order they run and are reported (the reference, ``keep``, first).
PLACEMENTS: dict[str, Placement] = {p.name: p for p in (
    Placement("keep", False, None), Placement("recompute", True, None), Placement("offload-host", False, "host"),
    Placement("offload-nvme", False, "nvme"))}


def placement(name: str) -> Placement:
    """The placement called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise ValueError(f"--activations: unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}") from None


@dataclass
class RokConfig:
    """What one ``lightning-dos bench --activations ...`` invocation runs."""

    bench: BenchConfig  # the workload, steps and warm-up, the one strategy and the output directory
    placements: list[str] = field(default_factory=lambda: list(PLACEMENTS))  # in the order given
    nvme_path: str | None = None  # a local NVMe directory for offload-nvme's files (and the bandwidth test's)
    budget_gib: float | None = None  # the micro-batch search's peak activation memory budget; None: no search
    min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES  # the offload's: smaller saved storages stay on the device
    keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS  # the offload's: the last N blocks keep their activations
    max_micro_batch: int = DEFAULT_MAX_MICRO_BATCH  # the largest micro-batch the search tries
    disk_probe_mib: int = DEFAULT_DISK_PROBE_MIB  # MiB measuring the NVMe directory's bandwidth (0: not measured)

    @property
    def strategy(self) -> str:
        """The training strategy every placement runs under."""
        return self.bench.strategies[0] if self.bench.strategies else DEFAULT_STRATEGY

    @property
    def plan(self) -> str | float:
        """The strategy's plan: DOS's one plan (``--plans``, default ``auto``), 1.0 (everything offloaded) for
        ``zero3_offload``."""
        if self.strategy == "deep_optimizer_states":
            return str(self.bench.plans[0]) if self.bench.plans else "auto"
        return 1.0

    def spec(self, name: str, micro_batch: int | None = None) -> RunSpec:
        """The worker run of placement ``name``: its own run, or a search probe at ``micro_batch``."""
        label = name if micro_batch is None else f"{name}@mb{micro_batch}"
        dos = self.strategy == "deep_optimizer_states" and str(self.plan).lower() != "auto"
        return RunSpec(label, self.strategy, self.plan, args={"plan": plan_argument(str(self.plan))} if dos else {})

    def run_config(self, name: str, micro_batch: int | None = None) -> BenchConfig:
        """The bench settings of placement ``name``'s run, or of a search probe at ``micro_batch`` (the warm-up
        and :data:`PROBE_MEASURED_STEPS` iterations, the first end to end if the bench times any so)."""
        config = dataclasses.replace(self.bench, activation_checkpointing=placement(name).checkpointing,
                                     strategies=[self.strategy], devices=[1], repeats=1)
        if micro_batch is None:
            return config
        e2e = 1 if self.bench.e2e_count > 0 else 0
        return dataclasses.replace(config, micro_batch=micro_batch, steps=self.bench.warmup + PROBE_MEASURED_STEPS,
                                   e2e_steps=e2e)

    def hooks(self, name: str, on_gpu: bool) -> bool:
        """Whether placement ``name`` runs with the activation offload's hooks: always when it offloads; for
        ``keep`` and ``recompute`` only off a GPU, where the hooks' accounting (``"keep"``: measure only) is the
        memory measure. On a GPU they run as a user would, without hooks."""
        return placement(name).offload is not None or not on_gpu

    def worker_settings(self, name: str, on_gpu: bool) -> dict[str, Any]:
        """The ``activations`` entry of a worker's config file for placement ``name``."""
        p = placement(name)
        return {"placement": name, "checkpointing": p.checkpointing, "hooks": self.hooks(name, on_gpu),
                "offload": p.hook_placement, "nvme_path": self.nvme_path if p.offload == "nvme" else None,
                "min_tensor_bytes": self.min_tensor_bytes, "keep_last_layers": self.keep_last_layers}

    def to_dict(self) -> dict[str, Any]:
        """The mode's own settings (the bench settings are recorded separately)."""
        return {"placements": list(self.placements), "strategy": self.strategy, "plan": self.plan,
                "nvme_path": self.nvme_path, "budget_gib": self.budget_gib,
                "min_tensor_bytes": self.min_tensor_bytes, "keep_last_layers": self.keep_last_layers,
                "max_micro_batch": self.max_micro_batch, "disk_probe_mib": self.disk_probe_mib,
                "probe_steps": self.bench.warmup + PROBE_MEASURED_STEPS}

    def validate(self) -> None:
        """Raise ``ValueError`` listing every setting this invocation cannot run (the bench settings' included)."""
        problems = checks.problems_of(self.bench.validate) + self._placement_problems()
        if list(self.bench.devices) != [1]:
            problems.append(f"--devices: {self.bench.devices!r}; --activations runs on one device: drop --devices or "
                            "set --devices 1")
        if len(self.bench.strategies) != 1 or self.strategy not in ROK_STRATEGIES:
            problems.append(f"--strategies: {self.bench.strategies!r}; --activations runs under one strategy: set "
                            f"--strategies to one of {', '.join(ROK_STRATEGIES)} (default {DEFAULT_STRATEGY})")
        problems += self._plan_problems()
        problems += self._nvme_problems()
        if self.budget_gib is not None and (not math.isfinite(self.budget_gib) or self.budget_gib <= 0):
            problems.append(f"--activation-budget-gib: {self.budget_gib} must be a number of GiB > 0")
        for flag, value, least in (("--activation-min-tensor-bytes", self.min_tensor_bytes, 0),
                                   ("--activation-keep-last-layers", self.keep_last_layers, 0),
                                   ("--max-micro-batch", self.max_micro_batch, 1),
                                   ("--disk-probe-mib", self.disk_probe_mib, 0)):
            if not checks.is_count(value, least):
                problems.append(f"{flag}: {value!r} must be an integer >= {least}")
        if (isinstance(self.max_micro_batch, int) and isinstance(self.bench.micro_batch, int)
                and self.budget_gib is not None and self.max_micro_batch < self.bench.micro_batch):
            problems.append(f"--max-micro-batch: {self.max_micro_batch} is below --micro-batch "
                            f"{self.bench.micro_batch}; set it to at least the micro-batch the search starts from")
        checks.raise_problems("", problems)

    def _placement_problems(self) -> list[str]:
        if not self.placements:
            return [f"--activations: give one or more placements: {', '.join(PLACEMENTS)}"]
        problems = []
        unknown = [name for name in self.placements if name not in PLACEMENTS]
        if unknown:
            problems.append(f"--activations: unknown placement(s) {', '.join(map(repr, unknown))}; choose from "
                            f"{', '.join(PLACEMENTS)}")
        if checks.repeated(self.placements):
            problems.append(f"--activations: {', '.join(checks.repeated(self.placements))} given more than once; give "
                            "each placement once")
        return problems

    def _plan_problems(self) -> list[str]:
        """One DOS plan (any the strategy takes), or none but ``auto`` for ``zero3_offload``."""
        from lightning_dos.planning.plan import parse_plan

        plans = [str(plan) for plan in self.bench.plans]
        if self.strategy != "deep_optimizer_states":
            if plans not in ([], ["auto"]):
                return [f"--plans: {' '.join(plans)}: only deep_optimizer_states has plans; drop --plans or set "
                        "--strategies deep_optimizer_states"]
            return []
        if len(plans) != 1:
            return [f"--plans: {' '.join(plans) or 'none'}; --activations runs every placement under one DOS plan: "
                    "give one (default auto)"]
        return [f"--plans: {err}" for err in checks.problems_of(lambda: parse_plan(plan_argument(plans[0])))]

    def _nvme_problems(self) -> list[str]:
        """``--nvme-path`` is needed by ``offload-nvme`` (an existing, writable directory with room) and by nothing
        else."""
        from lightning_dos.activations.options import MIN_FREE_DISK_BYTES, check_nvme_path

        wants = "offload-nvme" in self.placements
        if not wants:
            if self.nvme_path is not None:
                return ["--nvme-path: only used by the offload-nvme placement; add offload-nvme to --activations or "
                        "drop --nvme-path"]
            return []
        if self.nvme_path is None:
            return ["--nvme-path: offload-nvme writes the activations to files; set --nvme-path to an existing, "
                    "writable directory on a local NVMe disk (or drop offload-nvme from --activations)"]
        probe = self.disk_probe_mib if isinstance(self.disk_probe_mib, int) else 0
        free = MIN_FREE_DISK_BYTES + probe * 2**20
        return checks.problems_of(lambda: check_nvme_path(self.nvme_path, key="--nvme-path", min_free_bytes=free))
