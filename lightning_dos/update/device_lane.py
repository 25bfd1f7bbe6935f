"""Owns the device lane of an update phase: subgroups streamed through buffer slots on the device and back
(:class:`DeviceLane` says how). A gradient kept on the device through backward is not prefetched; kept in its 16-bit
dtype, ``adam`` widens it (exactly) into the slot's gradient row, or, when every gradient of the lane stayed on the
device, chunk by chunk through one 64 MB scratch buffer and the slot has no gradient row (a quarter less memory;
:mod:`lightning_dos.update.device_adam`). The performance model's ``device_memory_bytes`` counts slots with the row: it
may demote early by that quarter, never late. No DeepSpeed import here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from lightning_dos.planning.perf_model import PIECE_PARAMS, PREFETCH_WINDOW, buffer_slots, early_prefetches
from lightning_dos.update.device_adam import adam, adam_widened, scratch_for
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.update.streams import COPY_CHUNK, Streams, chunked_copy
from lightning_dos.update.subgroup import Subgroup
from lightning_dos.update.timings import LaneTimings, Span

# PREFETCH_WINDOW: the device lane is issued while fewer than this many of its prefetches are outstanding (see
# ``DeviceLane``): enough to keep the link busy, few enough that a host-lane upload never queues behind the whole
# lane. The performance model owns the constant, since it predicts the prefetches issued at dispatch from it.
#: Parameters per piece of a device-lane subgroup: the buffer slots hold a piece, not a whole subgroup (see
#: ``DeviceLane``); the performance model's, so it weighs the slots that run. Two copy chunks, a multiple of every
#: vector width; a piece's state is 384 MB in fp32.
PIECE = PIECE_PARAMS
assert PIECE == 2 * COPY_CHUNK, "a piece is two copy chunks"


class DeviceLane:
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
        streams: Streams,
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
        self.signals: InFlightUpdate | None = None  # the phase in flight, when issued to the worker (``issue``)
        if not self.ids:
            return
        s = streams
        numel = max(length for _, _, length in self.pieces)
        self.rows = _slot_rows(self.ids, subgroups)
        self.slots = [torch.empty((self.rows, numel), dtype=torch.float32, device=s.device)
                      for _ in range(self.n_slots)]
        # 16-bit gradients (kept on the device with no gradient row, or prefetched from the host into a 16-bit view of
        # it) are widened chunk by chunk through one scratch buffer
        sixteen = any(subgroups[i].grad is not None and subgroups[i].grad.dtype != torch.float32 for i in self.ids)
        self.scratch = scratch_for(numel, s.device) if self.rows == 3 or sixteen else None
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
        """Issue the first pieces' prefetches before the update phase: one per slot, ``window`` at most. They read only
        the optimizer state, which nothing changes between the end of backward and the update phase."""
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
        if views[3] is not None and not sg.grad_on_device and sg.grad.dtype != torch.float32:
            # a host gradient in its 16-bit dtype: prefetched as it is, into the row's first half, widened by Adam
            views = (*views[:3], slot[3].view(sg.grad.dtype)[:n])
        master, exp_avg, exp_avg_sq, grad = views
        with s.use(s.h2d):
            s.wait(s.h2d, self.flushed[p % self.n_slots])  # slot free only once its last flush is done
            s.wait(s.h2d, self.ready)
            begin = s.record(s.h2d, timing=True)
            chunked_copy(master, _piece(sg.master, offset, n))
            chunked_copy(exp_avg, _piece(sg.exp_avg, offset, n))
            chunked_copy(exp_avg_sq, _piece(sg.exp_avg_sq, offset, n))
            if not sg.grad_on_device:  # a gradient kept on the device through backward needs no prefetch
                chunked_copy(grad, _piece(sg.grad, offset, n))
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
                s.wait(s.adam, self.piece_prefetched[p])  # Adam reads the piece only once its prefetch has landed
                begin = s.record(s.adam, timing=True)
                if sg.grad_on_device and sg.grad.dtype == torch.float32:
                    grad = _piece(sg.grad, offset, n)  # kept in fp32 (gradients accumulate in fp32): used in place
                elif grad is None:  # kept in 16 bits and no gradient row: widened exactly, chunk by chunk
                    adam_widened(sg, master, _piece(sg.grad, offset, n), exp_avg, exp_avg_sq, self.step_count[k],
                                 self.scratch, self.inv, self.unit_scale)
                elif sg.grad_on_device:
                    grad.copy_(_piece(sg.grad, offset, n))  # kept in 16 bits: widened exactly into the gradient row
                elif grad.dtype != torch.float32:  # prefetched in 16 bits: widened exactly, chunk by chunk
                    adam_widened(sg, master, grad, exp_avg, exp_avg_sq, self.step_count[k], self.scratch, self.inv,
                                 self.unit_scale)
                    grad = None
                if grad is not None:
                    if not self.unit_scale:
                        grad.mul_(self.inv)  # same unscale/clip factor as the host lane, in fp32
                    adam(sg, master, grad, exp_avg, exp_avg_sq, self.step_count[k])
                _piece(sg.param16, offset, n).copy_(master)  # 16-bit params in their own dtype, on the device
                adam_done = s.record(s.adam, timing=True)
                self.spans.append((i, "device", "adam", begin, adam_done))
            with s.use(s.flush):
                s.wait(s.flush, adam_done)  # the flush copies back what Adam wrote, not what it is writing
                begin = s.record(s.flush, timing=True)
                chunked_copy(_piece(sg.master, offset, n), master)
                chunked_copy(_piece(sg.exp_avg, offset, n), exp_avg)
                chunked_copy(_piece(sg.exp_avg_sq, offset, n), exp_avg_sq)
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
        t.h2d_bytes += (12 if sg.grad_on_device else 12 + sg.grad.element_size()) * n
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
