"""Owns the plan sweep's report: sweep.md (tables and targets) and sweep.png (update time against device fraction).

Both format the sweep.json document (:func:`lightning_dos.bench.sweep_results.document`) and compute nothing
new. The chart has one panel per budget: the fraction plans' measured median update time against the device
fraction they ran with (a line) and the manager's predictions for them (dashed), the stride plans as separate
markers, and ``auto`` as a horizontal line. Matplotlib's Agg backend, so it renders without a display.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lightning_dos.bench.chart import save, workload_title  # noqa: E402
from lightning_dos.bench.report import MISSING, _hardware_lines, _num, _table  # noqa: E402

FRACTION_KINDS = ("fraction", "host", "device")


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return MISSING
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _target_value(target: dict[str, Any]) -> str:
    value = target["value"]
    if value is None:
        return MISSING
    if target["target"].startswith("auto within"):
        return _pct(value, signed=True)
    if target["target"].startswith("median prediction"):
        return _pct(value)
    if target["target"] == "no OOM":
        return f"{value:.0f} failed"
    return f"{value:.3f}x"


def _targets_table(targets: Sequence[dict[str, Any]], budget: str | None = None) -> list[str]:
    header = ("target", "threshold", "measured", "status", "from")
    rows = [(t["target"], t["threshold"], _target_value(t), f"**{t['status']}**", t["detail"]) for t in targets]
    if budget is not None:
        header = ("budget", *header)
        rows = [(budget, *row) for row in rows]
    return _table(header, rows)


def _lanes(value: str | None, width: int = 40) -> str:
    if not value:
        return MISSING
    return f"`{value}`" if len(value) <= width else f"`{value[:width]}...`"


def _plan_rows(budget: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    best = (budget.get("best") or {}).get("plan")
    for p in budget["plans"]:
        spread = p.get("update_ms_spread")
        update = _num(p["update_ms"])
        if spread and spread["n"] > 1:
            update += f" ({_num(spread['min'])}-{_num(spread['max'])})"
        ran = p["lanes_run"][-1] if p["lanes_run"] else p["lanes"]
        name = f"**{p['plan']}** (best)" if p["plan"] == best else p["plan"]
        rows.append((name, p["status"], _lanes(ran), _num(p["device_fraction"], 3), update, _num(p["predicted_ms"]),
                     _pct(p["median_rel_error"]), MISSING if p["demoted_max"] is None else str(p["demoted_max"]),
                     str(p["measured_steps"]), _num(p["iteration_ms"])))
    a = budget["auto"]
    chosen = a.get("chosen") or {}
    spread = a.get("update_ms_spread")
    update = _num(a["update_ms"])
    if spread and spread["n"] > 1:
        update += f" ({_num(spread['min'])}-{_num(spread['max'])})"
    ran = a.get("final_lanes") or chosen.get("lanes")
    rows.append(("auto", a["status"], _lanes(ran), _num(a["device_fraction"], 3), update, _num(a["predicted_ms"]),
                 _pct(a["median_rel_error"]), MISSING if a["demoted_max"] is None else str(a["demoted_max"]),
                 str(a["measured_steps"]), _num(a["iteration_ms"])))
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
                 f"{a.get('final_plan') or MISSING}.")
    best = budget.get("best")
    if best:
        lines.append(f"- Best swept plan: {best['plan']}, {best['update_ms']:.1f} ms. Median prediction error over "
                     f"the swept plans' {budget['prediction_steps']} measured update phases: "
                     f"{_pct(budget['prediction_error_median'])}.")
    lines += ["", "Update = the update phase's makespan (median; min-max of the measured update phases); predicted = "
              "the manager's prediction for the same update phases (median); error = median of |predicted - "
              "measured| / measured; lanes and device fraction as run, after any demotion to fit memory.", ""]
    lines += _table(("plan", "status", "lanes (as run)", "device fraction", "update ms", "predicted ms", "error",
                     "demoted (max)", "measured", "iteration ms"), _plan_rows(budget))
    lines += ["", "Targets for this budget:", ""]
    lines += _targets_table(budget["targets"])
    return lines + [""]


def _host_order_text(chosen: dict[str, Any]) -> str:
    """``, host lane in order 17 0 2 ...`` when the plan's host lane does not run in id order (records before the
    host order was recorded have none)."""
    order = chosen.get("host_order")
    lanes = chosen.get("lanes") or ""
    if not order or order == [i for i, c in enumerate(lanes) if c == "H"]:
        return ""
    return ", host lane in order " + " ".join(str(g) for g in order)


def render_markdown(doc: dict[str, Any], chart: str | None = "sweep.png") -> str:
    """sweep.md of a sweep.json document."""
    hw, cfg, model, sweep = doc["hardware"], doc["config"], doc["model"], doc["sweep"]
    device = hw.get("gpu_name") or "CPU"
    lines = [f"# lightning-dos plan sweep: {cfg['model']} on {device}", "", f"Date: {doc['date']}", ""]
    if doc.get("interrupted"):
        lines += ["**The sweep was interrupted**: processes after the interruption were not run.", ""]
    planned = doc.get("budgets_planned") or []
    if len(planned) > len(doc["budgets"]):
        rest = ", ".join(b["label"] for b in planned[len(doc["budgets"]):])
        lines += [f"**Partial**: written after {len(doc['budgets'])} of {len(planned)} budgets; not run yet: {rest}.",
                  ""]
    lines += ["## Hardware", ""]
    lines += _hardware_lines(hw)
    versions = doc["versions"]
    lines += ["", "## Versions", ""]
    lines += _table(tuple(versions), [tuple(str(v) if v is not None else MISSING for v in versions.values())])
    budgets = ", ".join(b["budget"]["label"] for b in doc["budgets"])
    m = doc["measurement"]
    lines += ["", "## Configuration", "",
              f"- Model: {model['preset']}, {model['params']:,} parameters ({model['n_layer']} layers, n_embd "
              f"{model['n_embd']}); micro-batch {cfg['micro_batch']} x seq {cfg['seq_len']}, {cfg['precision']}, "
              f"activation checkpointing {'on' if cfg['activation_checkpointing'] else 'off'}, sub_group_size "
              f"{cfg['sub_group_size']:,}, data {cfg['data']}, seed {cfg['seed']}",
              f"- Budgets: {budgets}",
              f"- Fixed plans, in this order: {', '.join(sweep['plans'])}",
              f"- Fixed plans: {m['fixed_plans']}.",
              f"- auto: {m['auto']}.",
              f"- Update: {m['update_ms']}; predicted: {m['predicted_ms']}; error: {m['prediction_error']}.",
              f"- {m['timing']}",
              "", "Full resolved configuration:", "", "```json"]
    lines += json.dumps({"bench": cfg, "sweep": sweep}, indent=2).splitlines()
    lines += ["```", "", "## Targets", "",
              "Over every budget of this invocation: missed if any budget missed it, not measured if any budget "
              "could not measure it. The value is the worst budget's.", ""]
    lines += _targets_table(doc["targets"])
    if chart:
        lines += ["", f"![update time against device fraction, per budget]({chart})"]
    lines.append("")
    for budget in doc["budgets"]:
        lines += _budget_lines(budget)
    lines += ["Per-iteration records (plan, lanes, update, prediction, busy times, bytes, demotions) are in each "
              "process's `result.json` under `runs/`, with its log.", ""]
    return "\n".join(lines)


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


def render_chart(doc: dict[str, Any], path: str | Path) -> Path:
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
