"""Owns a ROK worker's body: one placement's run (or a search probe) inside ``python -m lightning_dos.bench.worker``.

The worker's config file has an ``activations`` entry
(:meth:`~lightning_dos.bench.rok.config.RokConfig.worker_settings`): the placement, whether the activation offload's
hooks run and with which offload placement (``keep`` measures only), the NVMe directory and the offload's knobs. The
bench settings already carry the placement's activation checkpointing and micro-batch. Training and timing are the
bench's (:func:`~lightning_dos.bench.worker.fit_and_measure`, which the worker hands in, so that this module, which the
worker imports, does not import the worker); this adds the
:class:`~lightning_dos.activations.ActivationOffloadCallback` where the hooks run and an
:class:`~lightning_dos.bench.rok.meter.ActivationMemoryMeter` after it, and returns the bench's measurements with the
meter's under ``activations``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.strategies import RunSpec

__all__ = ["ACTIVATIONS_KEY", "execute_placement"]

#: The key of a ROK run's settings in a worker's config file, and of its measurements in the result.
ACTIVATIONS_KEY = "activations"
GIB = 1024**3


def execute_placement(payload: dict[str, Any], spec: RunSpec, workdir: Path, *,
                      fit_and_measure: Callable[..., tuple[Any, dict[str, Any]]],
                      dos_records: Callable[[Any], dict[str, Any] | None]) -> dict[str, Any]:
    """Train the placement of ``payload`` and return the bench's measurements plus the activation memory and the
    ``act/*`` counters of every iteration (and, under DOS, the manager's update records).

    ``fit_and_measure`` and ``dos_records`` are the bench worker's (:func:`~lightning_dos.bench.worker.fit_and_measure`,
    :func:`~lightning_dos.bench.worker.dos_records`)."""
    from lightning_dos.activations import ActivationOffloadCallback
    from lightning_dos.bench.rok.meter import ActivationMemoryMeter

    config = BenchConfig.from_dict(payload["bench"])
    settings = payload[ACTIVATIONS_KEY]
    offload = None
    if settings["hooks"]:
        offload = ActivationOffloadCallback(settings["offload"], nvme_path=settings.get("nvme_path"),
                                            min_tensor_bytes=settings["min_tensor_bytes"],
                                            keep_last_layers=settings["keep_last_layers"], log_metrics=False)
    meter = ActivationMemoryMeter(offload)
    callbacks = [offload, meter] if offload is not None else [meter]
    trainer, result = fit_and_measure(config, spec, workdir, callbacks=callbacks)
    peaks = meter.process_peaks()
    if peaks is not None:  # the meter resets the allocator's peak every iteration: the process's is its own
        result["peak_gpu_gib"] = max(peaks["allocated"] / GIB, result.get("peak_gpu_gib") or 0.0)
        result["peak_gpu_reserved_gib"] = max(peaks["reserved"] / GIB, result.get("peak_gpu_reserved_gib") or 0.0)
    result["dos"] = dos_records(trainer.strategy)  # the plan of every update phase (None for zero3_offload)
    result[ACTIVATIONS_KEY] = {**settings, "micro_batch": config.micro_batch, **meter.raw()}
    return result
