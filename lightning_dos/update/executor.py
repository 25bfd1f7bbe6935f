"""Owns the execution of one update phase for a given plan: the host lane and the device lane.

Host lane, per subgroup: DeepSpeed's CPU Adam with vanilla's unscale/clip factor applied as it reads the gradient
(supplied by the seam as ``host_step``; the same values as vanilla's two passes, bit for bit), then the new fp32
master weights are uploaded asynchronously, straight from their pinned home, through a small ring of fp32 buffers on
the device, where a kernel writes them into the 16-bit params (``upload``). The host itself neither converts nor
waits: the 16-bit conversion is a memory-bound pass that cost the host lane about a quarter of its time (read off a
GPU host's timeline) and is a short kernel on the device; it doubles the upload's bytes on the link (4 instead of 2
per parameter), which the performance model weighs.

Device lane, per subgroup, in pieces of at most ``PIECE`` parameters through a ring of buffer slots on the device
(each slot holds one piece): ``prefetch`` (host->device: master, exp_avg, exp_avg_sq, grad) -> ``adam`` (unscale +
fused AdamW on the device, then write the 16-bit params) -> ``flush`` (device->host: master, exp_avg, exp_avg_sq).
A gradient kept on the device through backward is not prefetched; kept in its 16-bit dtype, ``adam`` widens it
(exactly) into the slot's gradient row, or, when every gradient of the lane stayed on the device, chunk by chunk
through one 64 MB scratch buffer and the slot has no gradient row (a quarter less memory;
:mod:`lightning_dos.update.device_adam`). The performance model's ``device_memory_bytes`` still counts slots of a whole
subgroup with the row: under a memory budget it may demote early, never late.
Each stage has its own stream (``h2d`` for prefetches and uploads, ``adam``, ``flush``, and a high-priority
``convert`` for the uploads' 16-bit writes); every cross-stream dependency is an event: a piece's prefetch waits for
the flush that last used its slot, adam waits for its prefetch, flush waits for its adam, an upload chunk waits for
the conversion that last used its ring buffer, and the caller's stream waits for the last param write. ``run``
returns only when the host state is consistent.

The host lane runs on the calling thread (DeepSpeed's CPU Adam uses all cores itself); its uploads go on the
same ``h2d`` stream as the prefetches, so the link serves both in the order they were issued (on separate
streams a copy engine was seen to serve the uploads only when the prefetch stream paused). The device lane is
asynchronous on a GPU and is issued from the same thread a few subgroups ahead, between host-lane subgroups,
so that an upload never queues behind more than that many prefetches.

The first prefetches of the device lane may be issued before the update phase (``prefetch_ahead``, called when the
manager dispatches the step's plan): they read only the optimizer state, which nothing changes between the end of
backward and the update phase, and the link is otherwise idle while DeepSpeed checks for overflow and computes the
gradient norm. ``run`` uses them if the plan and every tensor they read are still the same, and waits for them and
starts afresh otherwise.

On a machine without an accelerator the device lane runs with the host standing in for the device: the
same buffers, copies, ordering and write-back, with streams and events that complete immediately. ``issue``
(``overlap=True``) runs the same two lanes on one persistent worker thread instead and returns at once with a
:class:`~lightning_dos.update.phase.Phase`: the next forward and backward run meanwhile, each reader waiting at the
phase's per-subgroup gates, and ``Phase.join`` returns the timings once everything has landed. The caller's stream then
never waits for the update as a whole (the readers' gates order each read after its own subgroup's write).

No DeepSpeed import here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lightning_dos.planning.perf_model import PREFETCH_WINDOW, buffer_slots, early_prefetches
from lightning_dos.planning.plan import Lane
from lightning_dos.update.device_adam import adam, adam_widened, scratch_for
from lightning_dos.update.phase import Phase
from lightning_dos.update.resident import ResidentState
from lightning_dos.update.subgroup import Subgroup

#: Prefetches and flushes are issued in chunks of this many fp32 elements (64 MB), so no single copy command
#: holds a copy engine for long.
COPY_CHUNK = 16 * 1024 * 1024
# PREFETCH_WINDOW: the device lane is issued while fewer than this many of its prefetches are outstanding (see
# ``_DeviceLane``): enough to keep the link busy, few enough that a host-lane upload never queues behind the whole
# lane. The performance model owns the constant, since it predicts the prefetches issued at dispatch from it.
#: Parameters per piece of a device-lane subgroup: the buffer slots hold a piece, not a whole subgroup (see
#: ``_DeviceLane``). Two copy chunks, a multiple of every vector width; a piece's state is 384 MB in fp32.
PIECE = 2 * COPY_CHUNK
#: fp32 buffers (of ``COPY_CHUNK`` elements each) on the device through which host-lane uploads pass on their way
#: into the 16-bit params. Allocated once (the manager reserves them at start-up) and kept: 3 x 64 MB on a real run.
UPLOAD_BUFFERS = 3

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


@dataclass
class _Begun:
    """An update phase between ``UpdateExecutor._begin`` and ``_end``."""

    t0: float
    timings: LaneTimings
    spans: list[Span]
    start: Any
    device_lane: _DeviceLane
    host_ids: list[int]


class _HostEvent:
    """Stand-in for a device event when the host is the device: work is done when it is issued."""

    def record(self, stream: Any = None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _HostEvent) -> float:
        return (other.time - self.time) * 1e3


class _Streams:
    """The executor's streams on an accelerator, or inert stand-ins on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.h2d = torch.cuda.Stream(device)  # prefetches and host-lane uploads, in issue order
            self.adam = torch.cuda.Stream(device)
            self.flush = torch.cuda.Stream(device)
            # uploads' 16-bit writes: short kernels that free a ring buffer for the link; first call on the SMs
            _, high = torch.cuda.Stream.priority_range()
            self.convert = torch.cuda.Stream(device, priority=high)
        else:
            self.h2d = self.adam = self.flush = self.convert = None

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
    """Runs update phases on one device; keeps the host lane's upload buffers between steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.streams = _Streams(self.device)
        self._upload: list[torch.Tensor] = []
        self._ahead: _DeviceLane | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: the subgroups whose state stays on the device (``resident_gib``): in neither lane, updated first
        self.resident: ResidentState | None = None

    @torch.no_grad()
    def prefetch_ahead(
        self, lanes: Sequence[Lane], order: Sequence[int], buffers: int, subgroups: Sequence[Subgroup]
    ) -> int:
        """Issue the device lane's first prefetches now, for the next ``run`` of this plan; returns how many (pieces).

        At most one per buffer slot and ``PREFETCH_WINDOW`` in all. Any earlier early prefetches are waited for and
        dropped first.
        """
        self.discard_ahead()
        ids = _device_ids(lanes, order, self._resident_ids())
        if not ids:
            return 0
        lane = _DeviceLane(self.streams, ids, buffers, subgroups)
        lane.prefetch_ahead()
        self._ahead = lane
        return len(lane.piece_prefetched)

    def discard_ahead(self) -> None:
        """Wait for and drop early prefetches that no update phase will use (their slots are released)."""
        lane, self._ahead = self._ahead, None
        if lane is not None:
            lane.settle()

    def reserve_upload_buffers(self, numel: int) -> None:
        """Allocate the upload ring for subgroups of up to ``numel`` parameters now, before any update phase.

        The manager calls it at start-up, so the free device memory read at each dispatch already excludes it.
        """
        self._upload_buffers(numel)

    def _upload_buffers(self, numel: int) -> list[torch.Tensor]:
        """The ring of fp32 device buffers for uploads: ``UPLOAD_BUFFERS`` of up to ``COPY_CHUNK`` elements."""
        numel = min(numel, COPY_CHUNK)
        if len(self._upload) != UPLOAD_BUFFERS or self._upload[0].numel() < numel:
            self._upload = []  # release the old ring before the new one is allocated
            self._upload = [torch.empty(numel, dtype=torch.float32, device=self.device) for _ in range(UPLOAD_BUFFERS)]
        return self._upload

    @torch.no_grad()
    def run(
        self,
        lanes: Sequence[Lane],
        order: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        host_step: Callable[[int], None],
        host_order: Sequence[int] = (),
    ) -> LaneTimings:
        """Update every subgroup once: ``lanes[i]`` says where; ``order`` is the device lane's order and
        ``host_order`` the host lane's (each: then any subgroup of that lane it left out, ascending)."""
        begun = self._begin(lanes, order, buffers, subgroups, inv_scale, host_order)
        resident_done = self._run_resident(subgroups, inv_scale, begun.timings)
        host_done = self._run_host_lane(begun.host_ids, subgroups, host_step, begun.timings, begun.spans,
                                        begun.device_lane)
        device_done = begun.device_lane.issue_all()

        # the caller's stream (next forward's all-gather) must see every param write
        s = self.streams
        for event in (*resident_done, *device_done, *host_done):
            s.wait(s.current(), event)
            event.synchronize()
        begun.timings.total_s = time.perf_counter() - begun.t0
        return self._end(begun)

    @torch.no_grad()
    def issue(
        self,
        lanes: Sequence[Lane],
        order: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        host_step: Callable[[int], None],
        host_order: Sequence[int] = (),
    ) -> Phase:
        """``run``'s update, issued to the worker thread: returns at once with the phase in flight (see
        :mod:`lightning_dos.update.phase`); ``Phase.join`` gives its timings. ``host_step`` then runs on the worker and
        must read nothing the training loop may change meanwhile (hyperparameters are read when it is made)."""
        begun = self._begin(lanes, order, buffers, subgroups, inv_scale, host_order)
        phase = Phase(len(subgroups), self.streams.wait)
        lane = begun.device_lane
        lane.signals = phase
        for k, prefetched in enumerate(lane.prefetched):  # issued before the phase began, on this thread
            phase.read_grad(lane.ids[k], prefetched)
        done: list[Any] = self._run_resident(subgroups, inv_scale, begun.timings, phase)  # issued here, at once
        # their gradients are read by work issued on the adam stream; the caller drops them before it has run, so
        # ``let_go`` ties them to that stream (``run`` waits for the stream instead)
        lane.let_go(self._resident_ids())

        def work() -> None:
            if self.streams.is_cuda:
                torch.cuda.set_device(self.device)
            with torch.no_grad():  # grad mode is per thread
                # the subgroups through the lane only, which lets them go at its release (the closure outlives it)
                done.extend(self._run_host_lane(begun.host_ids, lane.subgroups, host_step, begun.timings,
                                                begun.spans, lane, phase))
                done.extend(lane.issue_all())
            phase.worker_end = time.perf_counter()
            for event in done:  # then the lane's device memory goes back before the join, which may come late
                event.synchronize()
            lane.release()

        def finish() -> LaneTimings:
            for event in done:
                event.synchronize()
            timings = self._end(begun)
            ends = [end for entry in timings.events for stage, span in entry.items()
                    if stage not in ("subgroup", "lane") for end in span[1:]]
            timings.total_s = max([phase.worker_end - begun.t0, *ends])
            return timings

        phase.start(self._worker(), work, finish)
        return phase

    def _worker(self) -> ThreadPoolExecutor:
        """The one thread that runs issued update phases (started on first use, kept until ``close``)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dos-update")
        return self._pool

    def close(self) -> None:
        """Stop the worker thread (after the phase it runs, if any)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _begin(
        self,
        lanes: Sequence[Lane],
        order: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        host_order: Sequence[int],
    ) -> _Begun:
        """What an update phase does on the calling thread before its lanes run: the early prefetches taken or
        dropped, the start event, the device lane built and bound (its step counts and unscale factor copied)."""
        if len(lanes) != len(subgroups):
            raise ValueError(f"plan has {len(lanes)} lanes but the optimizer has {len(subgroups)} subgroups")
        t0 = time.perf_counter()
        timings = LaneTimings(started_s=t0)
        resident = self._resident_ids()
        device_ids = _device_ids(lanes, order, resident)
        host_ids = _lane_ids(lanes, host_order, Lane.HOST, resident)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead.serves(device_ids, buffers, subgroups):
            ahead.settle()  # another plan, or other tensors: its slots are released, its copies unused
            ahead = None

        s = self.streams
        spans: list[Span] = []
        device_lane = ahead or _DeviceLane(s, device_ids, buffers, subgroups)
        timings.prefetched_ahead = len(device_lane.piece_prefetched)
        if timings.prefetched_ahead:
            timings.lead_s = max(0.0, t0 - device_lane.issued_at)
        device_lane.bind(subgroups, inv_scale, timings, spans)
        # after bind: its unscale factor and step counts are written on the caller's stream, which the lanes wait for
        start = s.record(s.current(), timing=True)
        for stream in (s.h2d, s.adam, s.flush, s.convert):
            s.wait(stream, start)
        return _Begun(t0, timings, spans, start, device_lane, host_ids)

    def _end(self, begun: _Begun) -> LaneTimings:
        """Once every event of the phase is complete: the upload ring's bytes and the per-stage spans."""
        timings = begun.timings
        timings.device_buffer_bytes += sum(b.numel() * b.element_size() for b in self._upload)
        origin = begun.device_lane.origin if timings.prefetched_ahead else None
        _resolve_spans(begun.start, begun.t0, begun.spans, timings, origin=origin)
        return timings

    def _resident_ids(self) -> frozenset[int]:
        return frozenset(self.resident.ids) if self.resident is not None else frozenset()

    def _run_resident(self, subgroups: Sequence[Subgroup], inv_scale: torch.Tensor | float, timings: LaneTimings,
                      phase: Phase | None = None) -> list[Any]:
        """Issue the resident subgroups' updates on the ``adam`` stream, ahead of the device lane's first Adam (which
        waits for its prefetch anyway); the event after which their 16-bit params are written. With a ``phase``, its
        readers are told at once (the worker issues nothing for them)."""
        resident = self.resident
        if resident is None or not resident.ids:
            return []
        s = self.streams
        with s.use(s.adam):
            resident.step(subgroups, inv_scale)
            done = s.record(s.adam)
        for i in resident.ids:
            timings.resident_params += subgroups[i].numel
            if phase is not None:
                phase.read_grad(i, done)
                phase.wrote(i, done)
        return [done]

    # ------------------------------------------------------------------ host lane
    def _run_host_lane(
        self,
        ids: Sequence[int],
        subgroups: Sequence[Subgroup],
        host_step: Callable[[int], None],
        timings: LaneTimings,
        spans: list[Span],
        device_lane: _DeviceLane,
        phase: Phase | None = None,
    ) -> list[Any]:
        """Run the host lane on this thread; between its subgroups, feed the device lane (see ``_DeviceLane``).
        With a ``phase`` (``issue``), tell its readers as each subgroup's gradient is free and its params written."""
        if not ids:
            return []
        ring = _UploadRing(self.streams, self._upload_buffers(max(subgroups[i].numel for i in ids)))
        uploaded: Any = None
        t0 = time.perf_counter()
        for i in ids:
            sg = subgroups[i]
            device_lane.feed()
            begin = _HostEvent()
            begin.record()
            host_step(i)
            adam_done = _HostEvent()
            adam_done.record()
            if phase is not None:
                phase.read_grad(i)
            spans.append((i, "host", "adam", begin, adam_done))
            timings.host_compute_s += adam_done.time - begin.time
            up_begin, uploaded = ring.upload(sg.master, sg.param16)  # behind the prefetches already issued
            if phase is not None:
                phase.wrote(i, uploaded)
            spans.append((i, "host", "upload", up_begin, uploaded))
            timings.host_params += sg.numel
            timings.upload_bytes += sg.numel * sg.master.element_size()
        timings.host_busy_s = time.perf_counter() - t0
        return [uploaded]


