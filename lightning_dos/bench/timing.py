"""Owns the per-iteration phase timer: a Lightning callback that splits each iteration into fwd, bwd and step.

Phase boundaries are Lightning hooks. Under a DeepSpeed strategy Lightning's precision plugin calls
``on_before_backward`` and ``on_after_backward`` around ``engine.backward`` and ``on_before_optimizer_step``
after the closure, right before ``engine.step``, so:

* fwd:       ``on_train_batch_start`` -> ``on_before_backward`` (forward and loss)
* bwd:       ``on_before_backward`` -> ``on_after_backward`` (``engine.backward``: gradients, their
  reduce-scatter and, when offloading, their copy to the host)
* step:      ``on_before_optimizer_step`` -> ``on_train_batch_end`` (the update phase: DOS dispatch,
  ``engine.step``, parameter upload, scheduler)
* iteration: ``on_train_batch_start`` -> ``on_train_batch_end``

On a GPU every boundary calls ``torch.cuda.synchronize()`` first, so each phase's kernels are charged to it.
That costs a little and removes any overlap across a boundary; bench mode accepts both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_dos.bench.config import PHASES


def device_synchronizer(device: torch.device) -> Callable[[], None]:
    """A no-argument function that waits for ``device``'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class PhaseTimer(pl.Callback):
    """Records fwd / bwd / step / iteration milliseconds and the loss of every training iteration.

    Args:
        synchronize: called before each timestamp; ``None`` synchronises the module's device.
    """

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self._synchronize = synchronize
        self._marks: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.losses: list[float] = []

    def _mark(self, name: str) -> None:
        if self._synchronize is not None:
            self._synchronize()
        self._marks[name] = time.perf_counter()

    def _span_ms(self, start: str, end: str) -> float:
        if start not in self._marks or end not in self._marks:
            return math.nan  # a hook that did not fire (e.g. a skipped backward) leaves a gap, not a wrong number
        return (self._marks[end] - self._marks[start]) * 1e3

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._synchronize is None:
            self._synchronize = device_synchronizer(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._marks.clear()
        self._mark("start")

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._mark("backward_start")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("backward_end")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._mark("step_start")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._mark("end")
        self.samples["fwd_ms"].append(self._span_ms("start", "backward_start"))
        self.samples["bwd_ms"].append(self._span_ms("backward_start", "backward_end"))
        self.samples["step_ms"].append(self._span_ms("step_start", "end"))
        self.samples["iteration_ms"].append(self._span_ms("start", "end"))
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss) if loss is not None else math.nan)
