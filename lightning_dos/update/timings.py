"""Owns what one update phase measured: :class:`LaneTimings`, and the accounting that turns recorded events into it.

Each lane records a begin and an end event around every stage it issues (a :data:`Span`): CPU Adam and the upload of
a host-lane subgroup; prefetch, Adam and flush of each piece of a device-lane subgroup. Once the phase's events are
complete, :func:`resolve_spans` turns them into per-subgroup stage spans in seconds since the phase began and into the
busy time of each stage; the lanes count parameters and bytes as they issue. No DeepSpeed import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning_dos.update.streams import HostEvent

#: One recorded stage: (subgroup, lane, stage, begin event, end event).
Span = tuple[int, str, str, Any, Any]


@dataclass
class LaneTimings:
    """What one update phase took, per lane, and how many bytes crossed the host-device link."""

    total_s: float = 0.0
    host_busy_s: float = 0.0
    """Wall time of the host lane, from its first CPU Adam to its last upload issued (feeding the device lane
    between its subgroups included)."""
    host_compute_s: float = 0.0
    """Time the host lane spent in CPU Adam (what is left of ``host_busy_s`` is issuing work to the device)."""
    device_busy_s: float = 0.0
    prefetch_busy_s: float = 0.0
    adam_busy_s: float = 0.0
    flush_busy_s: float = 0.0
    upload_busy_s: float = 0.0
    device_subgroups: int = 0
    host_params: int = 0
    device_params: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    upload_bytes: int = 0
    device_buffer_bytes: int = 0
    """Device memory the executor held: the device lane's buffer slots plus the upload ring (once allocated)."""
    resident_params: int = 0
    """Parameters of the resident subgroups updated on the device, in neither lane (``resident_gib``)."""
    prefetched_ahead: int = 0
    """Device-lane prefetches issued before the update phase began (``UpdateExecutor.prefetch_ahead``)."""
    lead_s: float = 0.0
    """Host time from the issue of those prefetches (the dispatch) to the start of the update phase (0 without)."""
    started_s: float = 0.0
    """``time.perf_counter()`` when the update phase began: places its spans (relative to it) on another timeline."""
    events: list[dict[str, Any]] = field(default_factory=list)  # per-subgroup stage spans (s since start)


def resolve_spans(start: Any, host_origin: float, spans: list[Span], timings: LaneTimings, origin: Any = None) -> None:
    """Turn recorded events into per-stage spans (seconds since the phase began) and busy times.

    ``origin``: a timing event recorded before every span (the device lane's, when its first prefetches were issued
    before the phase); device times are then measured from it, forward only, and shifted to ``start``.
    """
    if origin is None or isinstance(origin, HostEvent):
        def since_start(event: Any) -> float:
            return start.elapsed_time(event) / 1e3
    else:
        shift = origin.elapsed_time(start)

        def since_start(event: Any) -> float:
            return (origin.elapsed_time(event) - shift) / 1e3

    by_key: dict[tuple[int, str], dict[str, Any]] = {}
    busy = {"prefetch": 0.0, "adam": 0.0, "flush": 0.0, "upload": 0.0}
    device_end = 0.0
    for subgroup, lane, stage, begin, end in spans:
        if isinstance(begin, HostEvent) and isinstance(end, HostEvent):
            b, e = begin.time - host_origin, end.time - host_origin  # host clock (the host lane on a GPU too)
        elif isinstance(begin, HostEvent):
            b, e = begin.time - host_origin, since_start(end)
        else:
            b, e = since_start(begin), since_start(end)
        entry = by_key.setdefault((subgroup, lane), {"subgroup": subgroup, "lane": lane})
        if stage in entry:  # another piece of a device-lane subgroup: the stage spans all of its pieces
            b0, e0 = entry[stage]
            entry[stage] = (min(b0, b), max(e0, e))
        else:
            entry[stage] = (b, e)
        if lane == "device" or stage == "upload":
            busy[stage] += e - b
        if lane == "device":
            device_end = max(device_end, e)
    timings.prefetch_busy_s = busy["prefetch"]
    timings.adam_busy_s = busy["adam"]
    timings.flush_busy_s = busy["flush"]
    timings.upload_busy_s = busy["upload"]
    timings.device_busy_s = device_end
    timings.events = sorted(by_key.values(), key=lambda d: (d["lane"], d["subgroup"]))

