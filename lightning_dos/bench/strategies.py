"""Owns the strategies the bench compares: for each kind, the rows it adds to the report and how a worker builds it.

A strategy kind is one :class:`StrategyKind` in :data:`KINDS`: its name (what ``--strategies`` takes), the
configurations it contributes for a bench's settings (:class:`RunSpec`, one report row each) and the Lightning
strategy a worker builds for one of them. Adding a strategy to the comparison is adding one entry; the harness,
the workers, results, report and chart take every kind from here. No torch import here (``build`` imports lazily,
in the worker).

Beside DOS and its DeepSpeed baselines, the peers a user could pick instead (:mod:`lightning_dos.strategies.peers`)
are kinds too, all in the default list so that one bench on the GPU host compares every one: ``plain`` (one GPU,
nothing offloaded), ``torchao_offload``, ``superoffload``, ``zenflow`` and ``fsdp_offload`` (torch FSDP with CPU
offload, :mod:`lightning_dos.strategies.fsdp_offload`: the multi-GPU peer, run at every device count). A peer that
cannot run here (no CUDA device, torchao not installed: ``pip install 'lightning-dos[peers]'``) still gets its row,
with status ``failed`` and the first line of the error that says why, raised by its strategy before the model is
built.

Data parallelism (``--devices N [M ...]``): every configuration runs once per device count, its :class:`RunSpec`
carrying ``devices``; the labels of the rows at more than one device get the suffix ``@dp<N>``. A kind that trains on
one device only (``single_device``: ``plain``, ``torchao_offload``) still gets its rows at N > 1, ``skipped`` with
the reason (:func:`single_device_reason`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, Union

PlanValue = Union[str, float, None]


class BenchSettings(Protocol):
    """What a kind reads of a bench's settings, a :class:`lightning_dos.bench.config.BenchConfig`: a protocol, so that
    this module, whose names the config imports, imports nothing of the config."""

    strategies: list[str]
    devices: list[int]
    ratios: list[float]
    plans: list[str]
    overlap: list[bool]
    leaf_blocks: list[bool]
    resident_gib: list[float | str]
    sub_group_size: int
    memory_budget_gib: float | None
    pin_memory: bool


#: The control every speedup and loss comparison is measured against.
BASELINE = "zero3_offload"
#: DOS plans always benchmarked, before any fixed plans asked for.
DEFAULT_PLANS = ("auto",)
#: DeepSpeed static-split ratios (fraction of the optimizer state kept on the host).
DEFAULT_RATIOS = (0.25, 0.5, 0.75)
#: What a DOS row's plan is followed by in its label when the update overlaps the next forward: ``dos(auto,overlap)``.
OVERLAP_SUFFIX = ",overlap"
#: ... and when ZeRO-3 hooks every layer instead of each block (``leaf_blocks=False``): ``dos(auto,layer-hooks)``.
LAYER_HOOKS_SUFFIX = ",layer-hooks"
#: ... and when subgroups stay on the device (``resident_gib``): ``dos(auto,resident=3.5GiB)``.
RESIDENT_SUFFIX = ",resident={:g}GiB"


@dataclass
class RunSpec:
    """One configuration, one repeat: what a worker process runs."""

    label: str
    """Unique, human-readable name, e.g. ``zero3_offload``, ``static_split(0.5)``, ``dos(auto)``."""
    strategy: str
    """Strategy kind, one of :data:`STRATEGIES`."""
    plan: PlanValue
    """DOS plan as given, the static-split ratio (1.0 for zero3_offload), or None for no_offload and the peers."""
    repeat: int = 0
    """Index of this repeat, from 0."""
    devices: int = 1
    """Data-parallel ranks (devices) the configuration trains on; its label ends in ``@dp<N>`` above 1."""
    overlap: bool = False
    """DOS only: the update phase overlapped with the next forward (``overlap=True``); its label ends in
    ``,overlap)``."""
    leaf_blocks: bool = True
    """DOS only: ZeRO-3 hooks each transformer block once (``leaf_blocks="auto"``, the default) or, when False, every
    layer (``leaf_blocks=False``); the label then ends in ``,layer-hooks)``."""
    resident_gib: float | str = "auto"
    """DOS only: GiB of device memory for resident subgroups (``resident_gib``), or ``"auto"`` (the strategy's
    default: the label says nothing); a number ends the label in ``,resident=<GiB>GiB)`` (0: ``,resident=0GiB)``)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @property
    def slug(self) -> str:
        """The label as a file-name-safe string."""
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.label).strip("_")


