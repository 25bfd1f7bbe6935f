"""Owns sweep.md, a plan sweep's markdown report: it formats sweep.json and computes nothing new."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_dos.bench import markdown as md


def _ratio_rows(budgets: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Per budget: the process, the best swept plan, auto, auto against both, and the prediction error."""
    rows = []
    for b in budgets:
        best, stride, a = b.get("best") or {}, b.get("fastest_stride") or {}, b["auto"]
        rows.append((b["budget"]["label"], b["fixed"]["status"],
                     f"{best['plan']}: {md.num(best['update_ms'])}" if best else md.MISSING, md.num(a["update_ms"]),
                     md.ratio(b.get("auto_vs_best")),
                     f"{stride['plan']}: {md.num(stride['update_ms'])}" if stride else md.MISSING,
                     md.ratio(b.get("auto_vs_fastest_stride")), md.pct(b["prediction_error_median"])))
    return rows


RATIO_HEADER = ("budget", "process", "best swept plan (ms)", "auto (ms)", "auto / best", "fastest stride:K (ms)",
                "auto / fastest stride", "median prediction error")


def _lanes(value: str | None, width: int = 40) -> str:
    if not value:
        return md.MISSING
    return f"`{value}`" if len(value) <= width else f"`{value[:width]}...`"


def _plan_row(name: str, entry: dict[str, Any], lanes: str | None) -> tuple[str, ...]:
    """One row of a budget's table: a swept plan's or auto's figures."""
    spread = entry.get("update_ms_spread")
    update = md.num(entry["update_ms"])
    if spread and spread["n"] > 1:
        update += f" ({md.num(spread['min'])}-{md.num(spread['max'])})"
    return (name, entry["status"], _lanes(lanes), md.num(entry["device_fraction"], 3), update,
            md.num(entry["predicted_ms"]), md.pct(entry["median_rel_error"]),
            md.MISSING if entry["demoted_max"] is None else str(entry["demoted_max"]), str(entry["measured_steps"]),
            md.num(entry["iteration_ms"]))


def _plan_rows(budget: dict[str, Any]) -> list[tuple[str, ...]]:
    best = (budget.get("best") or {}).get("plan")
    rows = [_plan_row(f"**{p['plan']}** (best)" if p["plan"] == best else p["plan"], p,
                      p["lanes_run"][-1] if p["lanes_run"] else p["lanes"]) for p in budget["plans"]]
    a = budget["auto"]
    rows.append(_plan_row("auto", a, a.get("final_lanes") or (a.get("chosen") or {}).get("lanes")))
    return rows


def _budget_lines(budget: dict[str, Any]) -> list[str]:
    b, fixed, a = budget["budget"], budget["fixed"], budget["auto"]
    limit = "no limit beyond the free device memory" if b["gib"] is None else f"memory_budget_gib = {b['gib']:.3f}"
    lines = [f"## Budget: {b['label']}", "", f"- DOS device-lane budget: {limit}."]
    lines.append(f"- One process, fixed plans and auto interleaved: {fixed['status']}"
                 + (f": {fixed['reason']}" if fixed.get("reason") else "")
                 + (f" (during plan {fixed['failed_plan']})" if fixed.get("failed_plan") else "")
                 + f"; {fixed['plans_completed']}/{len(budget['plans'])} plans completed"
                 + (f"; peak GPU {fixed['peak_gpu_gib']:.2f} GiB" if fixed.get("peak_gpu_gib") is not None else "")
                 + ".")
    chosen = a.get("chosen")
    chosen_text = (f"chose {_lanes(chosen['lanes'], 64)} with {chosen['buffers']} buffer(s), device fraction "
                   f"{chosen['device_fraction']:.3f}{_host_order_text(chosen)}, after the probe at update "
                   f"{a['probe_step']}") if chosen else "no plan chosen (no update phase after the probe)"
    lines.append(f"- auto, started cold, with its own calibration: {a['status']}"
                 + (f": {a['reason']}" if a.get("reason") else "")
                 + f"; {chosen_text}; {a['excluded_steps']} leading update phases left out, "
                 f"{a['replans_measured']} re-plans and {a.get('trial_phases', 0)} update phases of plans on "
                 "trial among the measured ones; plan at the end: "
                 f"{a.get('final_plan') or md.MISSING}.")
    best = budget.get("best")
    if best:
        lines.append(f"- Best swept plan: {best['plan']}, {best['update_ms']:.1f} ms. Median prediction error over "
                     f"the swept plans' {budget['prediction_steps']} measured update phases: "
                     f"{md.pct(budget['prediction_error_median'])}.")
    lines += ["", "Update = the update phase's makespan (median; min-max of the measured update phases); predicted = "
              "the manager's prediction for the same update phases (median); error = median of |predicted - "
              "measured| / measured; lanes and device fraction as run, after any demotion to fit memory.", ""]
    lines += md.table(("plan", "status", "lanes (as run)", "device fraction", "update ms", "predicted ms", "error",
                       "demoted (max)", "measured", "iteration ms"), _plan_rows(budget))
    return lines + [""]


