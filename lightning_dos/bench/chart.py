"""Owns the charts: chart.png, iteration_timeline.png and rank_timelines.png of a comparison, sweep.png of a sweep.

chart.png stacks the median fwd, bwd and step per configuration (the median synchronised and end-to-end iterations
marked) beside the peak GPU memory (host memory without a GPU); iteration_timeline.png puts every configuration's last
synchronised iteration, with DOS's update lanes, on one time axis; rank_timelines.png does so for every rank of DOS
``auto`` at the largest device count; sweep.png plots each budget's median update against the device fraction, the
predictions dashed, ``auto`` as a line. They draw their JSON and compute nothing; matplotlib's Agg backend.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLOURS = {"fwd_ms": "#4c72b0", "bwd_ms": "#dd8452", "step_ms": "#55a868"}
#: Draw the GPU's capacity as a line only when the tallest bar reaches this share of it (else it flattens the bars).
CAPACITY_LINE_SHARE = 0.25
#: Plan kinds drawn as the line of fraction plans in sweep.png.
FRACTION_KINDS = ("fraction", "host", "device")


def render(doc: dict[str, Any], path: str | Path) -> Path:
    """Draw the chart of a results.json document to ``path`` (PNG) and return the path."""
    results = doc["results"]
    labels = [r["label"] for r in results]
    positions = list(range(len(results)))
    width = max(8.0, 1.1 * len(results) + 4.0)
    fig, (times, memory) = plt.subplots(1, 2, figsize=(width, 5.0), gridspec_kw={"width_ratios": [3, 2]})

    bottoms = [0.0] * len(results)
    for phase, colour in PHASE_COLOURS.items():
        heights = [r.get(phase) or 0.0 for r in results]
        times.bar(positions, heights, bottom=bottoms, color=colour, label=phase.removesuffix("_ms"), width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    iteration = [r.get("iteration_ms") for r in results]
    marked = [(x, y) for x, y in zip(positions, iteration) if y is not None]
    if marked:
        times.scatter([x for x, _ in marked], [y for _, y in marked], marker="_", s=600, color="black", zorder=3,
                      label="iteration, synchronised (median)")
    e2e = [(x + 0.38, r["e2e_iteration_ms"]) for x, r in zip(positions, results) if r.get("e2e_iteration_ms")]
    if e2e:
        times.scatter([x for x, _ in e2e], [y for _, y in e2e], marker="D", s=30, color="#c44e52", zorder=3,
                      label="end to end, unsynchronised (median)")
    top = max([b for b in bottoms] + [y for _, y in marked] + [y for _, y in e2e] + [1.0])
    _mark_unmeasured(times, results, top * 0.02)
    times.set_ylim(0, top * 1.5)  # headroom: the legend above the tallest bar or marker
    times.set_ylabel("median time per iteration (ms)")
    times.set_title("fwd / bwd / step (synchronised iterations)")
    times.set_xticks(positions, labels, rotation=30, ha="right")
    times.legend(loc="upper center", ncols=2, fontsize="small", framealpha=0.8)
    times.grid(axis="y", alpha=0.3)

    if any(r.get("peak_gpu_gib") is not None for r in results):
        reserved = [r.get("peak_gpu_reserved_gib") or 0.0 for r in results]
        allocated = [r.get("peak_gpu_gib") or 0.0 for r in results]
        memory.bar(positions, reserved, width=0.6, color="#cccccc", label="reserved")
        bars = memory.bar(positions, allocated, width=0.4, color="#8172b3", label="allocated")
        memory.bar_label(bars, labels=[f"{a:.1f}" if a else "" for a in allocated], fontsize="x-small", padding=2)
        memory.set_ylabel("peak GPU memory (GiB)")
        title = "Peak GPU memory"
        total = doc.get("hardware", {}).get("gpu_memory_gib")
        if total and max(reserved) >= CAPACITY_LINE_SHARE * total:
            memory.axhline(total, color="#c44e52", linestyle="--", linewidth=1, label="GPU memory")
        elif total:
            title += f" (of {total:.0f} GiB)"
        memory.set_title(title)
        memory.legend(loc="best", fontsize="small", framealpha=0.8)
    else:
        host = [r.get("peak_host_gib") or 0.0 for r in results]
        memory.bar(positions, host, width=0.6, color="#937860")
        memory.set_ylabel("peak host RSS (GiB)")
        memory.set_title("Peak host memory (no GPU)")
    _mark_unmeasured(memory, results, 0)
    memory.set_xticks(positions, labels, rotation=30, ha="right")
    memory.grid(axis="y", alpha=0.3)

    fig.suptitle(workload_title(doc))
    return save(fig, path)


def _mark_unmeasured(ax: Any, results: list[dict[str, Any]], y: float) -> None:
    """The status of every configuration that measured no iteration, written upwards from ``y`` at its bar."""
    for x, r in enumerate(results):
        if r["status"] != "ok" and r.get("iteration_ms") is None:
            ax.text(x, y, r["status"], ha="center", va="bottom", rotation=90, color="#c44e52")


def workload_title(doc: dict[str, Any]) -> str:
    """Model, batch, precision, device and date of a bench or sweep document, for a figure's title."""
    cfg, hw = doc["config"], doc.get("hardware", {})
    return (f"{cfg['model']}, seq {cfg['seq_len']} x micro-batch {cfg['micro_batch']}, {cfg['precision']} "
            f"on {hw.get('gpu_name') or 'CPU'} ({doc['date'][:10]})")


