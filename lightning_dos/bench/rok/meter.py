"""Owns a ROK worker's run (:func:`execute_placement`) and the activation memory of every iteration, measured by a
Lightning callback placed after the :class:`~lightning_dos.activations.ActivationOffloadCallback`.

Two measures: **device** (on a GPU), the allocator's peak over forward and backward less what was allocated when the
forward started (the peak is reset at every batch's start but the first; a
:class:`~lightning_dos.telemetry.peak_memory.GpuPeakMeter` keeps the process's own across the resets); **accounting**
(wherever the offload's hooks run, the only one off a GPU), the offload's ``act/device_peak_bytes``: the saved tensors
held on the device at once, which under checkpointing sees each block's input, not what a block recomputes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_dos.bench.measure import dos_records, fit_and_measure
from lightning_dos.bench.settings import Run
from lightning_dos.telemetry.peak_memory import GpuPeakMeter

__all__ = ["ActivationMemoryMeter", "execute_placement"]


class ActivationMemoryMeter(pl.Callback):
    """Records each iteration's peak activation memory and ``act/*`` counters (``offload``: the run's
    :class:`~lightning_dos.activations.ActivationOffloadCallback`, or None without hooks)."""

    def __init__(self, offload: Any = None) -> None:
        self.offload = offload
        self.device_bytes: list[int | None] = []
        """Per iteration: the allocator's peak over forward and backward less the allocation at the forward's start
        (None off a GPU)."""
        self.accounting_bytes: list[int | None] = []
        """Per iteration: the offload's ``act/device_peak_bytes`` (None without hooks)."""
        self.counters: list[dict[str, float] | None] = []
        """Per iteration: the offload's ``act/*`` counters (None without hooks)."""
        self.peaks = GpuPeakMeter()
        """The process's peak GPU memory, across the meter's resets (inert off a GPU)."""
        self._device: torch.device | None = None
        self._start: int | None = None
        self._peak: int | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = trainer.strategy.root_device
        self._device = device if device.type == "cuda" else None
        self.peaks.bind(device)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._peak = None
        # the first batch leaves the allocator's peak alone: DOS places its residents at that batch's dispatch from
        # the peak since the process began (that batch is warm-up, not measured)
        if self._device is None or not self.device_bytes:
            return
        self._start = torch.cuda.memory_allocated(self._device)
        self.peaks.take()  # the process's peaks kept, then reset

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._device is not None and self._start is not None:
            self._peak = torch.cuda.max_memory_allocated(self._device) - self._start

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.device_bytes.append(self._peak)
        offload = getattr(self.offload, "offload", None)
        metrics = offload.metrics() if offload is not None else {}
        self.counters.append(metrics or None)
        peak = metrics.get("act/device_peak_bytes")
        self.accounting_bytes.append(None if peak is None else int(peak))

    def raw(self) -> dict[str, Any]:
        """Everything recorded, per iteration, for the worker's result."""
        return {"device_bytes": list(self.device_bytes), "accounting_bytes": list(self.accounting_bytes),
                "counters": list(self.counters)}


def execute_placement(payload: dict[str, Any], spec: Run) -> dict[str, Any]:
    """Train the placement of ``payload`` and return the bench's measurements plus the activation memory and the
    ``act/*`` counters of every iteration (and, under DOS, the manager's update records)."""
    from lightning_dos.activations import ActivationOffloadCallback

    settings = spec.extra["activations"]
    offload = None
    if settings["hooks"]:
        offload = ActivationOffloadCallback(settings["offload"], nvme_path=settings.get("nvme_path"),
                                            min_tensor_bytes=settings["min_tensor_bytes"],
                                            keep_last_layers=settings["keep_last_layers"], log_metrics=False)
    meter = ActivationMemoryMeter(offload)
    trainer, result = fit_and_measure(payload, spec, callbacks=[offload, meter] if offload is not None else [meter])
    if meter.peaks.active:  # the meter resets the allocator's peak every iteration: the process's is its own
        for key, peak in meter.peaks.process_peaks().items():
            result[key] = max(peak, result.get(key) or 0.0)
    result["dos"] = dos_records(trainer.strategy)  # the plan of every update phase (None for zero3_offload)
    result["activations"] = {**settings, **meter.raw()}
    return result
