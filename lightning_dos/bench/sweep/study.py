"""Owns ``lightning-dos bench sweep``'s runs, one process per budget (:mod:`~lightning_dos.bench.sweep.config`), and
sweep.json, sweep.md and sweep.png, written after every budget.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from lightning_dos.bench.chart import plt, save, workload_title
from lightning_dos.bench.report import MISSING, Table, num, pct, ratio
from lightning_dos.bench.results import read_json
from lightning_dos.bench.runner import Runner
from lightning_dos.bench.sweep.config import PROGRESS_FILE, SweepSettings, resolve_budget
from lightning_dos.bench.sweep.results import summarize_budget, sweep_measurement

#: Plan kinds drawn as the line of fraction plans in sweep.png.
FRACTION_KINDS = ("fraction", "host", "device")


def with_progress(result: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A process result that lacks the sweep's records, completed from the worker's ``progress.json``."""
    progress = None if result.get("sweep") or result.get("status") == "ok" else read_json(run_dir / PROGRESS_FILE)
    return result if progress is None else {**result, "sweep": progress}


def run_sweep(runner: Runner, sweep: SweepSettings) -> dict[str, Any]:
    """Run the sweep's processes; write sweep.json, sweep.md and sweep.png after every one; return the JSON."""
    devices = runner.settings.devices[0]
    budgets = [resolve_budget(text, runner.model["params"], devices) for text in sweep.budgets]
    summaries: list[dict[str, Any]] = []
    runner.stage("sweep", "process", len(budgets))
    doc: dict[str, Any] = {}
    for budget in budgets:
        run_dir = runner.out_dir / "runs" / budget.name
        if not runner.resume:
            (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier run's, in the same --out
        result = runner.run(sweep.run(budget, runner.overrides, devices), run_dir,
                            complete=lambda result, run_dir=run_dir: with_progress(result, run_dir))
        summary = summarize_budget(budget, result, sweep)
        best = summary["best"] or {}
        runner.done(budget.label, result, fixed_plans=f"{summary['fixed']['plans_completed']}/{len(sweep.plans)}",
                    best=best and f"{best['plan']} {best['update_ms']:.1f} ms",
                    auto_ms=num(summary["auto"]["update_ms"]))
        summaries.append(summary)
        doc = runner.write("plan_sweep", sweep_measurement(sweep), ("sweep.json", "sweep.png", "sweep.md"), render,
                           tables, sweep=sweep.to_dict(), budgets=summaries,
                           budgets_planned=[b.to_dict() for b in budgets])
    return doc


def tables(doc: dict[str, Any]) -> list[Table]:
    """auto against the swept plans per budget, then every plan's figures per budget."""
    out = [Table("auto against the swept plans", ("budget", "process", "best swept plan", "auto ms", "auto / best",
                                                  "fastest stride:K", "auto / fastest stride", "prediction error"),
                 [(b["budget"]["label"], b["fixed"]["status"],
                   f"{b['best']['plan']}: {num(b['best']['update_ms'])} ms" if b.get("best") else MISSING,
                   num(b["auto"]["update_ms"]), ratio(b.get("auto_vs_best")),
                   f"{b['fastest_stride']['plan']}: {num(b['fastest_stride']['update_ms'])} ms"
                   if b.get("fastest_stride") else MISSING, ratio(b.get("auto_vs_fastest_stride")),
                   pct(b["prediction_error_median"])) for b in doc["budgets"]],
                 "Median update phase; ratios below 1: auto is faster.")]
    for b in doc["budgets"]:
        rows = [(p["plan"], p["status"], p["lanes_run"][-1] if p["lanes_run"] else p["lanes"] or MISSING,
                 num(p["device_fraction"], 3), num(p["update_ms"]), num(p["predicted_ms"]), pct(p["median_rel_error"]),
                 MISSING if p["demoted_max"] is None else p["demoted_max"], p["measured_steps"])
                for p in [*b["plans"], {**b["auto"], "plan": "auto", "lanes": b["auto"].get("final_lanes")}]]
        out.append(Table(f"Budget {b['budget']['label']}", ("plan", "status", "lanes (as run)", "device fraction",
                                                            "update ms", "predicted ms", "error", "demoted (max)",
                                                            "measured"), rows))
    return out


def _panel(ax: Any, budget: dict[str, Any]) -> None:
    plans = [p for p in budget["plans"] if p["update_ms"] is not None and p["device_fraction"] is not None]
    line = sorted((p for p in plans if p["kind"] in FRACTION_KINDS), key=lambda p: (p["device_fraction"], p["plan"]))
    if line:
        ax.plot([p["device_fraction"] for p in line], [p["update_ms"] for p in line], marker="o", color="#4c72b0",
                label="fraction plans (measured)")
        predicted = [(p["device_fraction"], p["predicted_ms"]) for p in line if p["predicted_ms"] is not None]
        if predicted:
            ax.plot(*zip(*predicted), linestyle="--", marker=".", color="#4c72b0", alpha=0.7,
                    label="fraction plans (predicted)")
    for kind, marker, colour in (("stride", "^", "#dd8452"), ("list", "s", "#8172b3")):
        points = [p for p in plans if p["kind"] == kind]
        if points:
            ax.scatter([p["device_fraction"] for p in points], [p["update_ms"] for p in points], marker=marker, s=60,
                       color=colour, zorder=3, label=f"{kind} plans (measured)")
            for p in points:
                ax.annotate(p["plan"], (p["device_fraction"], p["update_ms"]), textcoords="offset points",
                            xytext=(4, 4), fontsize="x-small", color=colour)
    auto = budget["auto"]
    if auto["update_ms"] is not None:
        ax.axhline(auto["update_ms"], color="#55a868", linewidth=1.5, label=f"auto {auto['update_ms']:.1f} ms")
        if auto["device_fraction"] is not None:
            ax.scatter([auto["device_fraction"]], [auto["update_ms"]], marker="*", s=160, color="#55a868", zorder=4)
    missing = [f"{p['plan']}: {p['status']}" for p in [*budget["plans"], {**auto, "plan": "auto"}]
               if p["status"] != "ok"]
    if missing:
        ax.text(0.01, 0.01, "not measured: " + ", ".join(missing), transform=ax.transAxes, fontsize="x-small",
                color="#c44e52", va="bottom", wrap=True)
    ax.set(title=f"budget {budget['budget']['label']}", xlabel="device-lane fraction of the parameters (as run)",
           ylabel="update phase, median (ms)", xlim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="x-small", framealpha=0.8)


def render(doc: dict[str, Any], path: str | Path) -> Path:
    """sweep.png: one panel per budget, the median update against the device fraction."""
    budgets = doc["budgets"]
    fig, axes = plt.subplots(1, max(1, len(budgets)), figsize=(6.5 * max(1, len(budgets)), 5.0), squeeze=False)
    for ax, budget in zip(axes[0], budgets):
        _panel(ax, budget)
    # wrapped to the figure's width: one panel is narrower than the title (it was cut off at both ends)
    fig.suptitle(textwrap.fill(f"plan sweep: {workload_title(doc)}", width=int(9 * fig.get_figwidth())))
    return save(fig, path)
