"""Owns the execution of one update phase for a given plan: the host lane and the device lane.

Host lane, per subgroup: unscale/clip + DeepSpeed's CPU Adam (supplied by the seam as ``host_step``, the
very code vanilla ZeRO-3 runs), then the new master weights are converted to the params' 16-bit dtype in
a pinned staging buffer and uploaded asynchronously.

Device lane, per subgroup, through a ring of buffer slots on the device:
``prefetch`` (host->device: master, exp_avg, exp_avg_sq, grad) -> ``adam`` (unscale + fused AdamW on the
device, then write the 16-bit params) -> ``flush`` (device->host: master, exp_avg, exp_avg_sq).
Each stage has its own stream; every cross-stream dependency is an event: prefetch waits for the flush
that last used its slot, adam waits for its prefetch, flush waits for its adam, and the caller's stream
waits for the last param write. ``run`` returns only when the host state is consistent.

On a machine without an accelerator the device lane runs with the host standing in for the device: the
same buffers, copies, ordering and write-back, with streams and events that complete immediately. The
device lane is issued first (it is asynchronous on a GPU), then the host lane runs on the calling thread
while the copies and kernels proceed; DeepSpeed's CPU Adam releases the GIL and uses all cores itself.
No DeepSpeed import here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_dos.planning.plan import Lane
from lightning_dos.subgroup import Subgroup

HOST_STAGING_SLOTS = 3  # 16-bit upload buffers, so the host lane rarely waits for an upload to leave
#: Prefetches and flushes are issued in chunks of this many fp32 elements (64 MB): the copy engine serves
#: streams between commands, so chunking lets the host lane's uploads interleave with a long prefetch queue.
COPY_CHUNK = 16 * 1024 * 1024

#: One recorded stage: (subgroup, lane, stage, begin event, end event).
Span = tuple[int, str, str, Any, Any]


@dataclass
class LaneTimings:
    """What one update phase took, per lane, and how many bytes crossed the host-device link."""

    total_s: float = 0.0
    host_busy_s: float = 0.0
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
    events: list[dict[str, Any]] = field(default_factory=list)  # per-subgroup stage spans (s since start)


class _HostEvent:
    """Stand-in for a device event when the host is the device: work is done when it is issued."""

    def record(self, stream: Any = None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, other: _HostEvent) -> float:
        return (other.time - self.time) * 1e3


class _Streams:
    """The executor's streams on an accelerator, or inert stand-ins on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.prefetch = torch.cuda.Stream(device)
            self.adam = torch.cuda.Stream(device)
            self.flush = torch.cuda.Stream(device)
            self.upload = torch.cuda.Stream(device)
        else:
            self.prefetch = self.adam = self.flush = self.upload = None

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if self.is_cuda else contextlib.nullcontext()

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing) if self.is_cuda else _HostEvent()

    def record(self, stream: Any, timing: bool = False) -> Any:
        event = self.event(timing)
        if self.is_cuda:
            event.record(stream)
        else:
            event.record()
        return event

    def wait(self, stream: Any, event: Any) -> None:
        if self.is_cuda and event is not None:
            stream.wait_event(event)

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.is_cuda else None


