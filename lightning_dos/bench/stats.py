"""Owns the summary statistics of measured iterations: median and spread (min, p25, p75, max), pure Python.

Medians, not means: one iteration disturbed by the host should not move a headline figure. Percentiles interpolate
linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """Order statistics of one measured quantity."""

    n: int
    """Number of samples."""
    min: float
    """Smallest sample."""
    p25: float
    """25th percentile."""
    median: float
    """50th percentile, the headline value."""
    p75: float
    """75th percentile."""
    max: float
    """Largest sample."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values, interpolating linearly."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return float(sorted_values[low] * (1.0 - weight) + sorted_values[high] * weight)


def spread(values: Sequence[float]) -> Spread | None:
    """The spread of the finite ``values``; None when there are none."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not finite:
        return None
    return Spread(
        n=len(finite),
        min=finite[0],
        p25=percentile(finite, 25),
        median=percentile(finite, 50),
        p75=percentile(finite, 75),
        max=finite[-1],
    )


def median(values: Sequence[float]) -> float | None:
    """The median of the finite ``values``; None when there are none."""
    summary = spread(values)
    return None if summary is None else summary.median
