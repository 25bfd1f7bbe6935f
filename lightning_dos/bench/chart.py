"""Owns the charts of both modes: chart.png of a strategy comparison, sweep.png of a plan sweep.

**chart.png**: left, the median fwd, bwd and step times stacked per configuration, with the median iteration time
marked (medians do not add up exactly, and the gap between backward and the optimizer step is in none of the
three); right, peak GPU memory (allocated, with reserved behind it), or peak host memory without a GPU.
Configurations that did not complete are shown by their status.

**sweep.png**: one panel per budget: the fraction plans' measured median update time against the device fraction
they ran with (a line) and the manager's predictions for them (dashed), the stride plans as separate markers, and
``auto`` as a horizontal line.

Both draw their JSON document and compute nothing new; matplotlib's Agg backend, so they render without a display.
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
PHASE_NAMES = {"fwd_ms": "fwd", "bwd_ms": "bwd", "step_ms": "step"}
#: Plan kinds drawn as the line of fraction plans in sweep.png.
FRACTION_KINDS = ("fraction", "host", "device")


def _has_gpu_memory(results: list[dict[str, Any]]) -> bool:
    return any(r.get("peak_gpu_gib") is not None for r in results)


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
        times.bar(positions, heights, bottom=bottoms, color=colour, label=PHASE_NAMES[phase], width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    iteration = [r.get("iteration_ms") for r in results]
    marked = [(x, y) for x, y in zip(positions, iteration) if y is not None]
    if marked:
        times.scatter([x for x, _ in marked], [y for _, y in marked], marker="_", s=600, color="black", zorder=3,
                      label="iteration (median)")
    top = max([b for b in bottoms] + [y for _, y in marked] + [1.0])
    for x, r in zip(positions, results):
        if r["status"] != "ok" and r.get("iteration_ms") is None:
            times.text(x, top * 0.02, r["status"], ha="center", va="bottom", rotation=90, color="#c44e52")
    times.set_ylabel("median time per iteration (ms)")
    times.set_title("fwd / bwd / step (warm-up excluded)")
    times.set_xticks(positions, labels, rotation=30, ha="right")
    times.legend(loc="best", fontsize="small", framealpha=0.8)
    times.grid(axis="y", alpha=0.3)

    if _has_gpu_memory(results):
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
    for x, r in zip(positions, results):
        if r["status"] != "ok" and r.get("iteration_ms") is None:
            memory.text(x, 0, r["status"], ha="center", va="bottom", rotation=90, color="#c44e52")
    memory.set_xticks(positions, labels, rotation=30, ha="right")
    memory.grid(axis="y", alpha=0.3)

    fig.suptitle(workload_title(doc))
    return save(fig, path)


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
