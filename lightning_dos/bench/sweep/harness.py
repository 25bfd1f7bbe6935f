"""Owns a plan sweep (``lightning-dos bench --sweep``) end to end: a process per budget on the
:class:`~lightning_dos.bench.pipeline.Pipeline`, sweep.json, sweep.md and sweep.png written after every budget; a
process stopped from outside still contributes the plans it finished (its ``progress.json``).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from lightning_dos.bench import chart
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.pipeline import Launcher, Pipeline, elapsed_note, prepare, write_outputs
from lightning_dos.bench.sweep.config import PROGRESS_FILE, Budget, SweepConfig, resolve_budget
from lightning_dos.bench.sweep.report import render_sweep
from lightning_dos.bench.sweep.results import summarize_budget, sweep_measurement


def with_progress(result: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A process result that lacks the sweep's records, completed from the worker's ``progress.json``."""
    if result.get("sweep") or result.get("status") == "ok":
        return result
    try:
        progress = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return result
    return {**result, "sweep": progress}


def budget_line(index: int, total: int, budget: Budget, summary: dict[str, Any], result: dict[str, Any]) -> str:
    """One line summarising a finished budget process: the fixed plans and ``auto``."""
    head = f"[{index}/{total}] {budget.label}:" + (" (reused)" if result.get("reused") else "")
    plans = summary["plans"]
    done = sum(p["status"] == "ok" for p in plans)
    best, a = summary["best"], summary["auto"]
    if result.get("status") != "ok":
        where = summary["fixed"].get("failed_plan")
        return (f"{head} {str(result.get('status')).upper()}: {result.get('reason')}"
                + (f" during plan {where}" if where else "") + f"; {done}/{len(plans)} fixed plans completed"
                + elapsed_note(result))
    best_text = f"best {best['plan']} {best['update_ms']:.1f} ms" if best else "no plan measured"
    error = summary["prediction_error_median"]
    error_text = f", median prediction error {error:.1%}" if error is not None else ""
    auto_text = (f"auto {a['update_ms']:.1f} ms" if a["update_ms"] is not None else "auto: no measured update phase")
    fraction = f" (device fraction {a['device_fraction']:.2f})" if a["device_fraction"] is not None else ""
    return (f"{head} ok  {done}/{len(plans)} fixed plans, {best_text}{error_text}; {auto_text}{fraction}"
            f"{elapsed_note(result)}")


def run_sweep(sweep: SweepConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
              now: datetime | None = None, resume: bool = False) -> dict[str, Any]:
    """Run the sweep's processes; write sweep.json, sweep.md and sweep.png under ``out_dir``; return the JSON."""
    summaries: list[dict[str, Any]] = []
    extra = {"sweep": {"plans": list(sweep.plans), "steps_per_plan": sweep.steps_per_plan,
                       "auto_steps": sweep.auto_steps}}
    with Pipeline(sweep.bench, out_dir, launcher, resume, progress, now) as pipeline:
        budgets = [resolve_budget(text, pipeline.model["params"], sweep.devices) for text in sweep.budgets]
        pipeline.stage("sweep", "process", len(budgets))
        for index, budget in enumerate(budgets, start=1):
            run_dir = out_dir / "runs" / budget.slug
            if not resume:
                (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier run's, in the same --out
            result = pipeline.run(sweep.process_config(budget), sweep.spec(budget), run_dir, extra,
                                  complete=lambda result, run_dir=run_dir: with_progress(result, run_dir))
            summary = summarize_budget(budget, result, sweep)
            pipeline.done(budget_line(index, len(budgets), budget, summary, result))
            summaries.append(summary)
            # after every budget, so a sweep stopped from outside still leaves the budgets it finished
            doc = pipeline.document("plan_sweep", sweep_measurement(sweep), sweep=sweep.to_dict(),
                                    interrupted=pipeline.interrupted, budgets=summaries)
            doc["budgets_planned"] = [b.to_dict() for b in budgets]
            write_outputs(doc, out_dir, ("sweep.json", "sweep.png", "sweep.md"), chart.render_sweep, render_sweep)
    return doc


def dry_run_text(sweep: SweepConfig) -> str:
    """The resolved settings, the budgets in GiB and the processes the sweep would run, for ``--dry-run``."""
    _, resolved, model = prepare(sweep.bench)
    budgets = [resolve_budget(text, model["params"], sweep.devices) for text in sweep.budgets]
    lines = ["resolved configuration:", json.dumps({"bench": resolved.to_dict(), "sweep": sweep.to_dict()},
                                                    indent=2), "",
             f"model: {model['preset']}, {model['params'] or 'unknown'} parameters", "",
             f"{len(budgets)} processes, one per budget, each {sweep.process_steps} iterations:"]
    for budget in budgets:
        lines.append(f"  {budget.label:<24} fixed plans: {len(sweep.plans)} plans x {sweep.steps_per_plan} rounds "
                     f"= {sweep.fixed_steps} iterations ({', '.join(sweep.plans)})")
        lines.append(f"  {budget.label:<24} auto, started cold, spread over rounds 2-{sweep.steps_per_plan}: "
                     f"{sweep.auto_steps} iterations, the first {sweep.auto_excluded} left out")
    return "\n".join(lines)
