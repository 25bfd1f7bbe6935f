"""Owns the summary statistics of measured iterations: median and spread (min, p25, p75, max), pure Python.

Medians, not means: one iteration disturbed by the host should not move a headline figure. Percentiles interpolate
linearly between order statistics (numpy's default; ``statistics.quantiles``' inclusive method).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


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


def spread(values: Sequence[float | None]) -> Spread | None:
    """The spread of the finite ``values``; None when there are none."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not finite:
        return None
    quartiles = statistics.quantiles(finite, n=4, method="inclusive") if len(finite) > 1 else finite * 3
    return Spread(len(finite), finite[0], *quartiles, finite[-1])


def median(values: Sequence[float | None]) -> float | None:
    """The median of the finite ``values``; None when there are none."""
    summary = spread(values)
    return None if summary is None else summary.median
