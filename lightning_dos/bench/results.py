"""Owns turning workers' raw measurements into the per-configuration results and the results.json document.

One result per configuration pools the measured iterations (warm-up excluded) of all its successful repeats
and reports medians with their spread, throughput, peak memory, the final loss and, for DOS, a summary of the
manager's update records. Comparisons against the vanilla ``zero3_offload`` run of the same invocation
(speedups as ratios, loss agreement) are added here, so report and chart only format. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lightning_dos.bench.config import BASELINE, HOST_KEYS, PHASES, BenchConfig, RunSpec
from lightning_dos.bench.stats import median, spread

SCHEMA_VERSION = 1
#: Status order from best to worst; a configuration reports its worst repeat.
STATUSES = ("ok", "skipped", "timeout", "oom", "failed")
#: DOS update-record fields summarised by their median over measured update phases.
DOS_FIELDS = ("update_ms", "host_busy_ms", "device_busy_ms", "device_fraction", "h2d_gb", "d2h_gb")
PEAK_FIELDS = ("peak_gpu_gib", "peak_gpu_reserved_gib", "peak_host_gib", "peak_host_rss_sampled_gib",
               "ru_maxrss_gib")


def _max_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=lambda s: STATUSES.index(s) if s in STATUSES else len(STATUSES))


def summarize_dos(runs: Sequence[dict[str, Any]], warmup: int) -> dict[str, Any] | None:
    """Medians of the DOS manager's measured update records, pooled over ``runs``; None without records."""
    records = [r["dos"] for r in runs if r.get("dos")]
    if not records:
        return None
    steps = [step for record in records for step in record["steps"][warmup:]]
    first = records[0]
    summary: dict[str, Any] = {
        "active": first["active"],
        "subgroups": first["subgroups"],
        "largest_subgroup": first.get("largest_subgroup"),
        "plan": first["plan"],
        "lanes": [step["lanes"] for step in first["steps"]],
        "update_phases": len(steps),
        "demoted_subgroups_max": max((step["demoted_subgroups"] for step in steps), default=0),
    }
    for name in DOS_FIELDS:
        summary[name] = median([step[name] for step in steps])
    update = spread([step["update_ms"] for step in steps])
    summary["update_ms_spread"] = None if update is None else update.to_dict()
    return summary


def summarize_host_threads(ok: Sequence[dict[str, Any]], warmup: int) -> dict[str, float | None]:
    """Medians over the measured iterations of :class:`~lightning_dos.bench.timing.PhaseTimer`'s host accounting:
    per phase, the other threads' CPU ms and the training thread's involuntary switches (None where not recorded)."""
    out: dict[str, float | None] = {}
    for key in HOST_KEYS:
        values = [v for r in ok for v in (r["iterations"].get(key) or [])[warmup:]
                  if v is not None and math.isfinite(v)]
        out[key] = median(values) if values else None
    return out


