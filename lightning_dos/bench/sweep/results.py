"""Owns turning a plan sweep's raw measurements into figures, ratios and sweep.json (pure Python).

Per fixed plan, over its iterations after the first: the median update makespan, the median of the manager's
predictions for the same update phases, the median relative error, the device fraction as run and the most subgroups
demoted; the same for ``auto`` after its probe, the first step of its plan and its warm-up; then ``auto`` against the
best swept plan and the fastest ``stride:K``, as ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_dos.bench.results import ratio, series
from lightning_dos.bench.stats import median, spread
from lightning_dos.bench.sweep.config import (
    AUTO,
    AUTO_MIN_EXCLUDED,
    PLAN_WARMUP,
    Budget,
    SweepSettings,
    plan_argument,
    sweep_schedule,
)
from lightning_dos.planning.plan import parse_plan
from lightning_dos.planning.trials import TRIAL_SOURCE

NOT_RUN = "not run"


def plan_kind(plan: str) -> str:
    """``fraction``, ``host``, ``device``, ``stride`` or ``list`` for a plan as on the command line."""
    return parse_plan(plan_argument(plan)).kind


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """``|predicted - measured| / measured``, or None when either is missing or measured is not positive."""
    if predicted is None or measured is None or measured <= 0:
        return None
    return abs(predicted - measured) / measured


def _spread_dict(values: Sequence[float]) -> dict[str, Any] | None:
    s = spread(values)
    return None if s is None else s.to_dict()


def _phases(result: dict[str, Any], indices: Sequence[int]) -> dict[str, float | None]:
    return {phase: median(series([result], phase, indices)) for phase in ("iteration_ms", "step_ms")}


def _update_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    update = [s["update_ms"] for s in steps]
    errors = [e for e in (relative_error(s.get("predicted_ms"), s["update_ms"]) for s in steps) if e is not None]
    return {
        "measured_steps": len(steps),
        "update_ms": median(update),
        "update_ms_spread": _spread_dict(update),
        "predicted_ms": median([s["predicted_ms"] for s in steps if s.get("predicted_ms") is not None]),
        "median_rel_error": median(errors),
        "rel_errors": errors,
        "device_fraction": median([s["device_fraction"] for s in steps]),
    }


def failed_plan_of(result: dict[str, Any], sweep: SweepSettings) -> str | None:
    """The plan in force when a sweep process stopped without completing (``auto`` for its part), or None."""
    if result.get("status") == "ok":
        return None
    if result.get("failed_plan"):
        return str(result["failed_plan"])
    iterations = (result.get("sweep") or {}).get("iterations") or []
    if not sweep.plans:
        return None
    # only completed iterations reach progress.json: the run stopped in the next one
    schedule = sweep_schedule(sweep.plans, sweep.steps_per_plan, sweep.auto_steps)
    return schedule[min(len(iterations), len(schedule) - 1)]


def summarize_plans(result: dict[str, Any], sweep: SweepSettings) -> list[dict[str, Any]]:
    """One summary per swept plan of a fixed-plan process's raw result (complete, partial or empty)."""
    raw = result.get("sweep") or {}
    iterations = raw.get("iterations") or []
    resolved = {entry["plan"]: entry for entry in raw.get("resolved") or []}
    status = result.get("status", "failed")
    failed = failed_plan_of(result, sweep)
    out = []
    for index, plan in enumerate(sweep.plans):
        its = [it for it in iterations if it["plan_index"] == index]
        measured = its[PLAN_WARMUP:]
        steps = [record for it in measured for record in it["records"]]
        every = [record for it in its for record in it["records"]]
        if status == "ok":
            plan_status = "ok"
        elif plan == failed:
            plan_status = status
        else:  # stopped elsewhere: this plan's completed iterations still count (rounds interleave the plans)
            plan_status = "ok" if steps else NOT_RUN
        indices = [it["iteration"] for it in measured]
        entry = resolved.get(plan, {})
        out.append({
            "plan": plan,
            "kind": plan_kind(plan),
            "status": plan_status,
            "iterations": len(its),
            "lanes": entry.get("lanes") or (its[0]["lanes"] if its else None),
            "buffers": entry.get("buffers"),
            "requested_device_fraction": its[0]["device_fraction"] if its else None,
            "lanes_run": sorted({record["lanes"] for record in steps}),
            **_update_summary(steps),
            "demoted_max": max((record["demoted_subgroups"] for record in every), default=None),
            **_phases(result, indices),
        })
    return out


def auto_status(result: dict[str, Any], sweep: SweepSettings, ran: int) -> tuple[str, str | None]:
    """Status and reason of ``auto``'s part of a sweep process that ran ``ran`` of its iterations to the end."""
    status = result.get("status", "failed")
    failed = failed_plan_of(result, sweep)
    if status == "ok" or failed == AUTO:
        return status, result.get("reason")
    if ran:  # stopped during a fixed plan: auto's iterations so far still count, as the fixed plans' do
        return "ok", f"{ran} of {sweep.auto_steps} iterations: the process stopped during plan {failed} ({status})"
    return NOT_RUN, f"the process stopped before auto ({status})"


