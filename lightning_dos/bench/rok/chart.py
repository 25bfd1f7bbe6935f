"""Owns rok.png and the ROK curve's byte formats: iteration time against peak activation memory, one point per
placement, and with a budget, beside it every search probe's peak against its micro-batch, the budget line, each
placement's largest fitting micro-batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_dos.bench.chart import plt, save, workload_title
from lightning_dos.bench.report import MISSING

UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))

#: One colour per placement, the same in both panels.
COLOURS = {"keep": "#4c72b0", "recompute": "#dd8452", "offload-host": "#55a868", "offload-nvme": "#c44e52"}
#: Marker, line style and label offset (points) per placement: the two offload placements often share a memory
#: figure, so their points, lines and labels must stay apart.
STYLES = {"keep": ("o", "-", (8, 6)), "recompute": ("s", "-", (8, 6)), "offload-host": ("^", "-", (-8, 6)),
          "offload-nvme": ("v", "--", (8, 6))}
DEFAULT_STYLE = ("o", "-", (8, 6))
#: Tick labels on the micro-batch axis closer than this (in log2 units) to the previous one are left out.
MIN_TICK_GAP = 0.3


def byte_unit(value: float) -> tuple[str, float]:
    """The unit that shows ``value`` bytes best (GiB, MiB, KiB or B) and its size."""
    return next(((unit, float(size)) for unit, size in UNITS if abs(value) >= size), ("B", 1.0))


def format_bytes(value: float | None) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``512 B``; ``–`` for None."""
    if value is None:
        return MISSING
    unit, size = byte_unit(value)
    if size == 1.0:
        return f"{value:.0f} B"
    return f"{value / size:.3g} {unit}" if abs(value) / size < 100 else f"{value / size:,.0f} {unit}"


def _align(offset: tuple[int, int]) -> str:
    """Labels offset to the left end at their point."""
    return "right" if offset[0] < 0 else "left"


def _ticks(values: set[int]) -> list[int]:
    """``values`` without those crowding the previous tick on a log2 axis."""
    import math

    kept: list[int] = []
    for value in sorted(values):
        if not kept or math.log2(value) - math.log2(kept[-1]) >= MIN_TICK_GAP:
            kept.append(value)
    return kept


def _curve(ax: Any, doc: dict[str, Any]) -> None:
    points = [p for p in doc["placements"] if p["status"] == "ok" and p.get("headline_ms") is not None
              and p.get("peak_activation_bytes") is not None]
    unit, size = byte_unit(max((p["peak_activation_bytes"] for p in points), default=0))
    for p in points:
        x, y = p["peak_activation_bytes"] / size, p["headline_ms"]
        colour = COLOURS.get(p["placement"], "black")
        marker, _, offset = STYLES.get(p["placement"], DEFAULT_STYLE)
        ax.scatter([x], [y], s=80, color=colour, marker=marker, zorder=3)
        label = p["placement"] + (f"\n{p['tokens_per_s']:,.0f} tok/s" if p.get("tokens_per_s") else "")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=offset, color=colour, fontsize="small",
                    ha=_align(offset))
    for p in doc["placements"]:
        if p not in points:
            ax.plot([], [], " ", label=f"{p['placement']}: {p['status']}")
    measures = "/".join(sorted({p["measure"] for p in points if p.get("measure")})) or "none"
    headline = points[0]["headline"] if points else "end to end"
    ax.set(xlabel=f"peak activation memory ({unit}; measure: {measures})",
           ylabel=f"iteration (ms, median, {headline})", title="ROK curve: time against activation memory")
    ax.set_xlim(left=0, right=max([p["peak_activation_bytes"] / size for p in points] + [1.0]) * 1.25)
    ax.set_ylim(bottom=0, top=max([p["headline_ms"] for p in points] + [1.0]) * 1.25)
    ax.grid(alpha=0.3)
    if len(points) < len(doc["placements"]):
        ax.legend(loc="lower right", fontsize="small")


def _budget(ax: Any, budget: dict[str, Any]) -> None:
    peaks = [p["peak_bytes"] for s in budget["searches"] for p in s["probes"] if p.get("peak_bytes") is not None]
    unit, size = byte_unit(max(peaks + [budget["budget_bytes"]]))
    top = max(peaks + [budget["budget_bytes"]]) / size * 1.15
    tried: set[int] = set()
    for s in budget["searches"]:
        colour = COLOURS.get(s["placement"], "black")
        marker, line, offset = STYLES.get(s["placement"], DEFAULT_STYLE)
        measured = sorted((p["micro_batch"], p["peak_bytes"] / size) for p in s["probes"] if p.get("peak_bytes"))
        tried.update(p["micro_batch"] for p in s["probes"])
        if measured:
            ax.plot([m for m, _ in measured], [v for _, v in measured], marker=marker, linestyle=line, color=colour,
                    label=s["placement"])
        oom = [p["micro_batch"] for p in s["probes"] if p["status"] == "oom"]
        if oom:
            ax.scatter(oom, [top] * len(oom), marker="x", color=colour, s=60, zorder=3)
        if s["largest_micro_batch"] and s.get("peak_bytes") is not None:
            best = (s["largest_micro_batch"], s["peak_bytes"] / size)
            ax.scatter([best[0]], [best[1]], marker="*", s=220, color=colour, zorder=4, edgecolors="black")
            if s.get("tokens_per_s"):
                ax.annotate(f"{s['largest_micro_batch']}: {s['tokens_per_s']:,.0f} tok/s", best,
                            textcoords="offset points", xytext=offset, color=colour, fontsize="small",
                            ha=_align(offset))
    ax.axhline(budget["budget_bytes"] / size, linestyle=":", color="black",
               label=f"budget {format_bytes(budget['budget_bytes'])}")
    ax.set_xscale("log", base=2)
    ticks = _ticks(tried)
    ax.set_xticks(ticks, [str(m) for m in ticks])
    ax.minorticks_off()
    ax.set_xlabel("micro-batch (log 2)")
    ax.set_ylabel(f"peak activation memory ({unit})")
    ax.set_ylim(0, top * 1.05)
    ax.set_title("largest micro-batch within the budget (star; x: out of memory)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")


def render(doc: dict[str, Any], path: str | Path) -> Path:
    """Draw rok.png of a rok.json document to ``path`` and return the path."""
    budget = doc.get("budget")
    panels = 2 if budget and budget.get("searches") else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.0), squeeze=False)
    _curve(axes[0][0], doc)
    if panels == 2:
        _budget(axes[0][1], budget)
    fig.suptitle(workload_title(doc) + f", {doc['rok']['strategy']}")
    return save(fig, path)