def aggregate(spec: RunSpec, runs: Sequence[dict[str, Any]], config: BenchConfig,
              model: dict[str, Any]) -> dict[str, Any]:
    """The result of one configuration from its repeats' raw results (any status)."""
    ok = [r for r in runs if r.get("status") == "ok"]
    status = _worst([r.get("status", "failed") for r in runs]) if runs else "failed"
    reasons = [f"repeat {r.get('repeat', 0) + 1}/{len(runs)}: {r.get('reason')}" if len(runs) > 1 else r.get("reason")
               for r in runs if r.get("status") != "ok"]
    result: dict[str, Any] = {
        "label": spec.label,
        "strategy": spec.strategy,
        "plan": spec.plan,
        "status": status,
        "reason": "; ".join(str(r) for r in reasons) if reasons else None,
        "repeats": len(runs),
        "repeats_ok": len(ok),
    }
    spreads = {phase: spread([v for r in ok for v in r["iterations"][phase][config.warmup:]]) for phase in PHASES}
    for phase in PHASES:
        result[phase] = None if spreads[phase] is None else spreads[phase].median
    result["spread"] = {phase: None if s is None else s.to_dict() for phase, s in spreads.items()}
    result["measured_iterations"] = 0 if spreads["iteration_ms"] is None else spreads["iteration_ms"].n
    iteration_ms = result["iteration_ms"]
    tokens = config.tokens_per_iteration
    result["tokens_per_iteration"] = tokens
    result["tokens_per_s"] = tokens / (iteration_ms / 1e3) if iteration_ms else None
    flops = model.get("flops_per_token")
    result["tflops_per_s"] = result["tokens_per_s"] * flops / 1e12 if result["tokens_per_s"] and flops else None
    for name in PEAK_FIELDS:
        result[name] = _max_or_none([r.get(name) for r in ok])
    losses = ok[0]["iterations"]["loss"] if ok else []
    result["final_loss"] = losses[-1] if losses else None
    result["losses"] = losses
    result["dos"] = summarize_dos(ok, config.warmup)
    result["host_threads"] = summarize_host_threads(ok, config.warmup)
    result["device"] = ok[0].get("device") if ok else None
    result["runs"] = [
        {
            "repeat": r.get("repeat", 0),
            "status": r.get("status"),
            "reason": r.get("reason"),
            "returncode": r.get("returncode"),
            "elapsed_s": r.get("elapsed_s"),
            "log": r.get("log"),
            "iteration_ms": median(r["iterations"]["iteration_ms"][config.warmup:]) if r.get("iterations") else None,
            "final_loss": r["iterations"]["loss"][-1] if r.get("iterations") else None,
        }
        for r in runs
    ]
    return result


def skipped(spec: RunSpec, reason: str) -> dict[str, Any]:
    """The raw result of a configuration the harness chose not to run."""
    return {**spec.to_dict(), "status": "skipped", "reason": reason}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def compare_to_baseline(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Add ``speedup_vs_zero3_offload`` and ``loss_vs_zero3_offload`` to every result; return the baseline.

    Speedups are ratios baseline time / configuration time (> 1 is faster than vanilla offload). Loss agreement
    is the absolute and relative difference of the final loss and the largest absolute difference over all
    iterations, both runs' first successful repeat.
    """
    base = next((r for r in results if r["strategy"] == BASELINE and r["iteration_ms"] is not None), None)
    for r in results:
        if base is None or r["iteration_ms"] is None:
            r["speedup_vs_zero3_offload"] = None
            r["loss_vs_zero3_offload"] = None
            continue
        r["speedup_vs_zero3_offload"] = {
            "iteration": _ratio(base["iteration_ms"], r["iteration_ms"]),
            "step": _ratio(base["step_ms"], r["step_ms"]),
            "bwd": _ratio(base["bwd_ms"], r["bwd_ms"]),
        }
        pairs = [(a, b) for a, b in zip(r["losses"], base["losses"]) if a is not None and b is not None]
        final = r["final_loss"]
        base_final = base["final_loss"]
        diff = abs(final - base_final) if final is not None and base_final is not None else None
        r["loss_vs_zero3_offload"] = {
            "final_abs_diff": diff,
            "final_rel_diff": diff / abs(base_final) if diff is not None and base_final else None,
            "max_abs_diff": max((abs(a - b) for a, b in pairs), default=None),
            "iterations_compared": len(pairs),
        }
    return base


def document(hardware: dict[str, Any], versions: dict[str, Any], config: BenchConfig, model: dict[str, Any],
             results: list[dict[str, Any]], date: str, timing_note: str) -> dict[str, Any]:
    """The results.json document."""
    measured = list(range(config.warmup + 1, config.steps + 1))
    return {
        "schema_version": SCHEMA_VERSION,
        "date": date,
        "hardware": hardware,
        "versions": versions,
        "config": config.to_dict(),
        "model": model,
        "measurement": {
            "warmup_iterations": list(range(1, config.warmup + 1)),
            "measured_iterations": measured,
            "statistic": "median over the measured iterations of all successful repeats; spread = min, p25, p75, "
                         "max",
            "timing": timing_note,
        },
        "baseline": BASELINE,
        "results": results,
    }


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a real, finite number (not None, NaN or a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
