"""Owns the series a worker records per iteration and their summary statistics: median and spread (min, p25, p75,
max), pure Python.

Medians, not means: one iteration disturbed by the host should not move a headline figure. Percentiles interpolate
linearly between order statistics (numpy's default; ``statistics.quantiles``' inclusive method).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Phases timed in every synchronised iteration, in milliseconds.
PHASES = ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")
#: Per synchronised iteration and phase (fwd, bwd, step): the CPU ms of the threads other than the training thread,
#: and the training thread's involuntary context switches.
HOST_KEYS = tuple(f"{phase}_{kind}" for phase in ("fwd", "bwd", "step") for kind in ("other_cpu_ms", "preempted"))
#: Per synchronised iteration: each phase's peak allocated GPU GiB (the step's from the backward's end to the
#: iteration's end; GPU only).
PHASE_PEAKS = tuple(f"{phase}_peak_gpu_gib" for phase in ("fwd", "bwd", "step"))


@dataclass(frozen=True)
class Spread:
    """Order statistics of one measured quantity: how many samples, the smallest, the quartiles, the largest."""

    n: int
    min: float
    p25: float
    median: float
    p75: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` as floats (None, NaN and anything else left out)."""
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def spread(values: Sequence[float | None]) -> Spread | None:
    """The spread of the finite ``values``; None when there are none."""
    ordered = sorted(finite(values))
    if not ordered:
        return None
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return Spread(len(ordered), ordered[0], *quartiles, ordered[-1])


def median(values: Sequence[float | None]) -> float | None:
    """The median of the finite ``values``; None when there are none."""
    summary = spread(values)
    return None if summary is None else summary.median
