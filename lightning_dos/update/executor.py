"""Owns the execution of one update phase for a given plan: the resident subgroups, the host lane and the device lane.

It composes the phase's parts, each in its own module (:mod:`~lightning_dos.update.resident`,
:mod:`~lightning_dos.update.host_lane`, :mod:`~lightning_dos.update.device_lane`, the streams of
:mod:`~lightning_dos.update.streams`, the measurements of :mod:`~lightning_dos.update.timings`): the residents' update
is issued first, then the host lane runs and feeds the device lane between its subgroups, then whatever is left of the
device lane is issued. ``run`` returns once the state is consistent; ``issue`` (``overlap=True``) hands the same work
to a worker thread and returns an :class:`~lightning_dos.update.in_flight.InFlightUpdate` at once. The device lane's
first prefetches may be issued at dispatch (``prefetch_ahead``), while the link is otherwise idle. On a machine without
an accelerator the host stands in for the device: the same buffers, copies and ordering, with events that complete
at once. No DeepSpeed import here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dos.planning.plan import Lane
from lightning_dos.update.device_lane import DeviceLane
from lightning_dos.update.host_lane import HostLane
from lightning_dos.update.in_flight import InFlightUpdate, Worker
from lightning_dos.update.resident import ResidentUpdate
from lightning_dos.update.streams import Streams
from lightning_dos.update.subgroup import Subgroup
from lightning_dos.update.timings import LaneTimings, Span, resolve_spans


@dataclass
class _Begun:
    """An update phase between ``UpdateExecutor._begin`` and ``_end``."""

    t0: float
    timings: LaneTimings
    spans: list[Span]
    start: Any
    device_lane: DeviceLane
    host_ids: list[int]


class UpdateExecutor:
    """Runs update phases on one device; keeps the host lane's upload buffers and the worker thread between steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.streams = Streams(self.device)
        self.host_lane = HostLane(self.streams)
        self._ahead: DeviceLane | None = None
        self._worker = Worker()
        #: the subgroups whose state stays on the device (``resident_gib``): in neither lane, updated first
        self.resident: ResidentUpdate | None = None

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
        lane = DeviceLane(self.streams, ids, buffers, subgroups)
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
        self.host_lane.reserve(numel)

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
        host_done = self.host_lane.run(begun.host_ids, subgroups, host_step, begun.timings, begun.spans,
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
    ) -> InFlightUpdate:
        """``run``'s update, issued to the worker thread: returns at once with the update in flight (see
        :mod:`lightning_dos.update.in_flight`); ``InFlightUpdate.join`` gives its timings. ``host_step`` then runs on
        the worker and must read nothing the training loop may change meanwhile (hyperparameters are read when it is
        made)."""
        begun = self._begin(lanes, order, buffers, subgroups, inv_scale, host_order)
        phase = InFlightUpdate(len(subgroups), self.streams.wait)
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
                done.extend(self.host_lane.run(begun.host_ids, lane.subgroups, host_step, begun.timings,
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

        self._worker.start(phase, work, finish)
        return phase

    def close(self) -> None:
        """Stop the worker thread (after the phase it runs, if any)."""
        self._worker.close()

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
        device_lane = ahead or DeviceLane(s, device_ids, buffers, subgroups)
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
        timings.device_buffer_bytes += self.host_lane.buffer_bytes
        origin = begun.device_lane.origin if timings.prefetched_ahead else None
        resolve_spans(begun.start, begun.t0, begun.spans, timings, origin=origin)
        return timings

    def _resident_ids(self) -> frozenset[int]:
        return frozenset(self.resident.ids) if self.resident is not None else frozenset()

    def _run_resident(self, subgroups: Sequence[Subgroup], inv_scale: torch.Tensor | float, timings: LaneTimings,
                      phase: InFlightUpdate | None = None) -> list[Any]:
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

