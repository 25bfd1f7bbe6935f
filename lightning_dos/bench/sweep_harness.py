"""Owns one plan-sweep invocation end to end: one worker process per budget in, sweep.json/.md/.png out.

For each budget, one process (:mod:`lightning_dos.bench.sweep_worker`) runs every fixed plan of the sweep in
rounds, and ``auto`` started cold, which probes, calibrates and re-plans as in training, interleaved with them
(:func:`~lightning_dos.bench.sweep_config.sweep_schedule`). ``auto`` shares the process and the time with the plans
it is compared with: measured in processes of their own, or in turn within one, the same lanes differed by more
than the 5% the target allows (docs/performance-model.md). Each process goes through the bench's launcher (time limit,
failure classification, its own log), under a progress bar with one line per finished process. The outputs are
written after every budget, and a process stopped from outside still contributes the plans it finished (its
``progress.json``), so a sweep cut short keeps what it measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lightning_dos.bench import sweep_report
from lightning_dos.bench.config import BenchConfig, RunSpec
from lightning_dos.bench.data import prepare_text
from lightning_dos.bench.environment import hardware_info, merge_worker_device, versions
from lightning_dos.bench.harness import CPU_TIMING, GPU_TIMING, _relative, uses_gpu
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.model import describe_model
from lightning_dos.bench.results import skipped
from lightning_dos.bench.sweep_config import Budget, SweepConfig, resolve_budget
from lightning_dos.bench.sweep_results import document, summarize_budget
from lightning_dos.bench.sweep_worker import PROGRESS_FILE
from lightning_dos.bench.worker import write_json

SWEEP_WORKER = "lightning_dos.bench.sweep_worker"
#: ``launcher(config, spec, run_dir, module=..., extra=...)``: the bench's :func:`~lightning_dos.bench.launcher.launch`.
Launcher = Callable[..., dict[str, Any]]


def default_out_dir(config: BenchConfig, now: datetime) -> Path:
    """``runs/sweep/<model>_<YYYYmmdd-HHMMSS>`` under the current directory."""
    return Path("runs") / "sweep" / f"{config.model}_{now:%Y%m%d-%H%M%S}"


def budgets_of(sweep: SweepConfig) -> list[Budget]:
    """The sweep's budgets resolved for its model."""
    params = describe_model(sweep.bench)["params"]
    return [resolve_budget(text, params) for text in sweep.budgets]


def process_spec(sweep: SweepConfig, budget: Budget) -> RunSpec:
    """The process of ``budget``: DOS started with the first plan (the sweep switches from there)."""
    return RunSpec(label=f"sweep[{budget.name}]", strategy="deep_optimizer_states", plan=sweep.plans[0])