def save(fig: Any, path: str | Path) -> Path:
    """Lay out, write (PNG at 120 dpi) and close ``fig``; the path written."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


#: The phase rows of a configuration's timeline: label, the marks that bound it (ms since the iteration began; the
#: start is 0), colour.
TIMELINE_PHASES = (("forward", None, "backward_start", PHASE_COLOURS["fwd_ms"]),
                   ("backward", "backward_start", "backward_end", PHASE_COLOURS["bwd_ms"]),
                   ("step", "step_start", "end", PHASE_COLOURS["step_ms"]))


#: Part the update phase's subgroups with white edges only when it takes at least this share of the iteration.
SEPARATE_SUBGROUPS_SHARE = 0.05


def _timeline_panel(ax: Any, result: dict[str, Any], offset_ms: float = 0.0) -> None:
    """``result``'s iteration timeline in ``ax``, its time axis shifted by ``offset_ms``."""
    from lightning_dos.telemetry.records import ROWS, lane_bars

    timeline = result["iteration_timeline"]
    marks = {"start": 0.0, **{k: v for k, v in timeline["marks_ms"].items() if v is not None}}
    marks = {k: v + offset_ms for k, v in marks.items()}
    labels = []
    for row, (label, start, end, colour) in enumerate(TIMELINE_PHASES):
        begin, finish = marks.get(start or "start"), marks.get(end)
        if begin is not None and finish is not None:
            ax.broken_barh([(begin, finish - begin)], (row - 0.4, 0.8), facecolors=colour)
        labels.append(label)
    title = f"{result['label']}: iteration {timeline['iteration']}"
    if marks.get("end") is not None:
        title += f", {marks['end'] - offset_ms:.1f} ms (synchronised)"
    update = timeline.get("update")
    if update is not None and update.get("start_ms") is not None:
        first = len(labels)
        start = update["start_ms"] + offset_ms
        # white edges part the subgroups, but would hide an update phase too short to show at this scale
        span = max(marks.get("end", 0.0) - offset_ms, 1e-9)
        edge = 0.5 if update["total_ms"] >= SEPARATE_SUBGROUPS_SHARE * span else 0.0
        for row, ((_, _, label, colour), bars) in enumerate(zip(ROWS, lane_bars(update["events"], scale=1.0,
                                                                                offset=start))):
            if bars:
                ax.broken_barh(bars, (first + row - 0.4, 0.8), facecolors=colour, edgecolor="white", linewidth=edge)
            labels.append(label)
        ax.axvline(start, color="grey", linestyle=":", linewidth=1)
        title += (f"; update phase {update['total_ms']:.1f} ms from {start:.1f} ms, "
                  f"{update['device_fraction']:.0%} of the parameters on the device lane")
    ax.set_yticks(range(len(labels)), labels, fontsize="small")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_title(title, fontsize="small", loc="left")
    ax.grid(axis="x", alpha=0.3)


def timeline_rows(result: dict[str, Any]) -> int:
    """Rows of a configuration's timeline panel: fwd, bwd, step, and the update phase's lane stages for DOS."""
    from lightning_dos.telemetry.records import ROWS

    update = (result.get("iteration_timeline") or {}).get("update")
    return len(TIMELINE_PHASES) + (len(ROWS) if update is not None and update.get("start_ms") is not None else 0)


def _stacked(panels: list[tuple[dict[str, Any], float]], xlabel: str, title: str, path: str | Path) -> Path:
    """``panels`` (a result with a timeline, its offset in ms), one above the other on one time axis."""
    heights = [timeline_rows(result) for result, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights},
                             figsize=(11.0, 1.2 + 0.32 * sum(heights) + 0.45 * len(panels)))
    for ax, (result, offset) in zip(axes[:, 0], panels):
        _timeline_panel(ax, result, offset_ms=offset)
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title, fontsize="medium")
    return save(fig, path)


def render_timeline(doc: dict[str, Any], path: str | Path) -> Path | None:
    """iteration_timeline.png of a results.json; None (nothing written) when no configuration recorded a timeline."""
    results = [r for r in doc["results"] if r.get("iteration_timeline")]
    if not results:
        return None
    return _stacked([(r, 0.0) for r in results], "ms since the iteration began (last synchronised iteration of each "
                    "configuration)", f"One iteration on one time axis: {workload_title(doc)}", path)


