"""Owns calibration: learning the cost parameters from measured steps, and deciding when the model has drifted.

A :class:`Calibrator` starts from some :class:`~.perf_model.CostParams` (the reference host's starting values
or a user's), and after every measured optimizer step folds the observed rates into them with an exponential
moving average. Parameters named in ``overrides`` are pinned and never change. It also keeps the history of
(predicted, measured) step times, so the caller can tell when predictions have drifted and re-plan.
:func:`probe_plans` gives the two plans of ``auto``'s start-up measurement: the host lane alone, then a mixed plan.

Pure Python: no torch.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .perf_model import CostParams
from .plan import Lane, Plan, _check_buffers, even_device_lanes


@dataclass(frozen=True)
class StepMeasurement:
    """What one rank measured during one optimizer step (all times in seconds, busy = sum of activity times)."""

    host_params: int
    """Parameters updated by CPU Adam on the host lane of this rank."""
    host_busy_s: float
    """Time spent in CPU Adam on the host lane."""
    host_overlapped: bool
    """Whether the device lane ran (DMA active) while the host lane computed."""
    device_params: int
    """Parameters updated by the device lane."""
    h2d_bytes: int
    """Bytes copied host to device: prefetches and host-lane param uploads."""
    h2d_busy_s: float
    """Time the H2D copies took."""
    d2h_bytes: int
    """Bytes copied device to host: flushes."""
    d2h_busy_s: float
    """Time the D2H copies took."""
    adam_busy_s: float
    """Time of the fused Adam on the GPU, launch overheads included."""
    predicted_s: float
    """Step time the model predicted for the plan in use."""
    measured_s: float
    """Step time measured."""
    device_subgroups: int = 0
    """Device-lane subgroups in the step (their launch overhead is taken out of the GPU Adam rate)."""
    lead_s: float = 0.0
    """Time from the dispatch, where the device lane's first prefetches were issued, to the start of the step
    (0 when none was issued before the step)."""


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


class Calibrator:
    """Exponential moving average of the cost parameters over measured steps, plus drift tracking.

    Update rules, each applied only when its inputs are positive and the parameter is not overridden
    (``ema(x, obs) = (1 - alpha) * x + alpha * obs``, except that the first observation of a parameter replaces its
    starting value: the starting values describe another machine, and averaging the first measurement with them
    left ``auto``'s first plan chosen on 30% of what was measured and 70% of the reference host):

    * host rate, ``obs = host_params / host_busy_s * ranks_per_host``: a non-overlapped step updates
      ``cpu_adam_params_per_s``. Until one has been seen (and unless ``cpu_adam_params_per_s`` is overridden), an
      overlapped step updates ``cpu_adam_params_per_s`` toward ``obs / cpu_contention``, keeping the starting
      contention: from contended steps alone the two factors cannot be told apart, and fitting only the contention
      left the uncontended rate (the host-only plan's prediction) at the reference host's value. Afterwards an
      overlapped step updates ``cpu_contention`` toward ``obs / cpu_adam_params_per_s``; when that ratio exceeds 1,
      or ``cpu_contention`` is overridden, ``cpu_contention`` moves toward 1 (unless overridden) and
      ``cpu_adam_params_per_s`` toward ``obs / cpu_contention``. ``auto``'s start-up probe (:func:`probe_plans`)
      runs the host lane alone first, so that both factors are measured;
    * PCIe, ``obs = bytes / busy_s`` per direction: in a step with a device lane, when the duplex cap is active,
      ``duplex_bytes_per_s`` moves toward the sum of both directions and the split of ``h2d_bytes_per_s +
      d2h_bytes_per_s`` between them toward the observed split (their sum kept; not when either is overridden),
      else ``h2d_bytes_per_s`` and ``d2h_bytes_per_s`` move toward their own observation; in a host-only step
      ``h2d_bytes_per_s`` moves toward the upload rate;
    * GPU, ``obs = device_params / (adam_busy_s - device_subgroups * launch_overhead_s)``: ``gpu_adam_params_per_s``;
    * head start, ``obs = lead_s`` of a step whose first prefetches were issued at dispatch: ``dispatch_lead_s``.
    """

    def __init__(
        self,
        params: CostParams,
        alpha: float = 0.3,
        drift_tolerance: float = 0.10,
        overrides: dict[str, float] | None = None,
        history_size: int = 1000,
    ) -> None:
        if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise ValueError(f"alpha: {alpha!r} is outside (0, 1]; set alpha to the weight of each new measurement")
        if not isinstance(drift_tolerance, (int, float)) or not drift_tolerance > 0:
            raise ValueError(
                f"drift_tolerance: {drift_tolerance!r}; set drift_tolerance to a relative error > 0, e.g. 0.10"
            )
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise ValueError(f"history_size: {history_size!r}; set history_size to an integer >= 1")
        self.alpha = float(alpha)
        """Weight of each new observation in the moving average."""
        self.drift_tolerance = float(drift_tolerance)
        """Relative error of a prediction above which it counts as drifted."""
        self.overrides: dict[str, float] = dict(overrides or {})
        """Pinned parameters: applied once, never updated."""
        self._params = params.with_values(self.overrides, key="overrides")
        self._history: deque[tuple[float, float]] = deque(maxlen=history_size)
        self._observations = 0
        self._host_alone_seen = False
        self._seen: set[str] = set()  # quantities observed at least once (their next observation is averaged)

    @property
    def params(self) -> CostParams:
        """The current cost parameters, overrides applied."""
        return self._params

    @property
    def history(self) -> tuple[tuple[float, float], ...]:
        """(predicted_s, measured_s) of the most recent observed steps, oldest first."""
        return tuple(self._history)

    @property
    def observations(self) -> int:
        """Number of steps observed so far."""
        return self._observations

    def _weight(self, quantity: str) -> float:
        """Weight of a new observation of ``quantity``: 1 the first time (it replaces the start value), else alpha."""
        weight = self.alpha if quantity in self._seen else 1.0
        self._seen.add(quantity)
        return weight

    def _ema(self, name: str, observed: float, quantity: str | None = None) -> None:
        """Move ``name`` toward ``observed``; ``quantity`` names what was measured when that differs from ``name``
        (the CPU Adam rate measured alone is a different measurement from one inferred from contended steps)."""
        if name in self.overrides or not _positive(observed):
            return
        old = getattr(self._params, name)
        weight = self._weight(quantity or name)
        self._params = replace(self._params, **{name: (1 - weight) * old + weight * observed})

    def observe(self, measurement: StepMeasurement) -> CostParams:
        """Fold one measured step into the parameters; returns the updated parameters."""
        m = measurement
        self._observations += 1
        if m.host_params > 0 and _positive(m.host_busy_s):
            self._observe_host(m.host_params / m.host_busy_s * self._params.ranks_per_host, m.host_overlapped)
        h2d = m.h2d_bytes / m.h2d_busy_s if m.h2d_bytes > 0 and _positive(m.h2d_busy_s) else None
        d2h = m.d2h_bytes / m.d2h_busy_s if m.d2h_bytes > 0 and _positive(m.d2h_busy_s) else None
        if m.device_params > 0:
            if h2d is not None and d2h is not None:
                if self._params.duplex_scale() < 1:  # the model caps the sum, so the sum is what we learn ...
                    self._ema("duplex_bytes_per_s", h2d + d2h)
                    self._split_directions(h2d / (h2d + d2h))  # ... and how the two directions share it
                else:
                    self._ema("h2d_bytes_per_s", h2d)
                    self._ema("d2h_bytes_per_s", d2h)
            if _positive(m.adam_busy_s):
                compute_s = m.adam_busy_s - m.device_subgroups * self._params.launch_overhead_s
                if compute_s > 0:
                    self._ema("gpu_adam_params_per_s", m.device_params / compute_s)
        elif h2d is not None:
            self._ema("h2d_bytes_per_s", h2d)
        self._ema("dispatch_lead_s", m.lead_s)  # only steps with early prefetches measure it (0 is skipped)
        if _positive(m.predicted_s) and _positive(m.measured_s):
            self._history.append((float(m.predicted_s), float(m.measured_s)))
        return self._params

    def _split_directions(self, h2d_share: float) -> None:
        """Move the H2D share of ``h2d_bytes_per_s + d2h_bytes_per_s`` toward ``h2d_share``, keeping their sum.

        Under the duplex cap the model runs each direction at its own rate times the same factor, so the share of
        the cap each direction gets is its share of that sum. A GPU host was measured to split the cap unevenly
        (H2D ~42 GB/s, D2H ~50 GB/s), and an H2D-bound device lane was then predicted ~9% short. The sum, and so
        the duplex factor, is unchanged; neither rate moves if either is overridden.
        """
        if "h2d_bytes_per_s" in self.overrides or "d2h_bytes_per_s" in self.overrides:
            return
        h2d, d2h = self._params.h2d_bytes_per_s, self._params.d2h_bytes_per_s
        total = h2d + d2h
        weight = self._weight("h2d_share")
        share = (1 - weight) * (h2d / total) + weight * h2d_share
        self._params = replace(self._params, h2d_bytes_per_s=total * share, d2h_bytes_per_s=total * (1 - share))

    def _observe_host(self, observed: float, overlapped: bool) -> None:
        if not overlapped:
            self._host_alone_seen = True
            self._ema("cpu_adam_params_per_s", observed, quantity="cpu_adam_alone")
            return
        if not self._host_alone_seen and "cpu_adam_params_per_s" not in self.overrides:
            # contended steps only so far: keep the starting contention, fit the rate (see the class docstring)
            self._ema("cpu_adam_params_per_s", observed / self._params.cpu_contention)
            return
        ratio = observed / self._params.cpu_adam_params_per_s
        if "cpu_contention" not in self.overrides and ratio <= 1:
            self._ema("cpu_contention", ratio)
            return
        # contention alone cannot explain it: it is pinned, or the host ran faster than its uncontended rate
        self._ema("cpu_contention", 1.0)
        self._ema("cpu_adam_params_per_s", observed / self._params.cpu_contention, quantity="cpu_adam_alone")

    def state_dict(self) -> dict[str, Any]:
        """What the calibration learnt, JSON-serialisable, to resume it in another process (:meth:`load_state_dict`)."""
        return {"params": self._params.to_json(), "history": [list(pair) for pair in self._history],
                "observations": self._observations, "host_alone_seen": self._host_alone_seen,
                "seen": sorted(self._seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output; this calibrator's overrides still win over the saved values."""
        self._params = CostParams().with_values(state["params"], key="calibration state").with_values(
            self.overrides, key="overrides")
        self._history.clear()
        self._history.extend((float(p), float(m)) for p, m in state["history"])
        self._observations = int(state["observations"])
        self._host_alone_seen = bool(state["host_alone_seen"])
        self._seen = set(state["seen"])

    def drifted(self, predicted_s: float, measured_s: float) -> bool:
        """Whether ``|predicted - measured| / measured`` exceeds the drift tolerance."""
        if not _positive(measured_s):
            raise ValueError(f"measured_s: {measured_s!r}; a measured step time must be > 0 seconds")
        return abs(predicted_s - measured_s) / measured_s > self.drift_tolerance

    def relative_errors(self) -> tuple[float, ...]:
        """``|predicted - measured| / measured`` of each step in the history, oldest first."""
        return tuple(abs(p - m) / m for p, m in self._history)

    def median_relative_error(self) -> float | None:
        """Median relative error over the history; None before any step was observed."""
        errors = self.relative_errors()
        return statistics.median(errors) if errors else None

    def should_replan(self, patience: int = 3) -> bool:
        """Whether the last ``patience`` observed steps all drifted (one outlier step does not trigger a re-plan)."""
        if patience < 1:
            raise ValueError(f"patience: {patience!r}; set patience to an integer >= 1")
        recent = list(self._history)[-patience:]
        return len(recent) == patience and all(self.drifted(p, m) for p, m in recent)


def probe_plan(sizes: Sequence[int], buffers: int = 2) -> Plan:
    """Start-up probe: half the subgroups (rounded down) on the device lane, spread evenly, so both lanes run."""
    buffers = _check_buffers(buffers)
    return Plan(lanes=even_device_lanes(sizes, len(sizes) // 2), buffers=buffers, source="probe")


def probe_plans(sizes: Sequence[int], buffers: int = 2) -> tuple[Plan, Plan]:
    """``auto``'s start-up probe, one update phase each: the host lane alone, then :func:`probe_plan`.

    Mixed plans alone cannot tell the CPU Adam rate from its slowdown while DMA runs (their product is all they
    measure), and the host-only plan's prediction depends on the rate alone: calibrated from mixed plans only, a host
    whose DMA barely slows CPU Adam keeps the starting contention and has the host-only plan predicted about 30%
    short. The host-only update measures the rate (and the upload bandwidth), the mixed one the contention, PCIe and
    GPU.
    """
    mixed = probe_plan(sizes, buffers)
    return Plan(lanes=tuple(Lane.HOST for _ in mixed.lanes), buffers=mixed.buffers, source="probe"), mixed