class _UploadRing:
    """Host-lane uploads: fp32 master -> ring buffer on the device (``h2d``) -> 16-bit params (``convert``).

    Each chunk of up to ``COPY_CHUNK`` elements is copied into the next ring buffer once the conversion that last
    read that buffer is done (a device-side wait: the host thread never blocks), then converted into its slice of
    the params on the high-priority ``convert`` stream. The master is not written again before ``run`` returns, so
    the copy may read it asynchronously. On the host standing in for the device the same copies run in order.
    """

    def __init__(self, streams: _Streams, buffers: list[torch.Tensor]) -> None:
        self.s = streams
        self.buffers = buffers
        self.converted: list[Any] = [None] * len(buffers)
        self.next = 0

    def upload(self, master: torch.Tensor, param16: torch.Tensor) -> tuple[Any, Any]:
        """Issue the upload of ``master`` into ``param16``; its (begin on ``h2d``, end on ``convert``) events."""
        s = self.s
        chunk = self.buffers[0].numel()
        n = master.numel()
        begin = end = None
        for offset in range(0, n, chunk):
            length = min(chunk, n - offset)
            b = self.next % len(self.buffers)
            self.next += 1
            buf = self.buffers[b][:length]
            with s.use(s.h2d):
                s.wait(s.h2d, self.converted[b])  # the buffer is free once its last conversion has read it
                if begin is None:
                    begin = s.record(s.h2d, timing=True)
                buf.copy_(master.narrow(0, offset, length), non_blocking=True)
                copied = s.record(s.h2d)
            with s.use(s.convert):
                s.wait(s.convert, copied)
                param16.narrow(0, offset, length).copy_(buf)  # fp32 -> the params' dtype, on the device
                end = s.record(s.convert, timing=True)
            self.converted[b] = end
        return begin, end


