"""Owns the device-memory census at the training's peak: what was live on the GPU when the allocator held the most.

The memory plan after the first forward and backward reads one figure, the allocator's peak, and gives the GPU's
room beyond it to resident optimizer state; a peak larger than its parts explain is room lost. :class:`DevicePeakLog`
records the CUDA caching allocator's history (``torch.cuda.memory._record_memory_history``) from the start of training
to the end of a training batch's backward, replays it (:func:`replay`) to find the moment the most was allocated, and
prints what was live then, grouped by where it was allocated: the innermost Python frame outside torch
(:func:`where`), so a gradient DeepSpeed's hooks made reads ``deepspeed/...:function``, an activation the model's
``forward``. What was allocated before the recording began is one line (the training's parameters, the optimizer state
made at start).

Add it to a run as a callback: ``lightning-dos fit ... --trainer.callbacks+=lightning_dos.telemetry.DevicePeakLog``.
The recording keeps every allocation's stack on the host (a few KB each) until the census, so it is off unless asked.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dos.planning.placement import GIB

#: Where a frame's file sits, from the package down: the first of these in its path starts the label.
PACKAGES = ("lightning_dos/", "deepspeed/", "lightning/", "transformers/")
#: The label of the memory allocated before the recording began.
BEFORE = "held when the recording began"


def where(frames: Sequence[Mapping[str, Any]]) -> str:
    """The label of an allocation from its stack (innermost frame first, as torch records it): the first frame outside
    torch's own package, as ``package/path.py:function``; ``(no Python frame)`` where there is none."""
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if "/torch/" in filename or filename.startswith("<") or not filename:
            continue
        for package in PACKAGES:
            at = filename.rfind(package)
            if at >= 0:
                filename = filename[at:]
                break
        else:
            filename = filename.rsplit("/", 1)[-1]
        return f"{filename}:{frame.get('name', '?')}"
    return "(no Python frame)"


@dataclass(frozen=True)
class PeakCensus:
    """The allocator's history replayed: its highest total and what was live then, by label."""

    peak_bytes: int
    """The most allocated at once while it recorded (the memory held before the recording included)."""
    at_event: int
    """The index of the event that reached the peak (-1: it was reached before the first event)."""
    events: int
    groups: tuple[tuple[str, int, int], ...]
    """(label, bytes, allocations) live at the peak, largest first; :data:`BEFORE` for what was held before."""
    end_bytes: int
    """The total after the last event."""


def replay(events: Iterable[Mapping[str, Any]], held_before: int) -> PeakCensus:
    """The peak of an allocator history (torch's ``device_traces`` of one device: ``alloc``, ``free_requested``,
    ``free_completed`` events with ``addr``, ``size`` and ``frames``) that began with ``held_before`` bytes allocated.
    A block counts as freed at its ``free_requested`` (when torch's allocated bytes drop), or at its
    ``free_completed`` where no request was recorded; a block freed that the history never saw allocated was held
    before it."""
    trace = [e for e in events if e.get("action") in ("alloc", "free_requested", "free_completed")]

    def walk(stop: int | None = None) -> tuple[dict[int, Mapping[str, Any]], int, int, int, int]:
        live: dict[int, Mapping[str, Any]] = {}
        requested: set[int] = set()  # blocks held before whose free was requested, their completion still to come
        base = total = held_before
        peak, peak_at = total, -1
        for k, event in enumerate(trace if stop is None else trace[:stop + 1]):
            action, addr, size = event["action"], int(event["addr"]), int(event["size"])
            if action == "alloc":
                live[addr] = event
                total += size
            elif addr in live:
                total -= int(live.pop(addr)["size"])
                if action == "free_requested":
                    requested.add(addr)
            elif action == "free_completed" and addr in requested:
                requested.discard(addr)
            else:  # held before the recording began
                base -= size
                total -= size
                if action == "free_requested":
                    requested.add(addr)
            if total > peak:
                peak, peak_at = total, k
        return live, base, total, peak, peak_at

    _, _, end, peak, peak_at = walk()
    live, base, _, _, _ = walk(peak_at) if peak_at >= 0 else ({}, held_before, 0, 0, 0)
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for event in live.values():
        label = where(event.get("frames") or ())
        sizes[label] += int(event["size"])
        counts[label] += 1
    if base:
        sizes[BEFORE] += base
    groups = tuple(sorted(((label, n, counts[label]) for label, n in sizes.items()), key=lambda g: (-g[1], g[0])))
    return PeakCensus(peak_bytes=peak, at_event=peak_at, events=len(trace), groups=groups, end_bytes=end)


