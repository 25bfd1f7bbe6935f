"""Owns the strategy kinds the bench compares: the rows each adds to a report, and the strategy fragment each runs.

A kind is what ``--strategies`` names; each row (:class:`RunSpec`) runs a fragment of ``configs/strategy/`` (what a
user composes after a recipe) with the row's own strategy arguments on top (``args``; ``{}``: exactly the fragment).
At N > 1 devices (``--devices``) a row's label ends in ``@dp<N>``. No torch import here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

PlanValue = Union[str, float, None]

#: The checkout the package runs from: ``configs/strategy/`` holds the fragments, and workers import the same code.
ROOT = Path(__file__).resolve().parents[2]
FRAGMENTS = ROOT / "configs" / "strategy"

#: The control every speedup and loss comparison is measured against.
BASELINE = "zero3_offload"
#: DOS plans always benchmarked, before any fixed plans asked for.
DEFAULT_PLANS = ("auto",)
#: DeepSpeed static-split ratios (fraction of the optimizer state kept on the host).
DEFAULT_RATIOS = (0.25, 0.5, 0.75)
#: The suffix of a row's label at more than one device: ``dos(auto)@dp2``.
DP_SUFFIX = "@dp"


@dataclass
class RunSpec:
    """One configuration, one repeat: what a worker process runs."""

    label: str  # unique, e.g. zero3_offload, static_split(0.5), dos(auto)
    strategy: str  # its kind (STRATEGIES)
    plan: PlanValue  # DOS plan as given, the split's ratio (1.0 for zero3_offload), else None
    repeat: int = 0
    devices: int = 1  # data-parallel ranks; the label ends in @dp<N> above 1
    fragment: str = ""  # its strategy fragment, configs/strategy/<fragment>.yaml (default: the kind's)
    args: dict[str, Any] = field(default_factory=dict)  # the row's strategy arguments over the fragment

    def __post_init__(self) -> None:
        if not self.fragment:
            self.fragment = KINDS[self.strategy].fragment if self.strategy in KINDS else self.strategy

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def slug(self) -> str:
        """The label as a file-name-safe string."""
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.label).strip("_")


@dataclass(frozen=True)
class StrategyKind:
    """One kind of strategy the bench can run."""

    name: str  # what --strategies takes
    fragment: str = ""  # its fragment, configs/strategy/<fragment>.yaml (default: its name)
    rows: Callable[[Any], list[RunSpec]] | None = None  # its rows for a BenchConfig; None: one, labelled by its name
    keeps_states_on_device: bool = False  # skipped when the model states clearly cannot fit the GPU
    single_device: bool = False  # trains on one device only: skipped above one
    builds_on_host: bool = False  # builds the model on the host (other initial draws than the others' on a GPU)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fragment", self.fragment or self.name)


def plan_argument(plan: str) -> str | float | list[str]:
    """The DOS ``plan`` argument for a plan as given: ``"0.5"`` -> 0.5, ``"host,device"`` -> a list of lanes."""
    text = plan.strip()
    if "," in text:
        return [part.strip() for part in text.split(",")]
    try:
        return float(text)
    except ValueError:
        return text


def dos_plans(config: Any) -> list[str]:
    """The DOS plans to run: ``auto`` first, then the fixed plans asked for, without repeats."""
    plans: list[str] = []
    for plan in [*DEFAULT_PLANS, *config.plans]:
        text = str(plan).strip()
        if text.lower() not in [p.lower() for p in plans]:
            plans.append(text)
    return plans


def dos_rows(config: Any) -> list[RunSpec]:
    """DOS's configurations: every plan, once per ``overlap``, ``leaf_blocks`` and ``resident_gib`` setting; each
    sets only what differs from the fragment (``auto`` and ``on`` leave the strategy's defaults)."""
    rows = []
    for plan in dos_plans(config):
        for overlap in dict.fromkeys(config.overlap):
            for leaf in dict.fromkeys(config.leaf_blocks):
                for gib in dict.fromkeys(config.resident_gib):
                    args: dict[str, Any] = {} if plan.lower() == "auto" else {"plan": plan_argument(plan)}
                    suffix = ""
                    if overlap != "auto":
                        args["overlap"], suffix = overlap, ",overlap" if overlap else ",serial"
                    if not leaf:
                        args["leaf_blocks"], suffix = False, suffix + ",layer-hooks"
                    if gib != "auto":
                        args["resident_gib"], suffix = gib, suffix + f",resident={gib:g}GiB"
                    rows.append(RunSpec(f"dos({plan}{suffix})", "deep_optimizer_states", plan, args=args))
    return rows


def split_rows(config: Any) -> list[RunSpec]:
    """One static split per ratio: its own fragment where there is one (0.25, 0.5, 0.75), else vanilla's with the
    ratio set."""
    rows = []
    for ratio in dict.fromkeys(float(r) for r in config.ratios):
        own = f"static_split_{ratio:g}"
        fragment, args = (own, {}) if (FRAGMENTS / f"{own}.yaml").is_file() else (BASELINE, {"ratio": ratio})
        rows.append(RunSpec(f"static_split({ratio:g})", "static_split", ratio, fragment=fragment, args=args))
    return rows


#: Every strategy kind, in the order they run and are reported (the baseline first).
KINDS: dict[str, StrategyKind] = {kind.name: kind for kind in (
    StrategyKind("zero3_offload", rows=lambda config: [RunSpec("zero3_offload", "zero3_offload", 1.0)]),
    StrategyKind("static_split", BASELINE, split_rows),
    StrategyKind("deep_optimizer_states", "dos_auto", dos_rows),
    StrategyKind("no_offload", keeps_states_on_device=True),
    StrategyKind("plain", keeps_states_on_device=True, single_device=True),  # the floor one GPU can reach
    StrategyKind("torchao_offload", single_device=True),
    StrategyKind("superoffload"),
    StrategyKind("zenflow"),
    StrategyKind("fsdp_offload", builds_on_host=True),  # the multi-GPU peer
)}
#: Strategy kind names, in report order.
STRATEGIES = tuple(KINDS)


def kind_rows(kind: StrategyKind, config: Any) -> list[RunSpec]:
    """The rows of ``kind`` for ``config`` (repeat 0, one device)."""
    return kind.rows(config) if kind.rows is not None else [RunSpec(kind.name, kind.name, None)]


def at_devices(spec: RunSpec, devices: int) -> RunSpec:
    """``spec`` on ``devices`` data-parallel ranks; the label as given at one device, ``<label>@dp<N>`` above."""
    label = spec.label if devices == 1 else f"{spec.label}{DP_SUFFIX}{devices}"
    return dataclasses.replace(spec, label=label, devices=devices)


def base_label(label: str) -> str:
    """A row's label without its ``@dp<N>`` suffix: the configuration it measures at any device count."""
    head, sep, tail = label.rpartition(DP_SUFFIX)
    return head if sep and tail.isdigit() else label


def expand(config: Any) -> list[RunSpec]:
    """One ``RunSpec`` per configuration and device count for repeat 0, in report order: every configuration at the
    first device count (the baseline first), then at the next one."""
    return [at_devices(spec, devices) for devices in config.devices
            for name, kind in KINDS.items() if name in config.strategies for spec in kind_rows(kind, config)]


def devices_of(result: dict[str, Any]) -> int:
    """The device count of a result or raw result (1 for those from before ``--devices``)."""
    return int(result.get("devices") or 1)


def single_device_reason(spec: RunSpec) -> str | None:
    """Why ``spec`` cannot run at its device count (a single-device kind on several), or None to run it."""
    kind = KINDS.get(spec.strategy)
    if kind is None or not kind.single_device or spec.devices == 1:
        return None
    return f"single-GPU only: {spec.strategy} trains on one device; not run at {spec.devices} devices"


def schedule(specs: list[RunSpec], repeats: int) -> list[RunSpec]:
    """Every configuration ``repeats`` times, round-robin, so slow drift of the host spreads over all of them."""
    return [dataclasses.replace(spec, repeat=r) for r in range(repeats) for spec in specs]