def rank_timeline_row(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The row rank_timelines.png draws: DOS ``auto`` at the largest device count above 1 that completed with every
    rank's timeline; None when there is none."""
    rows = [r for r in doc["results"] if r.get("strategy") == "deep_optimizer_states"
            and str(r.get("plan")).lower() == "auto" and r.get("status") == "ok" and (r.get("devices") or 1) > 1
            and r.get("per_rank") and all(rank.get("iteration_timeline") for rank in r["per_rank"])]
    return max(rows, key=lambda r: r["devices"], default=None)


def render_rank_timelines(doc: dict[str, Any], path: str | Path) -> Path | None:
    """rank_timelines.png: every rank of :func:`rank_timeline_row` on one time axis (the ranks share the host's
    clock); None (nothing written) without such a row."""
    row = rank_timeline_row(doc)
    if row is None:
        return None
    starts = [rank["iteration_timeline"].get("started_s") for rank in row["per_rank"]]
    shared = all(start is not None for start in starts)  # older results: each rank from its own start
    panels = [({"label": f"{row['label']} rank {rank['rank']}", "iteration_timeline": rank["iteration_timeline"]},
               (start - min(starts)) * 1e3 if shared else 0.0) for rank, start in zip(row["per_rank"], starts)]
    return _stacked(panels, "ms since the first rank began the iteration (each rank's last synchronised iteration)"
                    if shared else "ms since each rank began the iteration",
                    f"Every rank of {row['label']} on one time axis: {workload_title(doc)}", path)


# ------------------------------------------------------------------ plan sweep

def _panel(ax: Any, budget: dict[str, Any]) -> None:
    plans = [p for p in budget["plans"] if p["update_ms"] is not None and p["device_fraction"] is not None]
    line = sorted((p for p in plans if p["kind"] in FRACTION_KINDS), key=lambda p: (p["device_fraction"], p["plan"]))
    if line:
        xs = [p["device_fraction"] for p in line]
        ax.plot(xs, [p["update_ms"] for p in line], marker="o", color="#4c72b0", label="fraction plans (measured)")
        predicted = [(p["device_fraction"], p["predicted_ms"]) for p in line if p["predicted_ms"] is not None]
        if predicted:
            ax.plot([x for x, _ in predicted], [y for _, y in predicted], linestyle="--", marker=".",
                    color="#4c72b0", alpha=0.7, label="fraction plans (predicted)")
    strides = [p for p in plans if p["kind"] == "stride"]
    if strides:
        ax.scatter([p["device_fraction"] for p in strides], [p["update_ms"] for p in strides], marker="^", s=60,
                   color="#dd8452", zorder=3, label="stride:K (measured)")
        ax.scatter([p["device_fraction"] for p in strides if p["predicted_ms"] is not None],
                   [p["predicted_ms"] for p in strides if p["predicted_ms"] is not None], marker="^", s=60,
                   facecolors="none", edgecolors="#dd8452", zorder=3, label="stride:K (predicted)")
        for p in strides:
            ax.annotate(p["plan"].replace("stride:", "s"), (p["device_fraction"], p["update_ms"]),
                        textcoords="offset points", xytext=(4, 4), fontsize="x-small", color="#dd8452")
    others = [p for p in plans if p["kind"] == "list"]
    if others:
        ax.scatter([p["device_fraction"] for p in others], [p["update_ms"] for p in others], marker="s",
                   color="#8172b3", zorder=3, label="lane lists (measured)")
    auto = budget["auto"]
    if auto["update_ms"] is not None:
        ax.axhline(auto["update_ms"], color="#55a868", linewidth=1.5,
                   label=f"auto {auto['update_ms']:.1f} ms" + (f" (device fraction {auto['device_fraction']:.2f})"
                                                                 if auto["device_fraction"] is not None else ""))
        if auto["device_fraction"] is not None:
            ax.scatter([auto["device_fraction"]], [auto["update_ms"]], marker="*", s=160, color="#55a868", zorder=4)
    missing = [f"{p['plan']}: {p['status']}" for p in budget["plans"] if p["status"] != "ok"]
    if auto["status"] != "ok":
        missing.append(f"auto: {auto['status']}")
    if missing:
        ax.text(0.01, 0.01, "not measured: " + ", ".join(missing), transform=ax.transAxes, fontsize="x-small",
                color="#c44e52", va="bottom", wrap=True)
    ax.set_title(f"budget {budget['budget']['label']}")
    ax.set_xlabel("device-lane fraction of the parameters (as run)")
    ax.set_ylabel("update phase, median (ms)")
    ax.set_xlim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="x-small", framealpha=0.8)


#: Characters of the figure title per inch of figure width (matplotlib's default 12 pt title font).
TITLE_CHARS_PER_INCH = 9


def render_sweep(doc: dict[str, Any], path: str | Path) -> Path:
    """Draw sweep.png of a sweep.json document to ``path`` and return the path."""
    budgets = doc["budgets"]
    panels = max(1, len(budgets))
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.0), squeeze=False)
    for ax, budget in zip(axes[0], budgets):
        _panel(ax, budget)
    if not budgets:
        axes[0][0].text(0.5, 0.5, "no budget measured", ha="center", va="center")
    # wrapped to the figure's width: one panel is narrower than the title (it was cut off at both ends)
    title = f"plan sweep: {workload_title(doc)}"
    fig.suptitle(textwrap.fill(title, width=int(TITLE_CHARS_PER_INCH * fig.get_figwidth())))
    return save(fig, path)
