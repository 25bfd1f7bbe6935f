"""Owns the search for the largest micro-batch that fits a memory budget (pure Python): from the placement's own,
double while it fits (up to ``max_micro_batch``), then bisect between the largest that fitted and the smallest that did
not (from 0 when the first does not fit). A probe that cannot tell (:class:`Probe` ``fits=None``) stops the search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SEARCH_STATUSES", "Probe", "search_micro_batch"]

#: How a search ended: the largest fitting micro-batch found; every micro-batch up to the cap fits; not even one
#: fits; a probe could not tell (the largest known to fit is a lower bound).
SEARCH_STATUSES = ("found", "capped", "none fits", "incomplete")


@dataclass
class Probe:
    """One micro-batch tried."""

    micro_batch: int
    fits: bool | None  # within the budget (and not out of memory); None: the run could not tell
    peak_bytes: int | None = None  # its peak activation memory, when it completed
    tokens_per_s: float | None = None
    status: str = "ok"  # the worker's: ok, oom, failed, timeout, skipped
    reason: str | None = None
    source: str = "probe"  # a run of its own, or "placement run" (the placement's, at the starting micro-batch)
    elapsed_s: float | None = None
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def search_micro_batch(start: int, probe: Callable[[int], Probe], max_micro_batch: int,
                       known: Probe | None = None) -> dict[str, Any]:
    """The largest micro-batch that fits, searched from ``start`` with ``probe`` (``known``: the answer already
    measured for one); ``status`` (:data:`SEARCH_STATUSES`), ``largest_micro_batch`` (0: none fits), its peak and
    tokens/s, ``reason`` and every probe in order."""
    if start < 1 or max_micro_batch < start:
        raise ValueError(f"micro-batch search: start {start} must be >= 1 and <= max_micro_batch {max_micro_batch}")
    probes: list[Probe] = []

    def ask(micro_batch: int) -> Probe:
        answer = known if known is not None and known.micro_batch == micro_batch else probe(micro_batch)
        probes.append(answer)
        return answer

    def done(status: str, best: Probe | None, reason: str | None = None) -> dict[str, Any]:
        return {"status": status, "largest_micro_batch": best.micro_batch if best else 0,
                "peak_bytes": best.peak_bytes if best else None, "tokens_per_s": best.tokens_per_s if best else None,
                "reason": reason, "probes": [p.to_dict() for p in probes]}

    def unknown(p: Probe, best: Probe | None) -> dict[str, Any]:
        return done("incomplete", best, f"micro-batch {p.micro_batch}: {p.status}: {p.reason}")

    first = ask(start)
    if first.fits is None:
        return unknown(first, None)
    fitting: Probe | None = first if first.fits else None
    too_big: Probe | None = None if first.fits else first
    while too_big is None:  # doubling
        assert fitting is not None
        if fitting.micro_batch >= max_micro_batch:
            return done("capped", fitting, f"every micro-batch up to --max-micro-batch {max_micro_batch} fits")
        p = ask(min(2 * fitting.micro_batch, max_micro_batch))
        if p.fits is None:
            return unknown(p, fitting)
        fitting, too_big = (p, None) if p.fits else (fitting, p)
    while too_big.micro_batch - (fitting.micro_batch if fitting else 0) > 1:  # bisection
        p = ask(((fitting.micro_batch if fitting else 0) + too_big.micro_batch) // 2)
        if p.fits is None:
            return unknown(p, fitting)
        fitting, too_big = (p, too_big) if p.fits else (fitting, p)
    if fitting is None:
        return done("none fits", None, "micro-batch 1 does not fit")
    return done("found", fitting)