class _DeviceLane:
    """The device lane of one update phase, issued a subgroup at a time.

    Per subgroup, in pieces of at most ``PIECE`` parameters through a ring of buffer slots on the device (each slot
    the size of one piece): ``prefetch`` (host->device: master, exp_avg, exp_avg_sq and the gradient unless it
    stayed on the device) -> ``adam`` (unscale, fused AdamW, 16-bit param write) -> ``flush`` (device->host: master,
    exp_avg, exp_avg_sq), each on its own stream and ordered by events. A piece's prefetch waits for the flush of
    the piece that last used its slot, so two slots already keep both directions of the link busy (a piece's Adam
    is short); slots of a piece rather than of a whole subgroup take a fraction of the memory (at gpt-2.7b, whose
    largest subgroup holds 128.8M parameters: 0.75 GiB instead of 2.9 for two without a gradient row) and the lane
    starts and drains a piece at a time.
    Adam is elementwise and ``PIECE`` a multiple of every vector width, so the pieces give the values of one call
    over the whole subgroup, bit for bit.

    Prefetches and the host lane's uploads share one stream, so a device lane issued all at once would put
    every upload behind every prefetch. Instead the host thread issues device-lane subgroups only while fewer
    than ``window`` subgroups' prefetches are still outstanding (``feed``), between host-lane subgroups;
    whatever remains is issued when the host lane is done
    (``issue_all``). An upload therefore waits for at most ``window`` subgroups' prefetches. On the host standing in
    for the device, work completes as it is issued, so the lane simply interleaves with the host lane.
    """

    def __init__(
        self,
        streams: _Streams,
        ids: Sequence[int],
        buffers: int,
        subgroups: Sequence[Subgroup],
    ) -> None:
        self.s = streams
        self.ids = list(ids)
        self.subgroups = subgroups
        self.spans: list[Span] = []
        self.next = 0  # position in ids of the next subgroup to issue
        # every piece of the lane in order, (position in ids, offset, length); at least one per subgroup
        self.pieces = [(k, offset, min(PIECE, subgroups[i].numel - offset))
                       for k, i in enumerate(self.ids) for offset in range(0, max(1, subgroups[i].numel), PIECE)]
        self.pieces_of: list[list[int]] = [[] for _ in self.ids]  # per subgroup: its pieces' indices
        for p, (k, _, _) in enumerate(self.pieces):
            self.pieces_of[k].append(p)
        self.piece_prefetched: list[Any] = []  # per prefetched piece: its prefetch's end event
        self.staged: list[tuple[Any, ...]] = []  # per prefetched piece: its slot's views (None: no gradient row)
        self.prefetched: list[Any] = []  # per subgroup whose pieces are all prefetched: the last one's end event
        self.sources: list[tuple[Any, ...]] = []  # per subgroup prefetched from: the tensors it read, the grad's place
        self.completed = 0  # subgroups of ``prefetched`` known to be complete (they complete in issue order)
        self.done: list[Any] = []
        self.issued_at = 0.0  # host clock when prefetch_ahead issued the early prefetches
        self.n_slots = buffer_slots(buffers, len(self.pieces))
        self.window = PREFETCH_WINDOW
        # early prefetches: pieces, one per slot (the performance model predicts with subgroups: a head start)
        self.early = early_prefetches(buffers, len(self.pieces))
        self.signals: Phase | None = None  # the phase in flight, when issued to the worker (``issue``)
        if not self.ids:
            return
        s = streams
        numel = max(length for _, _, length in self.pieces)
        self.rows = _slot_rows(self.ids, subgroups)
        self.slots = [torch.empty((self.rows, numel), dtype=torch.float32, device=s.device)
                      for _ in range(self.n_slots)]
        # without a gradient row, 16-bit gradients are widened chunk by chunk through one scratch buffer
        self.scratch = scratch_for(numel, s.device) if self.rows == 3 else None
        self.ready = s.record(s.current())
        self.origin = s.record(s.current(), timing=True)  # before any of this lane's prefetches (spans are timed)
        self.flushed: list[Any] = [None] * self.n_slots

    def bind(
        self,
        subgroups: Sequence[Subgroup],
        inv_scale: torch.Tensor | float,
        timings: LaneTimings,
        spans: list[Span],
    ) -> None:
        """Attach the update phase: its subgroups (current hyperparameters), unscale factor, step counts, records."""
        self.subgroups = list(subgroups)  # the lane's own list: ``let_go`` replaces entries in it
        self.timings = timings
        spans.extend(self.spans)  # early prefetches, if any, belong to this phase
        self.spans = spans
        if not self.ids:
            return
        device = self.s.device
        timings.device_buffer_bytes += sum(t.numel() * t.element_size() for t in self.slots)
        if self.scratch is not None:
            timings.device_buffer_bytes += self.scratch.numel() * self.scratch.element_size()
        self.unit_scale = float(inv_scale) == 1.0  # x * 1.0 == x: no unscale kernel needed
        if torch.is_tensor(inv_scale):
            self.inv = inv_scale.to(device=device, dtype=torch.float32)
        else:
            self.inv = torch.tensor(inv_scale, dtype=torch.float32, device=device)
        self.step_count = torch.empty(len(self.ids), dtype=torch.float32, device=device)
        step_host = torch.tensor([float(subgroups[i].state["step"] + 1) for i in self.ids], dtype=torch.float32)
        self.step_count.copy_(step_host)

    def prefetch_ahead(self) -> None:
        """Issue the first pieces' prefetches before the update phase: one per slot, ``window`` at most."""
        self.issued_at = time.perf_counter()
        while len(self.piece_prefetched) < self.early:
            self._prefetch(len(self.piece_prefetched))

    def serves(self, ids: Sequence[int], buffers: int, subgroups: Sequence[Subgroup]) -> bool:
        """Whether this lane's early prefetches hold what an update phase of ``ids`` with ``subgroups`` reads:
        the same device lane, pieces and slots, and for every subgroup prefetched from the same tensors and
        gradient place."""
        if self.ids != list(ids) or any(subgroups[i].numel != self.subgroups[i].numel for i in self.ids):
            return False
        if self.n_slots != buffer_slots(buffers, len(self.pieces)):
            return False
        if self.ids and self.rows != _slot_rows(self.ids, subgroups):
            return False
        return all(_same(_sources(subgroups[i]), read) for i, read in zip(self.ids, self.sources))

    def settle(self) -> None:
        """Wait for the issued prefetches (before slots that a copy may still write are released)."""
        for event in self.piece_prefetched:
            event.synchronize()

    def release(self) -> None:
        """Drop the lane's device memory once its work is complete: the buffer slots and the subgroups (with the
        gradients they kept on the device). With overlap the manager joins a phase only at the next dispatch, after
        the next forward and backward; the phase ends during that forward, and without this the backward ran with
        the slots and both steps' kept gradients allocated at once."""
        self.slots = []
        self.staged = []
        self.scratch = None
        self.subgroups = ()

    def let_go(self, ids: Sequence[int]) -> None:
        """Drop the lane's hold on the device-kept gradients of subgroups ``ids``, whose last read is issued.

        With overlap the next forward and backward run while the phase does: a gradient kept through backward then
        goes back to the allocator as soon as its subgroup's Adam is issued, not when the whole phase is done (the
        next backward allocates its own). On an accelerator the allocator is told that the ``adam`` stream reads it
        (``record_stream``), so the memory is reused only after that read."""
        for i in ids:
            sg = self.subgroups[i]
            if not sg.grad_on_device or sg.grad is None:
                continue
            if self.s.is_cuda and sg.grad.is_cuda:
                sg.grad.record_stream(self.s.adam)
            self.subgroups[i] = replace(sg, grad=None)

    @property
    def remaining(self) -> int:
        return len(self.ids) - self.next

    def outstanding(self) -> int:
        """Subgroups whose prefetches were issued and are not yet complete (queried without blocking)."""
        while self.completed < len(self.prefetched) and self.prefetched[self.completed].query():
            self.completed += 1
        return len(self.prefetched) - self.completed

    def feed(self) -> None:
        """Issue the subgroups already prefetched, then more while fewer than ``window`` prefetches are outstanding."""
        while self.next < len(self.prefetched):  # early prefetches: their Adam and flush add nothing to the link
            self.issue_next()
        while self.remaining and self.outstanding() < self.window:
            self.issue_next()

    def issue_all(self) -> list[Any]:
        """Issue whatever is left; the events after which the lane's writes are complete."""
        while self.remaining:
            self.issue_next()
        return self.done

    def _prefetch(self, p: int) -> None:
        """Issue the prefetch of the ``p``-th piece of the lane into its slot (``h2d``)."""
        s = self.s
        k, offset, n = self.pieces[p]
        i = self.ids[k]
        sg = self.subgroups[i]
        slot = self.slots[p % self.n_slots]
        views = tuple(slot[j, :n] if j < self.rows else None for j in range(4))
        master, exp_avg, exp_avg_sq, grad = views
        with s.use(s.h2d):
            s.wait(s.h2d, self.flushed[p % self.n_slots])  # slot free only once its last flush is done
            s.wait(s.h2d, self.ready)
            begin = s.record(s.h2d, timing=True)
            _chunked_copy(master, _piece(sg.master, offset, n))
            _chunked_copy(exp_avg, _piece(sg.exp_avg, offset, n))
            _chunked_copy(exp_avg_sq, _piece(sg.exp_avg_sq, offset, n))
            if not sg.grad_on_device:  # a gradient kept on the device through backward needs no prefetch
                _chunked_copy(grad, _piece(sg.grad, offset, n))
            prefetched = s.record(s.h2d, timing=True)
        self.spans.append((i, "device", "prefetch", begin, prefetched))
        self.piece_prefetched.append(prefetched)
        self.staged.append(views)
        if offset == 0:
            self.sources.append(_sources(sg))
        if p == self.pieces_of[k][-1]:  # the subgroup's last piece: nothing more of it is read from the host
            self.prefetched.append(prefetched)
            if self.signals is not None:
                self.signals.read_grad(i, prefetched)

    def issue_next(self) -> None:
        s = self.s
        k = self.next
        self.next += 1
        i = self.ids[k]
        sg = self.subgroups[i]
        for p in self.pieces_of[k]:
            if p == len(self.piece_prefetched):
                self._prefetch(p)
            _, offset, n = self.pieces[p]
            master, exp_avg, exp_avg_sq, grad = self.staged[p]
            with s.use(s.adam):
                s.wait(s.adam, self.piece_prefetched[p])
                begin = s.record(s.adam, timing=True)
                if sg.grad_on_device and sg.grad.dtype == torch.float32:
                    grad = _piece(sg.grad, offset, n)  # kept in fp32 (gradients accumulate in fp32): used in place
                elif grad is None:  # kept in 16 bits and no gradient row: widened exactly, chunk by chunk
                    adam_widened(sg, master, _piece(sg.grad, offset, n), exp_avg, exp_avg_sq, self.step_count[k],
                                 self.scratch, self.inv, self.unit_scale)
                elif sg.grad_on_device:
                    grad.copy_(_piece(sg.grad, offset, n))  # kept in 16 bits: widened exactly into the gradient row
                if grad is not None:
                    if not self.unit_scale:
                        grad.mul_(self.inv)  # same unscale/clip factor as the host lane, in fp32
                    adam(sg, master, grad, exp_avg, exp_avg_sq, self.step_count[k])
                _piece(sg.param16, offset, n).copy_(master)  # 16-bit params in their own dtype, on the device
                adam_done = s.record(s.adam, timing=True)
                self.spans.append((i, "device", "adam", begin, adam_done))
            with s.use(s.flush):
                s.wait(s.flush, adam_done)
                begin = s.record(s.flush, timing=True)
                _chunked_copy(_piece(sg.master, offset, n), master)
                _chunked_copy(_piece(sg.exp_avg, offset, n), exp_avg)
                _chunked_copy(_piece(sg.exp_avg_sq, offset, n), exp_avg_sq)
                flushed = s.record(s.flush, timing=True)
                self.spans.append((i, "device", "flush", begin, flushed))
                self.flushed[p % self.n_slots] = flushed
        if self.signals is not None:  # overlapped: the next backward runs meanwhile (``run`` holds them to its end)
            self.signals.wrote(i, adam_done)
            self.let_go((i,))
        self.done = [adam_done, flushed]
        sg.state["step"] += 1
        n = sg.numel
        t = self.timings
        t.device_params += n
        t.device_subgroups += 1
        t.h2d_bytes += (12 if sg.grad_on_device else 16) * n
        t.d2h_bytes += 12 * n


