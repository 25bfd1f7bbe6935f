"""Owns the bench chart: stacked fwd / bwd / step bars per configuration, and peak memory beside them.

Left panel: the median fwd, bwd and step times stacked per configuration, with the median iteration time
marked (medians do not add up exactly, and the gap between backward and the optimizer step is in none of
the three). Right panel: peak GPU memory (allocated, with reserved behind it); without a GPU, peak host
memory instead. Configurations that did not complete are shown by their status. Matplotlib's Agg backend,
so it renders on a host without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLOURS = {"fwd_ms": "#4c72b0", "bwd_ms": "#dd8452", "step_ms": "#55a868"}
#: Draw the GPU's capacity as a line only when the tallest bar reaches this share of it (else it flattens the bars).
CAPACITY_LINE_SHARE = 0.25
PHASE_NAMES = {"fwd_ms": "fwd", "bwd_ms": "bwd", "step_ms": "step"}


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