@dataclass(frozen=True)
class StrategyKind:
    """One kind of strategy the bench can run."""

    name: str
    """What ``--strategies`` takes and results.json's ``strategy`` says."""
    summary: str
    """One line for the command line's help and the docs."""
    rows: Callable[[BenchSettings], list[RunSpec]]
    """The configurations this kind contributes for a bench's settings, in report order (repeat 0)."""
    build: Callable[[BenchSettings, RunSpec], Any]
    """The Lightning strategy of one configuration (called in the worker; import torch-heavy modules inside)."""
    keeps_states_on_device: bool = False
    """Whether the model and optimizer states all stay on the GPU: then the harness skips the kind when they clearly
    cannot fit (unless ``--force-no-offload``)."""
    single_device: bool = False
    """Whether the kind trains on one device only: its rows at more than one device are skipped, with the reason."""
    builds_on_host: bool = False
    """Whether the model is built on the host, where the other kinds build it on the device: on a GPU its initial
    weights are then other draws of the same distribution (the CPU's random numbers, not the GPU's)."""


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


def dos_plans(config: BenchSettings) -> list[str]:
    """The DOS plans to run: ``auto`` first, then the fixed plans asked for, without repeats."""
    plans: list[str] = []
    for plan in [*DEFAULT_PLANS, *config.plans]:
        text = str(plan).strip()
        if text.lower() not in [p.lower() for p in plans]:
            plans.append(text)
    return plans


def dos_rows(config: BenchSettings) -> list[RunSpec]:
    """DOS's configurations: every plan of :func:`dos_plans`, once per ``config.overlap``, ``config.leaf_blocks``
    and ``config.resident_gib`` setting."""
    return [RunSpec(label=f"dos({plan}{OVERLAP_SUFFIX if overlap else ''}{'' if leaf else LAYER_HOOKS_SUFFIX}"
                          f"{'' if gib == 'auto' else RESIDENT_SUFFIX.format(gib)})",
                    strategy="deep_optimizer_states", plan=plan, overlap=overlap, leaf_blocks=leaf, resident_gib=gib)
            for plan in dos_plans(config) for overlap in dict.fromkeys(config.overlap)
            for leaf in dict.fromkeys(config.leaf_blocks) for gib in dict.fromkeys(config.resident_gib)]