def _host_order_text(chosen: dict[str, Any]) -> str:
    """``, host lane in order 17 0 2 ...`` when the plan's host lane does not run in id order (records before the
    host order was recorded have none)."""
    order = chosen.get("host_order")
    lanes = chosen.get("lanes") or ""
    if not order or order == [i for i, c in enumerate(lanes) if c == "H"]:
        return ""
    return ", host lane in order " + " ".join(str(g) for g in order)


def render_sweep(doc: dict[str, Any], chart: str | None = "sweep.png") -> str:
    """sweep.md of a sweep.json document."""
    cfg, model, sweep = doc["config"], doc["model"], doc["sweep"]
    planned, done = doc.get("budgets_planned") or [], len(doc["budgets"])
    rest = ", ".join(b["label"] for b in planned[done:])
    lines = md.heading(doc, "plan sweep", "**The sweep was interrupted**: processes after the interruption were not "
                       "run.", f"**Partial**: written after {done} of {len(planned)} budgets; not run yet: {rest}."
                       if len(planned) > done else None)
    budgets = ", ".join(b["budget"]["label"] for b in doc["budgets"])
    m = doc["measurement"]
    lines += ["", "## Configuration", "",
              f"- Model: {md.model_text(model)}",
              f"- Micro-batch {cfg['micro_batch']} x seq {cfg['seq_len']}, {cfg['precision']}, activation "
              f"checkpointing {'on' if cfg['activation_checkpointing'] else 'off'}, sub_group_size "
              f"{cfg['sub_group_size'] or 'of configs/strategy/dos_auto.yaml'}, data {cfg['data']}, seed {cfg['seed']}",
              f"- Budgets: {budgets}",
              *([f"- {cfg['devices'][0]} ranks, data parallel: each rank sweeps its own partition's plans and runs its "
                 "own auto; a budget is per rank; each iteration counts the update phase of the rank that took "
                 "longest (the ranks meet at the next collective), every rank's records in `result.json`"]
                if (cfg.get("devices") or [1])[0] > 1 else []),
              f"- Fixed plans, in this order: {', '.join(sweep['plans'])}",
              f"- Fixed plans: {m['fixed_plans']}.",
              f"- auto: {m['auto']}.",
              f"- Update: {m['update_ms']}; predicted: {m['predicted_ms']}; error: {m['prediction_error']}.",
              f"- {m['timing']}",
              "", "Full resolved configuration:", "", *md.json_block({"bench": cfg, "sweep": sweep}),
              "", "## auto against the swept plans", "",
              "Per budget, medians of the update phase: auto's over the best swept plan's and over the fastest "
              "stride:K's (< 1: auto is faster), and the median relative error of the predictions for the swept "
              "plans' update phases.", ""]
    lines += md.table(RATIO_HEADER, _ratio_rows(doc["budgets"]))
    if chart:
        lines += ["", f"![update time against device fraction, per budget]({chart})"]
    lines.append("")
    for budget in doc["budgets"]:
        lines += _budget_lines(budget)
    lines += ["Per-iteration records (plan, lanes, update, prediction, busy times, bytes, demotions) are in each "
              "process's `result.json` under `runs/`, with its log.", ""]
    return "\n".join(lines)
