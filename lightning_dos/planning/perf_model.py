"""Owns the performance model: the predicted time of one optimizer step under a plan, and its device memory.

The model is a small deterministic event schedule (see docs/performance-model.md for the equations):

* the device lane is a 3-stage pipeline over ``plan.device_order``: prefetch (H2D of master/m/v, plus the fp32 grad
  when it sits on the host), fused Adam on the GPU, flush (D2H of master/m/v), with ``plan.buffers`` slots;
* the host lane runs CPU Adam on its subgroups back to back in ``plan.host_order``, each followed by an upload of its
  new fp32 master weights on the H2D link (the device writes the 16-bit params from them), which it shares
  first-come first-served with the device-lane prefetches; the host never waits for an upload;
* CPU Adam runs at ``cpu_adam_params_per_s / ranks_per_host``, times ``cpu_contention`` whenever the device
  lane is non-empty; the two PCIe directions are scaled down together to respect the duplex cap whenever the
  device lane is non-empty;
* the device lane's first :func:`early_prefetches` prefetches are issued at dispatch, ``dispatch_lead_s`` before
  the phase starts: the link carries them from ``-dispatch_lead_s`` on, and their Adams start at 0 at the earliest.

Pure Python: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from .plan import Lane, Plan, _check_length, _check_sizes

#: The device lane's prefetch window: while its subgroups are issued between host-lane subgroups, at most this many
#: prefetches are outstanding; at dispatch, this many (at most one per buffer slot) are issued before the phase.
PREFETCH_WINDOW = 2
#: Parameters per piece of a device-lane subgroup: the device lane streams a subgroup through its buffer slots a piece
#: at a time, so a slot holds one piece (``update/device_lane.py`` takes its size from here).
PIECE_PARAMS = 32 * 1024 * 1024


@dataclass(frozen=True)
class CostParams:
    """Rates and sizes that drive the model; the defaults are starting values from a reference host."""

    cpu_adam_params_per_s: float = 5.0e9
    """Host-lane CPU Adam rate of the whole host, parameters per second, with PCIe idle."""
    cpu_contention: float = 0.76
    """Multiplier in (0, 1] on the CPU Adam rate while device-lane DMA runs (memory bandwidth is shared)."""
    h2d_bytes_per_s: float = 55.5e9
    """Pinned host-to-device bandwidth of one GPU, bytes per second, alone."""
    d2h_bytes_per_s: float = 55.4e9
    """Device-to-host bandwidth of one GPU, bytes per second, alone."""
    duplex_bytes_per_s: float = 101.6e9
    """Total of both directions when they run at once, bytes per second."""
    gpu_adam_params_per_s: float = 1.23e11
    """Fused Adam rate on the GPU, parameters per second."""
    launch_overhead_s: float = 50e-6
    """Fixed cost of each device-lane subgroup's Adam (kernel launches, stream sync), seconds."""
    host_upload_bytes_per_param: int = 4
    """Bytes uploaded per host-lane parameter after its CPU Adam (the fp32 master; the device converts it)."""
    state_bytes_per_param: int = 12
    """Bytes of optimizer state per parameter moved each way by the device lane (fp32 master + m + v)."""
    grad_bytes_per_param: int = 4
    """Bytes of gradient per parameter prefetched when the grad sits on the host, in its own dtype (the manager sets
    it from the optimizer: 2 for 16-bit gradients, 4 in fp32 or when they accumulate)."""
    slot_grad_bytes_per_param: int = 4
    """Bytes per parameter of a buffer slot's gradient row on the device (fp32; a 16-bit gradient is prefetched into
    half of it)."""
    device_grad_bytes_per_param: int = 4
    """Bytes per parameter of a gradient kept on the device through backward, in its own dtype (the manager sets
    it from the optimizer: 2 for 16-bit gradients, 4 when they accumulate in fp32)."""
    slot_params: int = PIECE_PARAMS
    """Parameters a device-lane buffer slot holds: a piece of the largest device-lane subgroup, at most this many (the
    lane streams larger subgroups a piece at a time)."""
    ranks_per_host: int = 1
    """Ranks sharing this host's CPU cores (the CPU rate is divided among them; PCIe is per GPU)."""
    dispatch_lead_s: float = 0.0
    """Time from the dispatch of a step's plan, when the device lane's first prefetches are issued, to the start of
    the update phase, seconds (0: no head start)."""

    def __post_init__(self) -> None:
        for name in ("cpu_adam_params_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_bytes_per_s",
                     "gpu_adam_params_per_s"):
            value = getattr(self, name)
            if not _finite(value) or value <= 0:
                raise ValueError(f"{name}: {value!r} is not a rate; set {name} to a positive finite number")
        if not _finite(self.cpu_contention) or not 0 < self.cpu_contention <= 1:
            raise ValueError(
                f"cpu_contention: {self.cpu_contention!r} is outside (0, 1]; set cpu_contention to the factor "
                "by which CPU Adam slows while PCIe transfers run (1 = no slowdown)"
            )
        for name in ("launch_overhead_s", "dispatch_lead_s"):
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                raise ValueError(f"{name}: {value!r} must be a finite number of seconds >= 0")
        for name in ("host_upload_bytes_per_param", "state_bytes_per_param", "grad_bytes_per_param",
                     "slot_grad_bytes_per_param", "device_grad_bytes_per_param"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: {value!r} is not a byte count; set {name} to an integer >= 0")
        if self.state_bytes_per_param == 0:
            raise ValueError("state_bytes_per_param: must be > 0; set it to 12 for fp32 master + exp_avg + exp_avg_sq")
        if isinstance(self.slot_params, bool) or not isinstance(self.slot_params, int) or self.slot_params < 1:
            raise ValueError(f"slot_params: {self.slot_params!r}; set slot_params to an integer >= 1")
        if isinstance(self.ranks_per_host, bool) or not isinstance(self.ranks_per_host, int) or self.ranks_per_host < 1:
            raise ValueError(f"ranks_per_host: {self.ranks_per_host!r}; set ranks_per_host to an integer >= 1")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of all cost parameters (the keys accepted as overrides)."""
        return tuple(f.name for f in fields(cls))

    def with_values(self, values: dict[str, float], key: str = "overrides") -> CostParams:
        """A copy with ``values`` replacing fields; unknown names raise ValueError naming ``key``."""
        known = self.field_names()
        current = {name: getattr(self, name) for name in known}
        for name, value in values.items():
            if name not in known:
                raise ValueError(f"{key}: {name!r} is not a cost parameter; use one of {', '.join(known)}")
            if isinstance(current[name], int) and not isinstance(current[name], bool):
                # integer fields (byte counts, ranks) accept integral floats, e.g. from a YAML file
                if isinstance(value, bool) or not float(value).is_integer():
                    raise ValueError(f"{key}: {name} must be an integer, got {value!r}")
                value = int(value)
            else:
                value = float(value)
            current[name] = value
        return CostParams(**current)

    def duplex_scale(self) -> float:
        """Factor applied to both directions while both run: min(1, duplex / (h2d + d2h))."""
        return min(1.0, self.duplex_bytes_per_s / (self.h2d_bytes_per_s + self.d2h_bytes_per_s))

    def to_json(self) -> dict[str, float]:
        """The parameters as a JSON-serialisable dict."""
        return {name: getattr(self, name) for name in self.field_names()}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SubgroupEvent:
    """Predicted timeline of one subgroup's optimizer step, seconds from the start of the step."""

    subgroup: int
    """Subgroup id."""
    lane: Lane
    """Lane that updates it."""
    start_s: float
    """Start of its first activity."""
    end_s: float
    """End of its last activity."""
    adam_start_s: float
    """Start of its Adam (CPU Adam on the host lane, fused Adam on the device lane)."""
    adam_end_s: float
    """End of its Adam."""
    h2d_start_s: float
    """Start of its H2D transfer: the prefetch (device lane) or the 16-bit param upload (host lane)."""
    h2d_end_s: float
    """End of its H2D transfer."""
    d2h_start_s: float | None = None
    """Start of its flush of master/m/v (device lane only)."""
    d2h_end_s: float | None = None
    """End of its flush (device lane only)."""


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one optimizer step under a plan."""

    makespan_s: float
    """Time until both lanes are done, seconds."""
    host_lane_s: float
    """End of the host lane's last CPU Adam or param upload (0 without host subgroups)."""
    device_lane_s: float
    """End of the device lane's last flush (0 without device subgroups)."""
    events: tuple[SubgroupEvent, ...]
    """One event per subgroup, indexed by subgroup id."""
    bytes_h2d: int
    """Bytes moved host to device: prefetches plus host-lane param uploads."""
    bytes_d2h: int
    """Bytes moved device to host: flushes."""
    host_busy_s: float
    """Total CPU Adam time on the host lane."""
    h2d_busy_s: float
    """Total time the H2D link is busy."""
    d2h_busy_s: float
    """Total time the D2H link is busy."""
    adam_busy_s: float
    """Total fused Adam time on the GPU, launch overheads included."""

    def to_json(self) -> dict[str, float]:
        """The scalar results as a JSON-serialisable dict (events left out)."""
        return {
            "makespan_s": self.makespan_s,
            "host_lane_s": self.host_lane_s,
            "device_lane_s": self.device_lane_s,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "host_busy_s": self.host_busy_s,
            "h2d_busy_s": self.h2d_busy_s,
            "d2h_busy_s": self.d2h_busy_s,
            "adam_busy_s": self.adam_busy_s,
        }


def buffer_slots(buffers: int, device_subgroups: int) -> int:
    """Buffer slots of a device lane of ``device_subgroups`` subgroups: ``buffers``, at most one each, at least 1."""
    return max(1, min(buffers, device_subgroups))


def early_prefetches(buffers: int, device_subgroups: int) -> int:
    """Device-lane prefetches issued at dispatch: one per buffer slot, ``PREFETCH_WINDOW`` at most (0 without a
    device lane)."""
    if device_subgroups <= 0:
        return 0
    return min(PREFETCH_WINDOW, buffer_slots(buffers, device_subgroups))


def _check_grads(grads_on_device: frozenset[int] | set[int], n: int) -> frozenset[int]:
    bad = sorted(i for i in grads_on_device if not isinstance(i, int) or not 0 <= i < n)
    if bad:
        raise ValueError(f"grads_on_device: subgroups {bad} do not exist; ids must be in [0, {n})")
    return frozenset(grads_on_device)


@dataclass
class _Timeline:
    """Start/end times of every stage, as plain lists (the planner's hot path builds thousands of these)."""

    host: tuple[int, ...]
    adam_host: list[tuple[float, float]]
    upload: list[tuple[float, float]]
    prefetch: list[tuple[float, float]]
    adam: list[tuple[float, float]]
    flush: list[tuple[float, float]]

    def host_lane_s(self) -> float:
        return max((max(a[1], u[1]) for a, u in zip(self.adam_host, self.upload)), default=0.0)

    def device_lane_s(self) -> float:
        return self.flush[-1][1] if self.flush else 0.0

    def makespan_s(self) -> float:
        return max(self.host_lane_s(), self.device_lane_s())


def _timeline(plan: Plan, sizes: Sequence[int], params: CostParams, grads_on_device: frozenset[int]) -> _Timeline:
    """The event schedule of one step; inputs are already validated."""
    order = plan.device_order
    host = plan.host_order
    buffers = plan.buffers
    busy = bool(order)  # device lane non-empty: CPU contention and the duplex cap apply for the whole step
    scale = params.duplex_scale() if busy else 1.0
    h2d_rate = params.h2d_bytes_per_s * scale
    d2h_rate = params.d2h_bytes_per_s * scale
    cpu_rate = params.cpu_adam_params_per_s / params.ranks_per_host * (params.cpu_contention if busy else 1.0)
    state, grad = params.state_bytes_per_param, params.grad_bytes_per_param
    upload_bytes = params.host_upload_bytes_per_param

    # Host lane: CPU Adam back to back in host order; each upload waits for its CPU Adam and for the H2D link.
    prefetch: list[tuple[float, float]] = []
    adam: list[tuple[float, float]] = []
    flush: list[tuple[float, float]] = []
    upload: list[tuple[float, float]] = []
    adam_host: list[tuple[float, float]] = []
    clock = 0.0
    for g in host:
        adam_host.append((clock, clock + sizes[g] / cpu_rate))
        clock = adam_host[-1][1]

    n_host, n_dev = len(host), len(order)
    ahead = early_prefetches(buffers, n_dev)
    # H2D link: prefetches and uploads, one at a time, first ready first served; from -lead for the early prefetches
    link_free = -params.dispatch_lead_s if ahead else 0.0
    adam_free = flush_free = 0.0  # the phase issues the Adams and flushes: none starts before 0
    for k in range(n_dev + 1):
        # a prefetch is ready once the flush of the subgroup that used its buffer slot has ended
        if k >= n_dev:
            ready = math.inf
        elif k < ahead:
            ready = -params.dispatch_lead_s  # issued at dispatch
        else:
            ready = flush[k - buffers][1] if k >= buffers else 0.0
        # uploads ready before this prefetch go first (a tie goes to the prefetch: it gates the GPU)
        while len(upload) < n_host and (done := adam_host[len(upload)][1]) < ready:
            start = link_free if link_free > done else done
            link_free = start + sizes[host[len(upload)]] * upload_bytes / h2d_rate
            upload.append((start, link_free))
        if k == n_dev:
            break
        g = order[k]
        size = sizes[g]
        start = link_free if link_free > ready else ready
        link_free = start + size * (state + (0 if g in grads_on_device else grad)) / h2d_rate
        prefetch.append((start, link_free))
        start = link_free if link_free > adam_free else adam_free
        adam_free = start + params.launch_overhead_s + size / params.gpu_adam_params_per_s
        adam.append((start, adam_free))
        start = adam_free if adam_free > flush_free else flush_free
        flush_free = start + size * state / d2h_rate
        flush.append((start, flush_free))
    return _Timeline(host, adam_host, upload, prefetch, adam, flush)


def predicted_makespan_s(
    plan: Plan, sizes: Sequence[int], params: CostParams, grads_on_device: frozenset[int] = frozenset()
) -> float:
    """Only the makespan of :func:`predict`, without building the events (for searches over many plans)."""
    sizes = _check_sizes(sizes)
    _check_length(plan, sizes)
    return _timeline(plan, sizes, params, _check_grads(grads_on_device, len(sizes))).makespan_s()


def predict(
    plan: Plan,
    sizes: Sequence[int],
    params: CostParams,
    grads_on_device: frozenset[int] = frozenset(),
) -> Prediction:
    """Predict one optimizer step of ``plan`` over subgroups of ``sizes`` parameters.

    ``grads_on_device`` lists subgroups whose grad is already on the GPU, so the device lane does not
    prefetch it; for host-lane subgroups it is ignored (CPU Adam needs the grad on the host anyway).
    """
    sizes = _check_sizes(sizes)
    _check_length(plan, sizes)
    grads_on_device = _check_grads(grads_on_device, len(sizes))
    t = _timeline(plan, sizes, params, grads_on_device)

    events: dict[int, SubgroupEvent] = {}
    for g, (a0, a1), (u0, u1) in zip(t.host, t.adam_host, t.upload):
        events[g] = SubgroupEvent(g, Lane.HOST, a0, max(a1, u1), a0, a1, u0, u1)
    for g, (p0, p1), (a0, a1), (f0, f1) in zip(plan.device_order, t.prefetch, t.adam, t.flush):
        events[g] = SubgroupEvent(g, Lane.DEVICE, p0, f1, a0, a1, p0, p1, f0, f1)
    prefetch_bytes = sum(
        sizes[g] * (params.state_bytes_per_param + (0 if g in grads_on_device else params.grad_bytes_per_param))
        for g in plan.device_order
    )
    upload_bytes = sum(sizes[g] for g in t.host) * params.host_upload_bytes_per_param

    def busy(spans: list[tuple[float, float]]) -> float:
        return sum(end - start for start, end in spans)

    return Prediction(
        makespan_s=t.makespan_s(),
        host_lane_s=t.host_lane_s(),
        device_lane_s=t.device_lane_s(),
        events=tuple(events[g] for g in range(len(sizes))),
        bytes_h2d=prefetch_bytes + upload_bytes,
        bytes_d2h=sum(sizes[g] for g in plan.device_order) * params.state_bytes_per_param,
        host_busy_s=busy(t.adam_host),
        h2d_busy_s=busy(t.prefetch) + busy(t.upload),
        d2h_busy_s=busy(t.flush),
        adam_busy_s=busy(t.adam),
    )


def device_memory_bytes(
    plan: Plan,
    sizes: Sequence[int],
    params: CostParams | frozenset[int] | set[int] | None = None,
    grads_on_device: frozenset[int] = frozenset(),
) -> int:
    """GPU memory the device lane needs, bytes.

    ``buffers * min(max device-subgroup size, slot_params) * (state + grad bytes per param)`` for the buffer slots
    (each holds a piece of a subgroup; counted with a gradient row, which a lane whose gradients all stayed on the
    device does without: a quarter more than it takes then), plus
    ``device_grad_bytes_per_param`` for every parameter of a device-lane subgroup whose grad stays on the GPU
    (host-lane subgroups in ``grads_on_device`` are ignored: their grad goes to the host). 0 without device
    subgroups. ``params`` defaults to :class:`CostParams`; a set of ids passed in its place is taken as
    ``grads_on_device``, so both ``(plan, sizes, params)`` and ``(plan, sizes, grads_on_device)`` read right.
    """
    if isinstance(params, (set, frozenset)):
        params, grads_on_device = None, frozenset(params)
    params = params or CostParams()
    sizes = _check_sizes(sizes)
    _check_length(plan, sizes)
    grads_on_device = _check_grads(grads_on_device, len(sizes))
    device = plan.device_subgroups()
    if not device:
        return 0
    piece = min(max(sizes[g] for g in device), params.slot_params)
    slot = piece * (params.state_bytes_per_param + params.slot_grad_bytes_per_param)
    kept = sum(sizes[g] for g in device if g in grads_on_device) * params.device_grad_bytes_per_param
    return plan.buffers * slot + kept