def _offload(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.baselines import ZeRO3OffloadStrategy

    ratio = 1.0 if spec.plan is None else float(spec.plan)
    return ZeRO3OffloadStrategy(ratio=ratio, sub_group_size=config.sub_group_size, pin_memory=config.pin_memory)


def dos_arguments(config: BenchSettings, spec: RunSpec) -> dict[str, Any]:
    """The ``DeepOptimizerStatesStrategy`` arguments of a DOS row that differ from the strategy's defaults (results.json
    records them as the row's ``strategy_args``; ``{}`` would be exactly what a user gets with no options). The bench
    always sets ``sub_group_size`` (every strategy the same) and ``overlap`` (each row says whether it overlaps)."""
    args: dict[str, Any] = {"sub_group_size": config.sub_group_size, "overlap": spec.overlap}
    if str(spec.plan).strip().lower() != "auto":
        args["plan"] = plan_argument(str(spec.plan))
    if config.memory_budget_gib is not None:
        args["memory_budget_gib"] = config.memory_budget_gib
    if not config.pin_memory:
        args["pin_memory"] = False
    if not spec.leaf_blocks:
        args["leaf_blocks"] = False
    if spec.resident_gib != "auto":
        args["resident_gib"] = spec.resident_gib
    return args


def strategy_arguments(config: BenchSettings, spec: RunSpec) -> dict[str, Any] | None:
    """What results.json records as a row's ``strategy_args``: DOS rows' arguments beyond the strategy's defaults
    (:func:`dos_arguments`); None for the other kinds (their builders below say what they set)."""
    return dos_arguments(config, spec) if spec.strategy == "deep_optimizer_states" else None


def _dos(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos import DeepOptimizerStatesStrategy

    return DeepOptimizerStatesStrategy(**dos_arguments(config, spec))


def _no_offload(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.baselines import ZeRO3Strategy

    return ZeRO3Strategy(sub_group_size=config.sub_group_size)


def _plain(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.peers import PlainStrategy

    return PlainStrategy()


def _torchao_offload(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.peers import TorchaoOffloadStrategy

    return TorchaoOffloadStrategy()  # the bench never clips, which torchao_offload requires


def _superoffload(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.peers import SuperOffloadStrategy

    return SuperOffloadStrategy(sub_group_size=config.sub_group_size, pin_memory=config.pin_memory)


def _zenflow(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.peers import ZenFlowStrategy

    return ZenFlowStrategy(pin_memory=config.pin_memory)  # ZeRO-2: there are no subgroups to size


def _fsdp_offload(config: BenchSettings, spec: RunSpec) -> Any:
    from lightning_dos.strategies.fsdp_offload import FSDPOffloadStrategy

    return FSDPOffloadStrategy()  # FSDP pins its host shards itself: config.pin_memory has nothing to set


def _one_row(name: str) -> Callable[[BenchSettings], list[RunSpec]]:
    """The rows of a kind with one configuration, labelled by its name."""
    return lambda config: [RunSpec(label=name, strategy=name, plan=None)]


#: Every strategy kind, in the order they run and are reported (the baseline first).
KINDS: dict[str, StrategyKind] = {kind.name: kind for kind in (
    StrategyKind(
        "zero3_offload", "vanilla DeepSpeed ZeRO-3 with the optimizer state offloaded to pinned host memory",
        lambda config: [RunSpec(label="zero3_offload", strategy="zero3_offload", plan=1.0)], _offload),
    StrategyKind(
        "static_split", "DeepSpeed's static split: a share R of the optimizer state on the host, the rest on the GPU",
        lambda config: [RunSpec(label=f"static_split({ratio:g})", strategy="static_split", plan=ratio)
                        for ratio in dict.fromkeys(float(r) for r in config.ratios)], _offload),
    StrategyKind(
        "deep_optimizer_states", "Deep Optimizer States: auto, plus any fixed plans asked for, with the update "
        "overlapped or not (--overlap)", dos_rows, _dos),
    StrategyKind(
        "no_offload", "ZeRO-3 with everything on the GPU", lambda config: [
            RunSpec(label="no_offload", strategy="no_offload", plan=None)], _no_offload, keeps_states_on_device=True),
    StrategyKind(
        "plain", "peer: no ZeRO, no offload, torch AdamW on one GPU (the floor one GPU can reach)",
        _one_row("plain"), _plain, keeps_states_on_device=True, single_device=True),
    StrategyKind(
        "torchao_offload", "peer: torchao's CPUOffloadOptimizer on one CUDA GPU, no clipping (lightning-dos[peers])",
        _one_row("torchao_offload"), _torchao_offload, single_device=True),
    StrategyKind(
        "superoffload", "peer: DeepSpeed SuperOffload, ZeRO-3 offload with super_offload (CUDA only)",
        _one_row("superoffload"), _superoffload),
    StrategyKind(
        "zenflow", "peer: DeepSpeed ZenFlow at ZeRO-2, optimizer offloaded (approximate: defers unimportant columns)",
        _one_row("zenflow"), _zenflow),
    StrategyKind(
        "fsdp_offload", "peer: torch FSDP (FULL_SHARD, a unit per block) with CPU offload: parameters, gradients and "
        "AdamW on the host; every device count (CUDA only)", _one_row("fsdp_offload"), _fsdp_offload,
        builds_on_host=True),
)}
#: Strategy kind names, in report order.
STRATEGIES = tuple(KINDS)


#: The suffix of a row's label at more than one device: ``dos(auto)@dp2``.
DP_SUFFIX = "@dp"


def at_devices(spec: RunSpec, devices: int) -> RunSpec:
    """``spec`` on ``devices`` data-parallel ranks; the label as given at one device, ``<label>@dp<N>`` above."""
    label = spec.label if devices == 1 else f"{spec.label}{DP_SUFFIX}{devices}"
    return dataclasses.replace(spec, label=label, devices=devices)


def base_label(label: str) -> str:
    """A row's label without its ``@dp<N>`` suffix: the configuration it measures at any device count."""
    head, sep, tail = label.rpartition(DP_SUFFIX)
    return head if sep and tail.isdigit() else label


def expand(config: BenchSettings) -> list[RunSpec]:
    """One ``RunSpec`` per configuration and device count for repeat 0, in report order: every configuration at the
    first device count of ``config.devices`` (the baseline first), then at the next one."""
    return [at_devices(spec, devices) for devices in config.devices
            for name, kind in KINDS.items() if name in config.strategies for spec in kind.rows(config)]


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


def build_strategy(config: BenchSettings, spec: RunSpec) -> Any:
    """The Lightning strategy of ``spec``, with the bench's subgroup size and pinning."""
    kind = KINDS.get(spec.strategy)
    if kind is None:
        raise ValueError(f"strategy: {spec.strategy!r} is not a bench strategy kind; use one of {', '.join(KINDS)}")
    return kind.build(config, spec)