def describe(census: PeakCensus, when: str, top: int = 12, max_allocated: int | None = None) -> str:
    """A few lines of ``census`` in GiB: the peak, and its ``top`` largest groups (the rest summed)."""
    head = (f"device peak census ({when}): {census.peak_bytes / GIB:.2f} GiB allocated at the peak "
            f"(event {census.at_event + 1} of {census.events}; {census.end_bytes / GIB:.2f} GiB at the end)")
    if max_allocated is not None:
        head += f"; the allocator's own peak since the process began {max_allocated / GIB:.2f} GiB"
    lines = [head]
    for label, n, count in census.groups[:top]:
        lines.append(f"  {n / GIB:8.2f} GiB  {label}" + ("" if label == BEFORE else f" ({count} allocations)"))
    rest = census.groups[top:]
    if rest:
        lines.append(f"  {sum(n for _, n, _ in rest) / GIB:8.2f} GiB  {len(rest)} other places")
    return "\n".join(lines)


class DevicePeakLog(Callback):
    """Records the CUDA allocator's history from the start of training to the end of training batch ``at``'s backward
    and prints what was live at its peak (:func:`replay`), on every rank (each has its own device); off a CUDA device
    it says so and records nothing. The census is kept in :attr:`census`.

    Args:
        at: the training batch (counted from 1) whose backward ends the recording; 1 is the first forward and backward,
            the peak the strategy's memory plan places the resident state beside.
        top: the groups printed.
        max_entries: the most events the history keeps (torch drops the oldest beyond them, and the census then says
            the history was cut).
    """

    def __init__(self, at: int = 1, top: int = 12, max_entries: int = 500_000) -> None:
        if at < 1 or top < 1 or max_entries < 1:
            raise ValueError(f"DevicePeakLog: at, top and max_entries must be >= 1, got {at}, {top}, {max_entries}")
        self.at, self.top, self.max_entries = at, top, max_entries
        self.batches = 0
        self.held_before: int | None = None
        self.census: PeakCensus | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = pl_module.device
        if device.type != "cuda" or not torch.cuda.is_available():
            print(f"device peak census: the module is on {device.type}, not a CUDA device: nothing recorded",
                  file=sys.stdout, flush=True)
            return
        self.held_before = torch.cuda.memory_allocated(device)
        torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python",
                                                 max_entries=self.max_entries)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.batches += 1

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.held_before is None or self.census is not None or self.batches != self.at:
            return
        device = pl_module.device
        snapshot = torch.cuda.memory._snapshot(device)
        torch.cuda.memory._record_memory_history(None)
        trace = snapshot["device_traces"][device.index if device.index is not None else torch.cuda.current_device()]
        self.census = replay(trace, self.held_before)
        when = f"training batch {self.at}, after its backward, rank {trainer.global_rank}"
        if len(trace) >= self.max_entries:
            when += f"; the history was cut at {self.max_entries} events, so the oldest are missing"
        print(describe(self.census, when, self.top, torch.cuda.max_memory_allocated(device)), file=sys.stdout,
              flush=True)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.held_before is not None and self.census is None:  # fewer batches than ``at``: stop recording
            torch.cuda.memory._record_memory_history(None)
