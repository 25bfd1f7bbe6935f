"""Owns the activation-offload telemetry: per-step counters and the ``act/*`` metric names they are logged under."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

__all__ = ["KEEP_REASONS", "Decision", "StepStats"]

#: Why a saved tensor stayed on the device.
KEEP_REASONS = ("parameter", "not_dense", "small", "placement", "last_layers", "tail")


class Decision(NamedTuple):
    """What happened to one tensor saved for backward (recorded when ``record_decisions`` is on)."""

    pass_id: int
    layer: int
    nbytes: int
    """Bytes of the tensor's whole storage (what moving it moves)."""
    action: str
    """``"offload"`` (a new storage moved out), ``"dedup"`` (a storage already saved: nothing moved) or ``"keep"``."""
    reason: str
    """For ``"keep"``: one of :data:`KEEP_REASONS`; else ``""``."""
    storage_ptr: int


@dataclass
class StepStats:
    """Counters of one step (between ``begin_step`` and ``end_step``)."""

    saved_tensors: int = 0
    """Tensors autograd saved for backward (every pack, deduplicated or not)."""
    offloaded_tensors: int = 0
    """Distinct storages moved off the device."""
    offloaded_bytes: int = 0
    restored_tensors: int = 0
    restored_bytes: int = 0
    dedup_hits: int = 0
    """Saves of a storage already saved (and held or moved) this step: nothing moved for them."""
    kept_tensors: int = 0
    """Saves left on the device, for any of :data:`KEEP_REASONS` (the ``kept_<reason>`` counters split it)."""
    kept_bytes: int = 0
    """Bytes of the distinct activation storages left on the device (parameters and odd tensors not counted)."""
    kept_parameter: int = 0
    kept_not_dense: int = 0
    kept_small: int = 0
    kept_placement: int = 0
    kept_last_layers: int = 0
    kept_tail: int = 0
    late_restores: int = 0
    """Restores that backward asked for before a prefetch had issued them."""
    restore_wait_s: float = 0.0
    """Host time backward spent waiting for restores to land (on CUDA, only NVMe reads block the host)."""
    write_wait_s: float = 0.0
    """Host time the forward pass waited for NVMe writes to drain (``max_inflight_write_bytes``)."""
    device_peak_bytes: int = 0
    """Peak bytes of saved activations held on the device by the hooks: kept storages plus restored ones."""
    nvme_written_bytes: int = 0
    nvme_read_bytes: int = 0

    def as_metrics(self, prefix: str = "act/") -> dict[str, float]:
        return {f"{prefix}{name}": float(value) for name, value in asdict(self).items()}

    def add(self, other: StepStats) -> None:
        """Accumulate ``other`` into these totals (peaks take the maximum)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(mine, theirs) if f.name.endswith("peak_bytes") else mine + theirs)