def _piece(t: torch.Tensor, offset: int, n: int) -> torch.Tensor:
    """Elements ``offset`` to ``offset + n`` of a subgroup's flat tensor (a view)."""
    return t.reshape(-1).narrow(0, offset, n)


def _slot_rows(ids: Sequence[int], subgroups: Sequence[Subgroup]) -> int:
    """Rows of a device-lane buffer slot: master, exp_avg, exp_avg_sq, and a gradient row unless every gradient of
    the lane stayed on the device (then it is read in place, or widened through the lane's scratch)."""
    return 3 if all(subgroups[i].grad_on_device for i in ids) else 4


def _sources(sg: Subgroup) -> tuple[Any, ...]:
    """What a prefetch of ``sg`` reads: its tensors (held, so none is freed and replaced at the same address) and
    whether the gradient stayed on the device (then it is not read)."""
    return sg.master, sg.exp_avg, sg.exp_avg_sq, None if sg.grad_on_device else sg.grad, sg.grad_on_device


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two ``_sources`` name the same tensors (identity, not values) and the same gradient place."""
    return all(x is y for x, y in zip(a[:4], b[:4])) and a[4] == b[4]


def _device_ids(lanes: Sequence[Lane], order: Sequence[int], resident: frozenset[int] = frozenset()) -> list[int]:
    """The device lane's subgroups in processing order (``order``, then any device subgroup it left out)."""
    return _lane_ids(lanes, order, Lane.DEVICE, resident)


def _lane_ids(lanes: Sequence[Lane], order: Sequence[int], lane: Lane,
              resident: frozenset[int] = frozenset()) -> list[int]:
    """``lane``'s subgroups in processing order: ``order``, then any subgroup of the lane it left out, ascending;
    never a resident one (its lane in the plan is unused)."""
    ids = [i for i in order if lanes[i] == lane and i not in resident]
    missing = {i for i, each in enumerate(lanes) if each == lane} - set(ids) - resident
    return ids + sorted(missing)


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
    start: Any, host_origin: float, spans: list[Span], timings: LaneTimings, origin: Any = None
) -> None:
    """Turn recorded events into per-stage spans (seconds since the phase began) and busy times.

    ``origin``: a timing event recorded before every span (the device lane's, when its first prefetches were issued
    before the phase); device times are then measured from it, forward only, and shifted to ``start``.
    """
    if origin is None or isinstance(origin, _HostEvent):
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
        if isinstance(begin, _HostEvent) and isinstance(end, _HostEvent):
            b, e = begin.time - host_origin, end.time - host_origin  # host clock (the host lane on a GPU too)
        elif isinstance(begin, _HostEvent):
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

