"""Owns chart.png of a comparison: the median fwd, bwd and step per configuration stacked (the median synchronised and
end-to-end iterations marked) beside its peak GPU memory and the host's memory in use; and what every study's chart
shares (matplotlib's Agg backend, the title, saving). Charts draw their JSON and compute nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLOURS = {"fwd_ms": "#4c72b0", "bwd_ms": "#dd8452", "step_ms": "#55a868"}


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
    times.set(ylabel="median time per iteration (ms)", title="fwd / bwd / step (synchronised iterations)")
    times.set_xticks(positions, labels, rotation=30, ha="right")
    times.legend(loc="upper center", ncols=2, fontsize="small", framealpha=0.8)
    times.grid(axis="y", alpha=0.3)

    for offset, key, colour, name in ((-0.2, "peak_gpu_gib", "#8172b3", "peak GPU memory (allocated)"),
                                      (0.2, "host_in_use_gib", "#937860", "host memory in use")):
        values = [r.get(key) or 0.0 for r in results]
        bars = memory.bar([x + offset for x in positions], values, width=0.38, color=colour, label=name)
        memory.bar_label(bars, labels=[f"{v:.1f}" if v else "" for v in values], fontsize="x-small", padding=2)
    total = doc.get("hardware", {}).get("gpu_memory_gib")
    memory.set(ylabel="GiB", title="Peak memory" + (f" (GPU: {total:.0f} GiB)" if total else ""))
    memory.legend(loc="best", fontsize="small", framealpha=0.8)
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