class UpdateExecutor:
    """Runs update phases on one device; keeps the pinned staging buffers between steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.streams = _Streams(self.device)
        self._staging: list[torch.Tensor] = []

    def _staging_buffers(self, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        if not self._staging or self._staging[0].numel() < numel or self._staging[0].dtype != dtype:
            pin = self.streams.is_cuda
            self._staging = [torch.empty(numel, dtype=dtype, pin_memory=pin) for _ in range(HOST_STAGING_SLOTS)]
        return self._staging

    @torch.no_grad()
    def run(
        self,
        lanes: Sequence[Lane],
        order: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        host_step: Callable[[int], None],
    ) -> LaneTimings:
        """Update every subgroup once: ``lanes[i]`` says where; ``order`` is the device lane's order."""
        if len(lanes) != len(subgroups):
            raise ValueError(f"plan has {len(lanes)} lanes but the optimizer has {len(subgroups)} subgroups")
        t0 = time.perf_counter()
        timings = LaneTimings()
        device_ids = [i for i in order if lanes[i] == Lane.DEVICE]
        missing = {i for i, lane in enumerate(lanes) if lane == Lane.DEVICE} - set(device_ids)
        device_ids += sorted(missing)
        host_ids = [i for i, lane in enumerate(lanes) if lane == Lane.HOST]

        s = self.streams
        start = s.record(s.current(), timing=True)
        for stream in (s.prefetch, s.adam, s.flush, s.upload):
            s.wait(stream, start)

        spans: list[Span] = []
        device_done = self._issue_device_lane(device_ids, buffers, subgroups, inv_scale, timings, spans)
        host_done = self._run_host_lane(host_ids, subgroups, host_step, timings, spans)

        # the caller's stream (next forward's all-gather) must see every param write
        for event in (*device_done, *host_done):
            s.wait(s.current(), event)
            event.synchronize()
        timings.total_s = time.perf_counter() - t0
        _resolve_spans(start, t0, spans, timings)
        return timings

    # ------------------------------------------------------------------ device lane
    def _issue_device_lane(
        self,
        ids: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        timings: LaneTimings,
        spans: list[Span],
    ) -> list[Any]:
        if not ids:
            return []
        s = self.streams
        numel = max(subgroups[i].numel for i in ids)
        n_slots = max(1, min(buffers, len(ids)))
        slots = [torch.empty((4, numel), dtype=torch.float32, device=self.device) for _ in range(n_slots)]
        timings.device_buffer_bytes = sum(t.numel() * t.element_size() for t in slots)
        unit_scale = float(inv_scale) == 1.0  # x * 1.0 == x: no unscale kernel needed
        if torch.is_tensor(inv_scale):
            inv = inv_scale.to(device=self.device, dtype=torch.float32)
        else:
            inv = torch.tensor(inv_scale, dtype=torch.float32, device=self.device)
        step_count = torch.empty(len(ids), dtype=torch.float32, device=self.device)
        step_host = torch.tensor([float(subgroups[i].state["step"] + 1) for i in ids], dtype=torch.float32)
        step_count.copy_(step_host)
        ready = s.record(s.current())

        flushed: list[Any] = [None] * n_slots
        last_flush = None
        for k, i in enumerate(ids):
            sg = subgroups[i]
            n = sg.numel
            slot = slots[k % n_slots]
            master, exp_avg, exp_avg_sq, grad = (slot[j, :n] for j in range(4))
            with s.use(s.prefetch):
                s.wait(s.prefetch, flushed[k % n_slots])  # slot free only once its last flush is done
                s.wait(s.prefetch, ready)
                begin = s.record(s.prefetch, timing=True)
                _chunked_copy(master, sg.master)
                _chunked_copy(exp_avg, sg.exp_avg)
                _chunked_copy(exp_avg_sq, sg.exp_avg_sq)
                if sg.grad_on_device:
                    grad = sg.grad  # kept on the device through backward: nothing to prefetch
                else:
                    _chunked_copy(grad, sg.grad)
                prefetched = s.record(s.prefetch, timing=True)
                spans.append((i, "device", "prefetch", begin, prefetched))
            with s.use(s.adam):
                s.wait(s.adam, prefetched)
                begin = s.record(s.adam, timing=True)
                if not unit_scale:
                    grad.mul_(inv)  # same unscale/clip factor as the host lane, in fp32
                _adam(sg, master, grad, exp_avg, exp_avg_sq, step_count[k])
                sg.param16.copy_(master)  # 16-bit params in their own dtype, on the device
                adam_done = s.record(s.adam, timing=True)
                spans.append((i, "device", "adam", begin, adam_done))
            with s.use(s.flush):
                s.wait(s.flush, adam_done)
                begin = s.record(s.flush, timing=True)
                _chunked_copy(sg.master, master)
                _chunked_copy(sg.exp_avg, exp_avg)
                _chunked_copy(sg.exp_avg_sq, exp_avg_sq)
                last_flush = s.record(s.flush, timing=True)
                spans.append((i, "device", "flush", begin, last_flush))
                flushed[k % n_slots] = last_flush
            sg.state["step"] += 1
            timings.device_params += n
            timings.device_subgroups += 1
            timings.h2d_bytes += (12 if sg.grad_on_device else 16) * n
            timings.d2h_bytes += 12 * n
        return [adam_done, last_flush]

    # ------------------------------------------------------------------ host lane
    def _run_host_lane(
        self,
        ids: Sequence[int],
        subgroups: Sequence[Subgroup],
        host_step: Callable[[int], None],
        timings: LaneTimings,
        spans: list[Span],
    ) -> list[Any]:
        if not ids:
            return []
        s = self.streams
        numel = max(subgroups[i].numel for i in ids)
        staging = self._staging_buffers(numel, subgroups[ids[0]].param16.dtype)
        uploaded: list[Any] = [None] * len(staging)
        t0 = time.perf_counter()
        for k, i in enumerate(ids):
            sg = subgroups[i]
            begin = _HostEvent()
            begin.record()
            host_step(i)
            adam_done = _HostEvent()
            adam_done.record()
            spans.append((i, "host", "adam", begin, adam_done))
            slot = k % len(staging)
            if uploaded[slot] is not None:
                uploaded[slot].synchronize()  # the host may overwrite a staging buffer only once it is sent
            buf = staging[slot][: sg.numel]
            buf.copy_(sg.master)  # fp32 -> param dtype on the host: half the bytes cross the link
            with s.use(s.upload):
                up_begin = s.record(s.upload, timing=True)
                sg.param16.copy_(buf, non_blocking=True)
                uploaded[slot] = s.record(s.upload, timing=True)
            spans.append((i, "host", "upload", up_begin, uploaded[slot]))
            timings.host_params += sg.numel
            timings.upload_bytes += sg.numel * buf.element_size()
        timings.host_busy_s = time.perf_counter() - t0
        return [e for e in uploaded if e is not None]