def with_progress(result: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A process result that lacks the sweep's records, completed from the worker's ``progress.json``."""
    if result.get("sweep") or result.get("status") == "ok":
        return result
    try:
        progress = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return result
    return {**result, "sweep": progress}


def _elapsed(result: dict[str, Any]) -> str:
    return f" ({result['elapsed_s']:.0f} s)" if result.get("elapsed_s") is not None else ""


def budget_line(index: int, total: int, budget: Budget, summary: dict[str, Any], result: dict[str, Any]) -> str:
    """One line summarising a finished budget process: the fixed plans and ``auto``."""
    head = f"[{index}/{total}] {budget.label}:"
    plans = summary["plans"]
    done = sum(p["status"] == "ok" for p in plans)
    best = summary["best"]
    a = summary["auto"]
    if result.get("status") != "ok":
        where = summary["fixed"].get("failed_plan")
        return (f"{head} {str(result.get('status')).upper()}: {result.get('reason')}"
                + (f" during plan {where}" if where else "") + f"; {done}/{len(plans)} fixed plans completed"
                + _elapsed(result))
    best_text = f"best {best['plan']} {best['update_ms']:.1f} ms" if best else "no plan measured"
    error = summary["prediction_error_median"]
    error_text = f", median prediction error {error:.1%}" if error is not None else ""
    auto_text = (f"auto {a['update_ms']:.1f} ms" if a["update_ms"] is not None else "auto: no measured update phase")
    fraction = f" (device fraction {a['device_fraction']:.2f})" if a["device_fraction"] is not None else ""
    return (f"{head} ok  {done}/{len(plans)} fixed plans, {best_text}{error_text}; {auto_text}{fraction}"
            f"{_elapsed(result)}")


def run_sweep(sweep: SweepConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
              now: datetime | None = None) -> dict[str, Any]:
    """Run the sweep's processes; write sweep.json, sweep.md and sweep.png under ``out_dir``; return the JSON."""
    now = now or datetime.now(timezone.utc)
    out_dir.mkdir(parents=True, exist_ok=True)
    hardware = hardware_info()
    if sweep.bench.data == "text":
        prepare_text(sweep.bench)
    model = describe_model(sweep.bench)
    software = versions()
    budgets = budgets_of(sweep)
    if not budgets:
        raise ValueError("sweep: give at least one budget")
    total = len(budgets)
    summaries: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    interrupted = False
    with tqdm(total=total, desc="sweep", unit="process", disable=not progress, dynamic_ncols=True) as bar:
        for index, budget in enumerate(budgets, start=1):
            spec, config = process_spec(sweep, budget), sweep.process_config(budget)
            bar.set_postfix_str(spec.label)
            run_dir = out_dir / "runs" / budget.slug
            if interrupted:
                result = skipped(spec, "not run: the sweep was interrupted")
            else:
                try:
                    (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier run's, in the same --out
                    extra = {"sweep": {"plans": list(sweep.plans), "steps_per_plan": sweep.steps_per_plan,
                                       "auto_steps": sweep.auto_steps}}
                    result = launcher(config, spec, run_dir, module=SWEEP_WORKER, extra=extra)
                    result = with_progress(result, run_dir)
                except KeyboardInterrupt:  # the worker is already stopped; report what ran
                    interrupted = True
                    result = with_progress(skipped(spec, "interrupted while running"), run_dir)
            result["log"] = _relative(result.get("log"), out_dir)
            if result.get("device"):
                devices.append(result["device"])
            summary = summarize_budget(budget, result, sweep)
            bar.write(budget_line(index, total, budget, summary, result))
            bar.update(1)
            summaries.append(summary)
            # after every budget, so a sweep stopped from outside still leaves the budgets it finished
            merge_worker_device(hardware, devices[0] if devices else None)
            on_gpu = any(d.get("type") == "cuda" for d in devices) or (not devices and uses_gpu(sweep.bench, hardware))
            doc = document(hardware, software, sweep, model, summaries, now.isoformat(timespec="seconds"),
                           GPU_TIMING if on_gpu else CPU_TIMING, interrupted)
            doc["budgets_planned"] = [b.to_dict() for b in budgets]
            write_outputs(doc, out_dir)
    return doc


def write_outputs(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """sweep.json, sweep.png and sweep.md; returns their paths by kind."""
    paths = {"json": out_dir / "sweep.json", "chart": out_dir / "sweep.png", "report": out_dir / "sweep.md"}
    write_json(paths["json"], doc)
    sweep_report.render_chart(doc, paths["chart"])
    paths["report"].write_text(sweep_report.render_markdown(doc, chart=paths["chart"].name), encoding="utf-8")
    return paths


def dry_run_text(sweep: SweepConfig) -> str:
    """The resolved settings, the budgets in GiB and the processes the sweep would run, for ``--dry-run``."""
    model = describe_model(sweep.bench)
    budgets = budgets_of(sweep)
    lines = ["resolved configuration:", json.dumps({"bench": sweep.bench.to_dict(), "sweep": sweep.to_dict()},
                                                    indent=2), "",
             f"model: {model['preset']}, {model['params']:,} parameters", "",
             f"{len(budgets)} processes, one per budget, each {sweep.process_steps} iterations:"]
    for budget in budgets:
        lines.append(f"  {budget.label:<24} fixed plans: {len(sweep.plans)} plans x {sweep.steps_per_plan} rounds "
                     f"= {sweep.fixed_steps} iterations ({', '.join(sweep.plans)})")
        lines.append(f"  {budget.label:<24} auto, started cold, spread over rounds 2-{sweep.steps_per_plan}: "
                     f"{sweep.auto_steps} iterations, the first {sweep.auto_excluded} left out")
    return "\n".join(lines)
