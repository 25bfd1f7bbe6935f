"""Owns what a person looks at: the lane timeline of an update phase and the plan table of a (re-)plan.

Built from the manager's :class:`~lightning_dos.update.manager.StepRecord` (measured spans of every stage of
every subgroup) and the performance model's prediction. Loggers (W&B images and tables, CSV) are fed by
``lightning_dos.telemetry.callbacks``; nothing here talks to a logger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_dos.planning.perf_model import CostParams, predict
from lightning_dos.planning.plan import Lane, Plan

#: timeline rows, top to bottom, with the color of their bars
ROWS = (
    ("host", "adam", "host lane: CPU Adam", "#4C72B0"),
    ("host", "upload", "host lane: param upload", "#8FAADC"),
    ("device", "prefetch", "device lane: prefetch", "#DD8452"),
    ("device", "adam", "device lane: Adam", "#C44E52"),
    ("device", "flush", "device lane: flush", "#55A868"),
)

PLAN_TABLE_COLUMNS = ["subgroup", "lane", "params", "predicted_start_ms", "predicted_end_ms"]


def plan_table_rows(plan: Plan, sizes: Sequence[int], params: CostParams) -> list[list[Any]]:
    """One row per subgroup: its lane, size and the predicted span of its update."""
    prediction = predict(plan, sizes, params)
    rows = []
    for event in sorted(prediction.events, key=lambda e: e.subgroup):
        rows.append(
            [event.subgroup, event.lane.value if isinstance(event.lane, Lane) else str(event.lane),
             int(sizes[event.subgroup]), round(event.start_s * 1e3, 3), round(event.end_s * 1e3, 3)]
        )
    return rows


def lane_bars(events: Sequence[dict[str, Any]], scale: float = 1e3,
              offset: float = 0.0) -> list[list[tuple[float, float]]]:
    """Per row of :data:`ROWS`, the ``(start, width)`` bars of every subgroup's stage in ``events``.

    ``events`` are ``LaneTimings.events`` (stage spans in seconds since the update phase began, as tuples or lists);
    each time is multiplied by ``scale`` (1e3: ms) and shifted by ``offset`` (in the scaled unit), e.g. to place the
    update phase within its iteration.
    """
    rows = []
    for lane, stage, _label, _color in ROWS:
        rows.append([(offset + e[stage][0] * scale, (e[stage][1] - e[stage][0]) * scale)
                     for e in events if e["lane"] == lane and stage in e])
    return rows


def timeline_figure(record: Any, title: str | None = None) -> Any:
    """A matplotlib figure of one update phase: one row per lane stage, one bar per subgroup."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    for row, ((_lane, _stage, _label, color), bars) in enumerate(zip(ROWS, lane_bars(record.timings.events))):
        if bars:
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(ROWS)), [label for *_, label, _ in ROWS])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the update phase began")
    t = record.timings
    ax.set_title(
        title
        or f"update {record.step}: {t.total_s * 1e3:.1f} ms measured, {record.predicted_s * 1e3:.1f} ms predicted; "
        f"{record.device_fraction:.0%} of params on the device lane"
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
