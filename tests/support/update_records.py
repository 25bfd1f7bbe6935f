"""What the ``dos/*`` keys of one update phase must say, from the manager's record of it (docs/telemetry.md)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_dos.planning.trials import TRIAL_SOURCE

GIB = 2**30


#: ``dos/*`` keys that describe the manager as a whole, not one update phase
MANAGER_KEYS = frozenset({"dos/resident_subgroups", "dos/resident_gib", "dos/host_state_gib",
                          "dos/median_prediction_error"})


def record_metrics(record: Any) -> dict[str, float]:
    """The ``dos/*`` values docs/telemetry.md defines for one update phase, read off its ``StepRecord``: every key
    but :data:`MANAGER_KEYS`, the rates only where the phase moved or computed anything."""
    t = record.timings
    out = {
        "dos/device_fraction": record.device_fraction,
        "dos/update_ms": t.total_s * 1e3,
        "dos/predicted_update_ms": record.predicted_s * 1e3,
        "dos/replanned": float(record.replanned),
        "dos/trial": float(record.plan.source == TRIAL_SOURCE),
        "dos/host_busy_ms": t.host_busy_s * 1e3,
        "dos/host_wait_ms": max(0.0, t.host_busy_s - t.host_compute_s) * 1e3,
        "dos/device_busy_ms": t.device_busy_s * 1e3,
        "dos/prefetch_busy_ms": t.prefetch_busy_s * 1e3,
        "dos/adam_busy_ms": t.adam_busy_s * 1e3,
        "dos/flush_busy_ms": t.flush_busy_s * 1e3,
        "dos/h2d_gb": (t.h2d_bytes + t.upload_bytes) / 1e9,
        "dos/d2h_gb": t.d2h_bytes / 1e9,
        "dos/demoted_subgroups": float(len(record.demoted)),
        "dos/device_buffer_gib": t.device_buffer_bytes / GIB,
        "dos/prefetched_ahead": float(t.prefetched_ahead),
        "dos/dispatch_lead_ms": t.lead_s * 1e3,
    }
    if t.host_compute_s > 0:
        out["dos/cpu_adam_gparam_s"] = t.host_params / t.host_compute_s / 1e9
    if record.free_bytes is not None:
        out["dos/free_device_gib"] = record.free_bytes / GIB
    if t.prefetch_busy_s + t.upload_busy_s > 0:
        out["dos/h2d_gb_per_s"] = (t.h2d_bytes + t.upload_bytes) / (t.prefetch_busy_s + t.upload_busy_s) / 1e9
    if t.flush_busy_s > 0:
        out["dos/d2h_gb_per_s"] = t.d2h_bytes / t.flush_busy_s / 1e9
    return out


def phase_keys(metrics: dict[str, float]) -> dict[str, float]:
    """The ``dos/*`` entries of a logged row that describe its update phase (:func:`record_metrics`' keys)."""
    return {key: value for key, value in metrics.items() if key.startswith("dos/") and key not in MANAGER_KEYS}


def logged(value: float) -> Any:
    """``value`` as a logger gets it: Lightning's ``log`` keeps it as a float32 tensor."""
    return pytest.approx(value, rel=1e-6, abs=1e-12)