def summarize_auto(result: dict[str, Any], sweep: SweepSettings) -> dict[str, Any]:
    """``auto``'s figures over its update phases after the probe, the first step of its plan and the warm-up."""
    iterations = [it for it in (result.get("sweep") or {}).get("iterations") or [] if it["plan"] == AUTO]
    tagged = [(it["iteration"], record) for it in iterations for record in it["records"]]
    steps = [record for _, record in tagged]
    probe = next((i for i, step in enumerate(steps) if step.get("replanned")), None)  # the probe's last step
    # the probe's steps and the first step of the plan chosen after them
    skip = max(sweep.warmup, AUTO_MIN_EXCLUDED if probe is None else probe + 2)
    measured = steps[skip:]
    indices = sorted({iteration for iteration, _ in tagged[skip:]})
    chosen = steps[probe + 1] if probe is not None and probe + 1 < len(steps) else None
    status, reason = auto_status(result, sweep, len(iterations))
    final = steps[-1] if steps else None
    return {
        "status": status,
        "reason": reason,
        "update_phases": len(steps),
        "excluded_steps": min(skip, len(steps)),
        "probe_step": None if probe is None else probe + 1,
        "chosen": None if chosen is None else {key: chosen.get(key) for key in
                                               ("lanes", "host_order", "source", "buffers", "device_fraction")},
        "final_plan": None if final is None else f"{final.get('source')}: {final.get('lanes')}",
        **_update_summary(measured),
        "replans_measured": sum(bool(step.get("replanned")) for step in measured),
        "trial_phases": sum(step.get("source") == TRIAL_SOURCE for step in measured),
        "final_lanes": None if final is None else final.get("lanes"),
        "lanes_run": sorted({step["lanes"] for step in measured}),
        "demoted_max": max((step["demoted_subgroups"] for step in measured), default=None),
        **_phases(result, indices),
    }


def _process(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result.get(key) for key in ("status", "reason", "elapsed_s", "log", "returncode", "peak_gpu_gib",
                                             "peak_gpu_reserved_gib", "peak_host_gib", "device")}


def best_plan(plans: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The completed swept plan with the smallest median update time."""
    done = [p for p in plans if p["status"] == "ok" and p["update_ms"] is not None]
    return min(done, key=lambda p: p["update_ms"], default=None)


def sweep_ratios(plans: Sequence[dict[str, Any]], auto: dict[str, Any]) -> dict[str, Any]:
    """``auto``'s median update against the best swept plan's and the fastest ``stride:K``'s (None where either is
    missing), and which stride plan that was."""
    auto_ms = auto["update_ms"] if auto["status"] == "ok" else None
    best = best_plan(plans)
    fastest = best_plan([p for p in plans if p["kind"] == "stride"])
    return {"auto_vs_best": ratio(auto_ms, best["update_ms"] if best else None),
            "fastest_stride": None if fastest is None else {"plan": fastest["plan"], "update_ms": fastest["update_ms"]},
            "auto_vs_fastest_stride": ratio(auto_ms, fastest["update_ms"] if fastest else None)}


def summarize_budget(budget: Budget, result: dict[str, Any], sweep: SweepSettings) -> dict[str, Any]:
    """Everything sweep.json records for one budget, from its process's raw result (fixed plans and auto)."""
    plans = summarize_plans(result, sweep)
    auto_summary = summarize_auto(result, sweep)
    best = best_plan(plans)
    errors = [e for p in plans for e in p["rel_errors"]]
    return {
        "budget": budget.to_dict(),
        "fixed": {**_process(result), "failed_plan": failed_plan_of(result, sweep),
                  "plans_completed": sum(p["status"] == "ok" for p in plans)},
        "plans": plans,
        "auto": auto_summary,
        "best": None if best is None else {"plan": best["plan"], "update_ms": best["update_ms"]},
        "prediction_error_median": median(errors),
        "prediction_steps": len(errors),
        **sweep_ratios(plans, auto_summary),
    }


def sweep_measurement(sweep: SweepSettings) -> dict[str, Any]:
    """sweep.json's ``measurement``: how the fixed plans and ``auto`` ran, what update, prediction and error are."""
    return {
        "fixed_plans": f"one process per budget runs every plan for {sweep.steps_per_plan} iterations, in rounds of "
                       "one iteration of each plan in the order given; the first round is left out and the rest "
                       "summarised by their median",
        "auto": f"the same process runs plan auto for {sweep.auto_steps} iterations spread evenly over the rounds "
                "after the first, started cold (the starting cost values, then its probe) and keeping its own "
                f"calibration; the first {sweep.auto_excluded} (the probe steps, the first step of the chosen plan, "
                "warm-up) are left out",
        "update_ms": "the DOS update phase's makespan (both lanes), from the manager's records",
        "predicted_ms": "the manager's prediction for that update phase, made just before it with the cost parameters "
                        "calibrated on every earlier update phase of the process (earlier plans' included)",
        "prediction_error": "|predicted - measured| / measured per update phase; median over the measured update "
                            "phases"}
