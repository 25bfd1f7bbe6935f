"""Owns the host lane of an update phase: DeepSpeed's CPU Adam per subgroup, then the upload of its new params.

Per subgroup: DeepSpeed's CPU Adam with vanilla's unscale/clip factor applied as it reads the gradient (supplied by
the seam as ``host_step``; the same values as vanilla's two passes, bit for bit), then the new fp32 master weights are
uploaded asynchronously, straight from their pinned home, through a small ring of fp32 buffers on the device, where a
kernel writes them into the 16-bit params (:class:`_UploadRing`). The host itself neither converts nor waits: the
16-bit conversion is a memory-bound pass that cost the host lane about a quarter of its time (read off a GPU host's
timeline) and is a short kernel on the device; it doubles the upload's bytes on the link (4 instead of 2 per
parameter), which the performance model weighs.

The host lane runs on the thread that runs the phase (DeepSpeed's CPU Adam uses all cores itself); its uploads go on
the same ``h2d`` stream as the device lane's prefetches, so the link serves both in the order they were issued (on
separate streams a copy engine was seen to serve the uploads only when the prefetch stream paused). The device lane
is issued from the same thread a few subgroups ahead, between host-lane subgroups
(:meth:`~lightning_dos.update.device_lane.DeviceLane.feed`), so that an upload never queues behind more than that
many prefetches. No DeepSpeed import here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_dos.update.device_lane import DeviceLane
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.update.streams import COPY_CHUNK, HostEvent, Streams
from lightning_dos.update.subgroup import Subgroup
from lightning_dos.update.timings import LaneTimings, Span

#: fp32 buffers (of ``COPY_CHUNK`` elements each) on the device through which host-lane uploads pass on their way
#: into the 16-bit params. Allocated once (the manager reserves them at start-up) and kept: 3 x 64 MB on a real run.
UPLOAD_BUFFERS = 3


class HostLane:
    """The host lane of every update phase on one device; keeps its upload ring's device buffers between phases."""

    def __init__(self, streams: Streams) -> None:
        self.s = streams
        self.buffers: list[torch.Tensor] = []  # the upload ring, allocated at the first need (or by ``reserve``)

    def reserve(self, numel: int) -> list[torch.Tensor]:
        """The ring of fp32 device buffers for uploads of subgroups of up to ``numel`` parameters:
        ``UPLOAD_BUFFERS`` of up to ``COPY_CHUNK`` elements (allocated anew only if the ring is too small)."""
        numel = min(numel, COPY_CHUNK)
        if len(self.buffers) != UPLOAD_BUFFERS or self.buffers[0].numel() < numel:
            self.buffers = []  # release the old ring before the new one is allocated
            self.buffers = [torch.empty(numel, dtype=torch.float32, device=self.s.device)
                            for _ in range(UPLOAD_BUFFERS)]
        return self.buffers

    @property
    def buffer_bytes(self) -> int:
        """Device memory the upload ring holds."""
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def run(
        self,
        ids: Sequence[int],
        subgroups: Sequence[Subgroup],
        host_step: Callable[[int], None],
        timings: LaneTimings,
        spans: list[Span],
        device_lane: DeviceLane,
        phase: InFlightUpdate | None = None,
    ) -> list[Any]:
        """Run the host lane on this thread; between its subgroups, feed the device lane (see ``DeviceLane``).
        With a ``phase`` (``issue``), tell its readers as each subgroup's gradient is free and its params written.
        Returns the event after which its last upload is written (none without host-lane subgroups)."""
        if not ids:
            return []
        ring = _UploadRing(self.s, self.reserve(max(subgroups[i].numel for i in ids)))
        uploaded: Any = None
        t0 = time.perf_counter()
        for i in ids:
            sg = subgroups[i]
            device_lane.feed()
            begin = HostEvent()
            begin.record()
            host_step(i)
            adam_done = HostEvent()
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

    def __init__(self, streams: Streams, buffers: list[torch.Tensor]) -> None:
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