def _chunked_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src, non_blocking=True)`` in ``COPY_CHUNK``-element pieces (see ``COPY_CHUNK``)."""
    n = src.numel()
    if n <= COPY_CHUNK:
        dst.copy_(src, non_blocking=True)
        return
    for start in range(0, n, COPY_CHUNK):
        length = min(COPY_CHUNK, n - start)
        dst.narrow(0, start, length).copy_(src.narrow(0, start, length), non_blocking=True)


def _resolve_spans(
    start: Any, host_origin: float, spans: list[Span], timings: LaneTimings
) -> None:
    """Turn recorded events into per-stage spans (seconds since the phase began) and busy times."""
    by_key: dict[tuple[int, str], dict[str, Any]] = {}
    busy = {"prefetch": 0.0, "adam": 0.0, "flush": 0.0, "upload": 0.0}
    device_end = 0.0
    for subgroup, lane, stage, begin, end in spans:
        if isinstance(begin, _HostEvent) and isinstance(end, _HostEvent):
            b, e = begin.time - host_origin, end.time - host_origin  # host clock (the host lane on a GPU too)
        elif isinstance(begin, _HostEvent):
            b, e = begin.time - host_origin, start.elapsed_time(end) / 1e3
        else:
            b, e = start.elapsed_time(begin) / 1e3, start.elapsed_time(end) / 1e3
        entry = by_key.setdefault((subgroup, lane), {"subgroup": subgroup, "lane": lane})
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


def _adam(
    sg: Subgroup,
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
) -> None:
    """Fused Adam(W) on the device lane, with the param group's current hyperparameters."""
    h = sg.hyper
    kernel = torch._fused_adamw_ if h.adamw else torch._fused_adam_
    kernel(
        [master],
        [grad],
        [exp_avg],
        [exp_avg_sq],
        [],
        [step],
        lr=h.lr,
        beta1=h.beta1,
        beta2=h.beta2,
        weight_decay=h.weight_decay,
        eps=h.eps,
        amsgrad=False,
        maximize=False,
    )

