"""Activation offload: tensors saved for backward go to pinned host memory or NVMe files, and come back in time.

Public API: :class:`ActivationOffload` (a context manager around a step's forward and backward, usable without
Lightning), :class:`ActivationOffloadCallback` (the same for every training step under any Lightning strategy;
``DeepOptimizerStatesStrategy(activation_offload=...)`` installs one), and :func:`validate_options`. See
``docs/activation-offload.md``.

Modules, one job each: ``options`` (names, defaults, validation), ``layers`` (block boundaries from forward hooks),
``streams`` (copy lanes ordered by events), ``pool`` (reused pinned host buffers), ``store`` (NVMe files and their
I/O threads), ``offload`` (the saved-tensor hooks), ``stats`` (``act/*`` telemetry), ``callback`` (Lightning).
"""

from lightning_dos.activations.callback import ActivationOffloadCallback
from lightning_dos.activations.offload import ActivationOffload
from lightning_dos.activations.options import (
    DEFAULT_KEEP_LAST_LAYERS,
    DEFAULT_MIN_TENSOR_BYTES,
    DEFAULT_PREFETCH_LAYERS,
    MIN_FREE_DISK_BYTES,
    OFFLOAD_PLACEMENTS,
    PLACEMENTS,
    STRATEGY_KEYS,
    OptionKeys,
    validate_options,
)
from lightning_dos.activations.stats import KEEP_REASONS, Decision, StepStats

__all__ = [
    "DEFAULT_KEEP_LAST_LAYERS",
    "DEFAULT_MIN_TENSOR_BYTES",
    "DEFAULT_PREFETCH_LAYERS",
    "KEEP_REASONS",
    "MIN_FREE_DISK_BYTES",
    "OFFLOAD_PLACEMENTS",
    "PLACEMENTS",
    "STRATEGY_KEYS",
    "ActivationOffload",
    "ActivationOffloadCallback",
    "Decision",
    "OptionKeys",
    "StepStats",
    "validate_options",
]
