"""Owns the per-iteration phase timer: a Lightning callback that splits each iteration into fwd, bwd and step.

Phases run between Lightning hooks: fwd ``on_train_batch_start`` -> ``on_before_backward``, bwd ->
``on_after_backward``, step ``on_before_optimizer_step`` -> ``on_train_batch_end``; on a GPU every boundary
synchronises first, so each phase's kernels are charged to it. The **end-to-end** iterations are neither split nor
synchronised: only ``time.perf_counter()`` at their end is read, and every loss stays a tensor until training is
over. Per synchronised phase it also takes the allocator's peak, the other threads' CPU time and the training
thread's involuntary switches, and notes when each DOS update phase began.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Collection
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_dos.bench.stats import HOST_KEYS, PHASE_PEAKS, PHASES
from lightning_dos.planning.placement import GIB
from lightning_dos.telemetry.callbacks import host_in_use_gib
from lightning_dos.telemetry.peak_memory import GpuPeakMeter


def device_synchronizer(device: torch.device) -> Callable[[], None]:
    """A no-argument function that waits for ``device``'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


#: The phases :class:`PhaseTimer` splits an iteration into, and the marks that bound each.
PHASE_MARKS = {"fwd": ("start", "backward_start"), "bwd": ("backward_start", "backward_end"),
               "step": ("step_start", "end")}


def host_counters() -> tuple[float, float, float]:
    """(process CPU s, this thread's CPU s, this thread's involuntary context switches; NaN where not known)."""
    thread_usage = getattr(resource, "RUSAGE_THREAD", None)
    switches = float(resource.getrusage(thread_usage).ru_nivcsw) if thread_usage is not None else math.nan
    return time.process_time(), time.thread_time(), switches


class PhaseTimer(pl.Callback):
    """Records fwd / bwd / step / iteration ms, the end time and the loss of every training iteration, leaving
    ``e2e_iterations`` (indices from 0) unsynchronised and unsplit; ``memory``: each synchronised phase's GPU peak."""

    def __init__(self, synchronize: Callable[[], None] | None = None,
                 e2e_iterations: Collection[int] = (), memory: GpuPeakMeter | None = None) -> None:
        self._synchronize = synchronize
        self.e2e_iterations = frozenset(e2e_iterations)
        self.memory = memory
        self.memory_samples: dict[str, list[float]] = {key: [] for key in PHASE_PEAKS}
        """Per iteration: each phase's peak allocated GPU GiB (NaN where not measured)."""
        self._peaks: dict[str, int | None] = {}  # per mark: the peak bytes of the span that ended at it
        self._marks: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.host: dict[str, list[float]] = {key: [] for key in HOST_KEYS}
        """Per iteration: the other threads' CPU ms and the training thread's involuntary switches, per phase."""
        self.ends: list[float] = []
        """Per iteration: seconds from ``on_train_start`` (or the first iteration's start) to its end."""
        self.host_in_use: list[float] = []
        """Per iteration: the whole host's memory in use at its end, GiB (``perf/host_in_use_gib``'s reading)."""
        self._manager: Any = None  # the DOS manager, whose records say when each update phase began
        self._losses: list[Any] = []
        self._cpu: dict[str, tuple[float, float, float]] = {}
        self._origin: float | None = None
        self._e2e = False
        self._last: tuple[int, dict[str, float]] | None = None

    @property
    def losses(self) -> list[float]:
        """Every iteration's loss as a float; read after training (a tensor's conversion waits for its device)."""
        return [float(loss) for loss in self._losses]

    def _mark(self, name: str) -> None:
        if self._e2e:  # end to end: no marks, no synchronisation
            return
        if self._synchronize is not None:
            self._synchronize()
        self._marks[name] = time.perf_counter()
        self._cpu[name] = host_counters()
        # the first batch leaves the allocator's peak alone: DOS places its residents at that batch's dispatch
        # from the peak since the process began
        if self.memory is not None and self.ends:
            self._peaks[name] = self.memory.take()

    def _span_ms(self, start: str, end: str) -> float:
        if start not in self._marks or end not in self._marks:
            return math.nan  # a hook that did not fire (e.g. a skipped backward) leaves a gap, not a wrong number
        return (self._marks[end] - self._marks[start]) * 1e3

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._synchronize is None:
            self._synchronize = device_synchronizer(trainer.strategy.root_device)
        if self.memory is not None:
            self.memory.bind(trainer.strategy.root_device)

    @property
    def update_starts(self) -> list[float]:
        """``perf_counter`` at the start of every DOS update phase so far (empty for other strategies)."""
        records = getattr(self._manager, "records", None) or []
        return [record.timings.started_s for record in records]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._manager = getattr(trainer.strategy, "manager", None)
        if self._synchronize is not None:
            self._synchronize()  # before any iteration: the first end-to-end sample starts from an idle device
        self._origin = time.perf_counter()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._e2e = len(self.ends) in self.e2e_iterations
        self._marks.clear()
        self._peaks.clear()
        self._mark("start")
        if self._origin is None and not self._e2e:
            self._origin = self._marks["start"]

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._mark("backward_start")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("backward_end")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._mark("step_start")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._e2e:
            end = time.perf_counter()
            if self._origin is None:
                self._origin = end
            for values in (*self.samples.values(), *self.host.values(), *self.memory_samples.values()):
                values.append(math.nan)
        else:
            end = self._record_phases()
        self.ends.append(end - self._origin)
        in_use = host_in_use_gib()
        self.host_in_use.append(math.nan if in_use is None else in_use)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())  # converted after training: float() here would wait for the device
        else:
            self._losses.append(math.nan if loss is None else float(loss))

    def _record_phases(self) -> float:
        """Close a synchronised iteration: its phase and host samples; the time it ended."""
        self._mark("end")
        self.samples["iteration_ms"].append(self._span_ms("start", "end"))
        for phase, (start, end) in PHASE_MARKS.items():
            self.samples[f"{phase}_ms"].append(self._span_ms(start, end))
            a, b = self._cpu.get(start), self._cpu.get(end)
            other = preempted = math.nan
            if a is not None and b is not None:
                other = max(0.0, (b[0] - a[0]) - (b[1] - a[1])) * 1e3
                preempted = b[2] - a[2]
            self.host[f"{phase}_other_cpu_ms"].append(other)
            self.host[f"{phase}_preempted"].append(preempted)
        for key, marks in zip(PHASE_PEAKS, (("backward_start",), ("backward_end",), ("step_start", "end"))):
            taken = [self._peaks.get(mark) for mark in marks]
            # a mark that did not fire (its span then counts in the next one) or an inert meter: not measured
            self.memory_samples[key].append(max(taken) / GIB if all(t is not None for t in taken) else math.nan)
        self._last = (len(self.ends), dict(self._marks))
        return self._marks["end"]

    def last_iteration(self) -> dict[str, Any] | None:
        """The last synchronised iteration: its number (from 1), its start (``perf_counter``, shared by a host's
        processes), its marks in ms and the update phase that began in it, if any."""
        if self._last is None:
            return None
        index, marks = self._last
        start, end = marks["start"], marks["end"]
        inside = [i for i, t in enumerate(self.update_starts) if start <= t <= end]
        update = inside[-1] if inside else None
        return {
            "iteration": index + 1,
            "started_s": start,
            "marks_ms": {name: (t - start) * 1e3 for name, t in marks.items() if name != "start"},
            "update_index": update,
            "update_start_ms": None if update is None else (self.update_starts[update] - start) * 1e3,
        }
