"""Owns turning workers' raw measurements into figures and the output documents of both modes (pure Python).

**Strategy comparison** (results.json): one result per configuration pools the measured iterations (warm-up
excluded) of all its successful repeats. The headline, what a user sees: ``e2e_iteration_ms``, the median over the
end-to-end window (``BenchConfig.e2e_iterations``, unsynchronised) of ``end_k - end_(k-1)`` (:func:`e2e_samples`),
and ``e2e_tokens_per_s``. Then, from the synchronised iterations after that window only
(``BenchConfig.phase_iterations``): fwd / bwd / step / iteration medians with their spread, throughput, host-thread
accounting and, for DOS, a summary of the manager's update records of those same iterations. Also peak memory, the
final loss and the last synchronised iteration's timeline. Comparisons against the vanilla ``zero3_offload`` run of
the same invocation at the same device count (speedups as ratios, end to end included; loss agreement) are added
here, so report and chart only format.

**Data parallel** (``--devices``): a row at N devices counts the tokens of all N ranks (micro-batch x seq-len x N per
iteration), so its tokens/s are totals; its times are rank 0's (the gradient all-reduce keeps the ranks' iterations
in step), each rank's own figures are under ``per_rank``, ``peak_host_gib`` is the sum over the ranks (they share the
host) and ``peak_gpu_gib`` the largest rank's. With more than one device count, :func:`scaling` sets each
configuration's speedup over vanilla at N devices against its speedup at the smallest count, and its tokens/s.

**Plan sweep** (sweep.json): per fixed plan, the median update-phase makespan of its iterations after the first
(warm-up), the median of the manager's predictions for those same update phases (made just before each, from the
parameters calibrated so far), the median relative prediction error ``|predicted - measured| / measured``, the
device fraction as run (after any demotion to fit memory) and the most subgroups demoted. For ``auto``, which runs
interleaved with the fixed plans in the same process: the same over its update phases after the probe, the first
step of the plan it chose and its warm-up; then ``auto`` against the best swept plan and the fastest ``stride:K``, as
ratios (the project's own targets for them are in ``scripts/targets.py``, not in a report).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import (
    AUTO,
    AUTO_MIN_EXCLUDED,
    HOST_KEYS,
    PHASE_PEAKS,
    PHASES,
    PLAN_WARMUP,
    BenchConfig,
    Budget,
    SweepConfig,
    sweep_schedule,
)
from lightning_dos.bench.stats import median, spread
from lightning_dos.bench.strategies import BASELINE, RunSpec, base_label, devices_of, plan_argument, strategy_arguments
from lightning_dos.planning.plan import parse_plan
from lightning_dos.planning.trials import TRIAL_SOURCE

SCHEMA_VERSION = 1
#: How the headline was measured, for results.json and the report.
E2E_NOTE = ("no synchronisation at all in these iterations (no phase marks, losses read after training); each "
            "sample is the wall time from the previous iteration's end to this one's (time.perf_counter at "
            "on_train_batch_end), so it includes loading the batch and any overlap of host and device work that a "
            "training loop gets")

#: Status order from best to worst; a configuration reports its worst repeat.
STATUSES = ("ok", "skipped", "timeout", "oom", "failed")
#: DOS update-record fields summarised by their median over measured update phases.
DOS_FIELDS = ("update_ms", "host_busy_ms", "device_busy_ms", "device_fraction", "h2d_gb", "d2h_gb")
PEAK_FIELDS = ("peak_gpu_gib", "peak_gpu_reserved_gib", "peak_host_gib", "peak_host_rss_sampled_gib",
               "ru_maxrss_gib")
#: Peaks of the host, summed over a run's ranks (one host holds them all).
HOST_PEAKS = ("peak_host_gib", "peak_host_rss_sampled_gib", "ru_maxrss_gib")
#: Peaks of a GPU, the largest over a run's ranks (one GPU each).
GPU_PEAKS = ("peak_gpu_gib", "peak_gpu_reserved_gib")


def _max_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=lambda s: STATUSES.index(s) if s in STATUSES else len(STATUSES))


def _pick(values: Sequence[Any] | None, indices: Sequence[int]) -> list[Any]:
    """``values`` at ``indices`` (those present)."""
    values = values or []
    return [values[i] for i in indices if i < len(values)]


def e2e_samples(iterations: dict[str, Any], config: BenchConfig) -> list[float]:
    """The end-to-end ms of each iteration ``k`` of ``config.e2e_iterations``: ``end_k - end_(k-1)`` from the raw
    ``end_s`` (seconds since training started, so with no warm-up the first is measured from the training start).

    It includes what runs between two iterations (the next batch's loading, Lightning's bookkeeping), as in any
    training loop. Empty without ``end_s`` (results from before it was recorded).
    """
    ends = iterations.get("end_s") or []
    samples = []
    for k in config.e2e_iterations:
        previous = ends[k - 1] if 0 < k <= len(ends) else 0.0
        if k < len(ends) and ends[k] is not None and previous is not None:
            samples.append((ends[k] - previous) * 1e3)
    return samples


def _dos_steps(runs: Sequence[dict[str, Any]], indices: Sequence[int]) -> list[dict[str, Any]]:
    """The DOS update records of iterations ``indices`` of ``runs``, pooled. A run whose records are not one per
    iteration contributes all of them after the first index's."""
    steps = []
    for r in runs:
        record_steps = r["dos"]["steps"]
        ran = len((r.get("iterations") or {}).get("iteration_ms") or [])
        aligned = len(record_steps) == ran  # one update phase per iteration: the records follow the iterations
        steps += _pick(record_steps, indices) if aligned else record_steps[min(indices, default=0):]
    return steps


def summarize_dos(runs: Sequence[dict[str, Any]], indices: Sequence[int]) -> dict[str, Any] | None:
    """Medians of the DOS manager's update records of iterations ``indices``, pooled over ``runs``; None without
    records. A run whose records are not one per iteration contributes all of them after the first index's."""
    with_dos = [r for r in runs if r.get("dos")]
    if not with_dos:
        return None
    steps = _dos_steps(with_dos, indices)
    first = with_dos[0]["dos"]
    summary: dict[str, Any] = {
        "active": first["active"],
        "subgroups": first["subgroups"],
        "largest_subgroup": first.get("largest_subgroup"),
        "resident_subgroups": first.get("resident_subgroups", []),
        "resident_params": first.get("resident_params", 0),
        "plan": first["plan"],
        "lanes": [step["lanes"] for step in first["steps"]],
        "update_phases": len(steps),
        "demoted_subgroups_max": max((step["demoted_subgroups"] for step in steps), default=0),
    }
    for name in DOS_FIELDS:
        summary[name] = median([step[name] for step in steps])
    # device memory the executor held for the phase (slots, scratch, upload ring); absent from earlier reports
    buffers = [step.get("device_buffer_gib") for step in steps]
    summary["device_buffer_gib"] = median(buffers) if buffers and None not in buffers else None
    update = spread([step["update_ms"] for step in steps])
    summary["update_ms_spread"] = None if update is None else update.to_dict()
    return summary


def summarize_host_threads(ok: Sequence[dict[str, Any]], indices: Sequence[int]) -> dict[str, float | None]:
    """Medians over iterations ``indices`` of :class:`~lightning_dos.bench.timing.PhaseTimer`'s host accounting:
    per phase, the other threads' CPU ms and the training thread's involuntary switches (None where not recorded)."""
    out: dict[str, float | None] = {}
    for key in HOST_KEYS:
        values = [v for r in ok for v in _pick(r["iterations"].get(key), indices)
                  if v is not None and math.isfinite(v)]
        out[key] = median(values) if values else None
    return out


def summarize_phase_peaks(ok: Sequence[dict[str, Any]], indices: Sequence[int]) -> dict[str, float | None] | None:
    """The largest peak GPU memory (GiB) of each phase (``fwd``, ``bwd``, ``step``) over the synchronised iterations
    ``indices`` of every rank of the successful repeats ``ok``; None when no phase's peak was measured (off a GPU)."""
    out: dict[str, float | None] = {}
    for key in PHASE_PEAKS:
        values = [v for r in ok for e in rank_entries(r) for v in _pick((e.get("iterations") or {}).get(key), indices)
                  if v is not None and math.isfinite(v)]
        out[key.removesuffix("_peak_gpu_gib")] = max(values) if values else None
    return out if any(v is not None for v in out.values()) else None


def rank_entries(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A raw result's measurements per rank (``per_rank``); a result without them (hand-made, or from before they
    were recorded) is its own rank 0."""
    entries = run.get("per_rank")
    if entries:
        return list(entries)
    keys = ("iterations", *HOST_PEAKS, *GPU_PEAKS, "dos", "iteration_timeline")
    return [{"rank": 0, **{key: run.get(key) for key in keys}}]


def _sum_or_none(values: Sequence[float | None]) -> float | None:
    """The sum, or None when any value (or all: none given) is missing."""
    present = [v for v in values if v is not None]
    return sum(present) if present and len(present) == len(values) else None


def run_peaks(run: dict[str, Any]) -> dict[str, float | None]:
    """A raw result's peaks over its ranks: host peaks summed (the ranks share the host), GPU peaks the largest."""
    entries = rank_entries(run)
    peaks = {name: _sum_or_none([e.get(name) for e in entries]) for name in HOST_PEAKS}
    peaks.update({name: _max_or_none([e.get(name) for e in entries]) for name in GPU_PEAKS})
    return peaks


def summarize_ranks(ok: Sequence[dict[str, Any]], config: BenchConfig) -> list[dict[str, Any]]:
    """Each rank's own figures, pooled over the successful repeats ``ok``: its synchronised and end-to-end iteration
    samples and medians, its end times and losses (first repeat), peak host and GPU memory, DOS update phases (the
    medians of :func:`summarize_dos` and ``update_ms`` of every measured update phase) and iteration timeline."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for run in ok:
        for entry in rank_entries(run):
            by_rank.setdefault(int(entry.get("rank", 0)), []).append(entry)
    indices = config.phase_iterations
    out = []
    for rank, entries in sorted(by_rank.items()):
        iterations = [e.get("iterations") or {} for e in entries]
        synchronised = [v for it in iterations for v in _pick(it.get("iteration_ms"), indices)
                        if v is not None and math.isfinite(v)]
        e2e = [v for it in iterations for v in e2e_samples(it, config)]
        with_dos = [e for e in entries if e.get("dos")]
        dos = summarize_dos(with_dos, indices)
        if dos is not None:
            dos["update_ms_per_step"] = [step["update_ms"] for step in _dos_steps(with_dos, indices)]
        losses = iterations[0].get("loss") or []
        out.append({
            "rank": rank,
            "iteration_ms": median(synchronised),
            "iteration_ms_samples": synchronised,
            "e2e_iteration_ms": median(e2e),
            "e2e_samples": e2e,
            "end_s": iterations[0].get("end_s"),
            "final_loss": losses[-1] if losses else None,
            "losses": losses,
            **{name: _max_or_none([e.get(name) for e in entries]) for name in (*HOST_PEAKS, *GPU_PEAKS)},
            "dos": dos,
            "iteration_timeline": next((e["iteration_timeline"] for e in entries if e.get("iteration_timeline")),
                                       None),
            "cores": entries[0].get("cores"),
        })
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
        "devices": spec.devices,
        "status": status,
        "reason": "; ".join(str(r) for r in reasons) if reasons else None,
        "repeats": len(runs),
        "repeats_ok": len(ok),
        "strategy_args": strategy_arguments(config, spec),
    }
    tokens = config.global_tokens_per_iteration(spec.devices)  # every rank's: the figures below are totals
    result["tokens_per_iteration"] = tokens
    # the headline: end to end, unsynchronised
    e2e = spread([v for r in ok for v in e2e_samples(r["iterations"], config)])
    result["e2e_iteration_ms"] = None if e2e is None else e2e.median
    result["e2e_tokens_per_s"] = tokens / (e2e.median / 1e3) if e2e is not None and e2e.median > 0 else None
    result["e2e_measured_iterations"] = 0 if e2e is None else e2e.n
    # phase by phase: the synchronised iterations only
    phase_indices = config.phase_iterations
    spreads = {phase: spread([v for r in ok for v in _pick(r["iterations"][phase], phase_indices)])
               for phase in PHASES}
    for phase in PHASES:
        result[phase] = None if spreads[phase] is None else spreads[phase].median
    result["spread"] = {phase: None if s is None else s.to_dict() for phase, s in spreads.items()}
    result["spread"]["e2e_iteration_ms"] = None if e2e is None else e2e.to_dict()
    result["measured_iterations"] = 0 if spreads["iteration_ms"] is None else spreads["iteration_ms"].n
    iteration_ms = result["iteration_ms"]
    result["tokens_per_s"] = tokens / (iteration_ms / 1e3) if iteration_ms else None
    flops = model.get("flops_per_token")
    result["tflops_per_s"] = result["tokens_per_s"] * flops / 1e12 if result["tokens_per_s"] and flops else None
    peaks = [run_peaks(r) for r in ok]
    for name in PEAK_FIELDS:
        result[name] = _max_or_none([p[name] for p in peaks])
    result["peak_gpu_gib_by_phase"] = summarize_phase_peaks(ok, phase_indices)
    per_rank = summarize_ranks(ok, config)
    result["peak_host_gib_per_rank"] = [r["peak_host_gib"] for r in per_rank]
    losses = ok[0]["iterations"]["loss"] if ok else []
    result["final_loss"] = losses[-1] if losses else None
    result["losses"] = losses
    result["dos"] = summarize_dos(ok, phase_indices)
    result["host_threads"] = summarize_host_threads(ok, phase_indices)
    result["iteration_timeline"] = next((r["iteration_timeline"] for r in ok if r.get("iteration_timeline")), None)
    result["device"] = ok[0].get("device") if ok else None
    result["per_rank"] = per_rank
    result["runs"] = [
        {
            "repeat": r.get("repeat", 0),
            "status": r.get("status"),
            "reason": r.get("reason"),
            "returncode": r.get("returncode"),
            "elapsed_s": r.get("elapsed_s"),
            "log": r.get("log"),
            "e2e_iteration_ms": median(e2e_samples(r["iterations"], config)) if r.get("iterations") else None,
            "iteration_ms": median(_pick(r["iterations"]["iteration_ms"], phase_indices))
            if r.get("iterations") else None,
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
    """Add ``speedup_vs_zero3_offload`` and ``loss_vs_zero3_offload`` to every result, each against the baseline at
    the same device count; return the baseline of the first device count that has one.

    Speedups are ratios baseline time / configuration time (> 1 is faster than vanilla offload): ``e2e_iteration``
    end to end (None where either has no end-to-end figure), the others synchronised. Loss agreement
    is the absolute and relative difference of the final loss and the largest absolute difference over all
    iterations, both runs' first successful repeat (rank 0's losses).
    """
    bases: dict[int, dict[str, Any]] = {}
    for r in results:
        if r["strategy"] == BASELINE and r["iteration_ms"] is not None:
            bases.setdefault(devices_of(r), r)
    for r in results:
        base = bases.get(devices_of(r))
        if base is None or r["iteration_ms"] is None:
            r["speedup_vs_zero3_offload"] = None
            r["loss_vs_zero3_offload"] = None
            continue
        r["speedup_vs_zero3_offload"] = {
            "e2e_iteration": _ratio(base.get("e2e_iteration_ms"), r.get("e2e_iteration_ms")),
            "iteration": _ratio(base["iteration_ms"], r["iteration_ms"]),
            "step": _ratio(base["step_ms"], r["step_ms"]),
            "bwd": _ratio(base["bwd_ms"], r["bwd_ms"]),
            "peak_gpu": _ratio(r.get("peak_gpu_gib"), base.get("peak_gpu_gib")),  # memory: this row's over vanilla's
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
    return next(iter(bases.values()), None)


def _scale(at_reference: float | None, at_n: float | None) -> dict[str, float | None]:
    return {"reference": at_reference, "at_n": at_n, "ratio": _ratio(at_n, at_reference)}


def scaling(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The data-parallel section: for each configuration that completed at the smallest device count and at a larger
    one N, its speedup over ``zero3_offload`` at N against the same at the smallest count (end to end, and
    synchronised), and its tokens/s at N over its tokens/s there. None with fewer than two device counts.

    Each row: ``label`` (the configuration, without ``@dp<N>``), ``strategy``, ``plan``, ``devices`` (N),
    ``reference_devices``, and ``{reference, at_n, ratio}`` for ``speedup_e2e``, ``speedup_iteration``,
    ``e2e_tokens_per_s`` and ``tokens_per_s`` (the ratio is at N over at the reference: for speedups how much of the
    advantage over vanilla data parallelism keeps, for tokens/s how throughput scales).
    """
    counts = sorted({devices_of(r) for r in results})
    if len(counts) < 2:
        return None
    reference = counts[0]
    done = {(base_label(r["label"]), devices_of(r)): r for r in results
            if r["status"] == "ok" and r.get("iteration_ms") is not None}
    rows = []
    for devices in counts[1:]:
        for r in results:
            label = base_label(r["label"])
            ref, at_n = done.get((label, reference)), done.get((label, devices))
            if devices_of(r) != devices or ref is None or at_n is None:
                continue
            speedup = {key: (ref.get("speedup_vs_zero3_offload") or {}).get(key) for key in ("e2e_iteration",
                                                                                            "iteration")}
            speedup_n = {key: (at_n.get("speedup_vs_zero3_offload") or {}).get(key) for key in ("e2e_iteration",
                                                                                               "iteration")}
            rows.append({
                "label": label, "strategy": r["strategy"], "plan": r["plan"], "devices": devices,
                "reference_devices": reference,
                "speedup_e2e": _scale(speedup["e2e_iteration"], speedup_n["e2e_iteration"]),
                "speedup_iteration": _scale(speedup["iteration"], speedup_n["iteration"]),
                "e2e_tokens_per_s": _scale(ref.get("e2e_tokens_per_s"), at_n.get("e2e_tokens_per_s")),
                "tokens_per_s": _scale(ref.get("tokens_per_s"), at_n.get("tokens_per_s")),
            })
    return {"device_counts": counts, "reference_devices": reference, "baseline": BASELINE, "rows": rows}


def bench_document(hardware: dict[str, Any], versions: dict[str, Any], config: BenchConfig, model: dict[str, Any],
             results: list[dict[str, Any]], date: str, timing_note: str) -> dict[str, Any]:
    """The results.json document."""
    measured = list(range(config.warmup + 1, config.steps + 1))
    e2e = [k + 1 for k in config.e2e_iterations]
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
            "e2e_iterations": e2e,
            "phase_iterations": [k + 1 for k in config.phase_iterations],
            "statistic": "median over the measured iterations of all successful repeats; spread = min, p25, p75, "
                         "max",
            "e2e": E2E_NOTE,
            "timing": timing_note,
        },
        "baseline": BASELINE,
        "results": results,
    }


# ------------------------------------------------------------------ plan sweep

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


def _phase(result: dict[str, Any], phase: str, indices: Sequence[int]) -> float | None:
    samples = (result.get("iterations") or {}).get(phase) or []
    return median([samples[i] for i in indices if i < len(samples)])


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


def failed_plan_of(result: dict[str, Any], steps_per_plan: int, plans: Sequence[str],
                   auto_steps: int = 0) -> str | None:
    """The plan in force when a sweep process stopped without completing (``auto`` for its part), or None."""
    if result.get("status") == "ok":
        return None
    if result.get("failed_plan"):
        return str(result["failed_plan"])
    iterations = (result.get("sweep") or {}).get("iterations") or []
    if not plans:
        return None
    # only completed iterations reach progress.json: the run stopped in the next one
    schedule = sweep_schedule(plans, steps_per_plan, auto_steps)
    return schedule[min(len(iterations), len(schedule) - 1)]


def summarize_plans(result: dict[str, Any], sweep: SweepConfig) -> list[dict[str, Any]]:
    """One summary per swept plan of a fixed-plan process's raw result (complete, partial or empty)."""
    raw = result.get("sweep") or {}
    iterations = raw.get("iterations") or []
    resolved = {entry["plan"]: entry for entry in raw.get("resolved") or []}
    status = result.get("status", "failed")
    failed = failed_plan_of(result, sweep.steps_per_plan, sweep.plans, sweep.auto_steps)
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
            "iteration_ms": _phase(result, "iteration_ms", indices),
            "step_ms": _phase(result, "step_ms", indices),
        })
    return out


def auto_status(result: dict[str, Any], sweep: SweepConfig, ran: int) -> tuple[str, str | None]:
    """Status and reason of ``auto``'s part of a sweep process that ran ``ran`` of its iterations to the end."""
    status = result.get("status", "failed")
    failed = failed_plan_of(result, sweep.steps_per_plan, sweep.plans, sweep.auto_steps)
    if status == "ok" or failed == AUTO:
        return status, result.get("reason")
    if ran:  # stopped during a fixed plan: auto's iterations so far still count, as the fixed plans' do
        return "ok", f"{ran} of {sweep.auto_steps} iterations: the process stopped during plan {failed} ({status})"
    return NOT_RUN, f"the process stopped before auto ({status})"


def summarize_auto(result: dict[str, Any], sweep: SweepConfig) -> dict[str, Any]:
    """``auto``'s figures over its update phases after the probe, the first step of its plan and the warm-up.

    ``auto`` ran interleaved with the fixed plans in the same process (its iterations are the sweep's ``auto``
    entries).
    """
    iterations = [it for it in (result.get("sweep") or {}).get("iterations") or [] if it["plan"] == AUTO]
    tagged = [(it["iteration"], record) for it in iterations for record in it["records"]]
    steps = [record for _, record in tagged]
    probe = next((i for i, step in enumerate(steps) if step.get("replanned")), None)  # the probe's last step
    # the probe's steps and the first step of the plan chosen after them
    skip = max(sweep.bench.warmup, AUTO_MIN_EXCLUDED if probe is None else probe + 2)
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
        "iteration_ms": _phase(result, "iteration_ms", indices),
        "step_ms": _phase(result, "step_ms", indices),
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
    return {"auto_vs_best": _ratio(auto_ms, best["update_ms"] if best else None),
            "fastest_stride": None if fastest is None else {"plan": fastest["plan"], "update_ms": fastest["update_ms"]},
            "auto_vs_fastest_stride": _ratio(auto_ms, fastest["update_ms"] if fastest else None)}


def summarize_budget(budget: Budget, result: dict[str, Any], sweep: SweepConfig) -> dict[str, Any]:
    """Everything sweep.json records for one budget, from its process's raw result (fixed plans and auto)."""
    plans = summarize_plans(result, sweep)
    auto_summary = summarize_auto(result, sweep)
    best = best_plan(plans)
    errors = [e for p in plans for e in p["rel_errors"]]
    return {
        "budget": budget.to_dict(),
        "fixed": {**_process(result),
                  "failed_plan": failed_plan_of(result, sweep.steps_per_plan, sweep.plans, sweep.auto_steps),
                  "plans_completed": sum(p["status"] == "ok" for p in plans)},
        "plans": plans,
        "auto": auto_summary,
        "best": None if best is None else {"plan": best["plan"], "update_ms": best["update_ms"]},
        "prediction_error_median": median(errors),
        "prediction_steps": len(errors),
        **sweep_ratios(plans, auto_summary),
    }


def sweep_document(hardware: dict[str, Any], versions: dict[str, Any], sweep: SweepConfig, model: dict[str, Any],
             budgets: list[dict[str, Any]], date: str, timing_note: str, interrupted: bool = False) -> dict[str, Any]:
    """The sweep.json document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "plan_sweep",
        "date": date,
        "hardware": hardware,
        "versions": versions,
        "config": sweep.bench.to_dict(),
        "sweep": sweep.to_dict(),
        "model": model,
        "measurement": {
            "fixed_plans": f"one process per budget runs every plan for {sweep.steps_per_plan} iterations, in "
                           f"rounds of one iteration of each plan in the order given; the first round is left out "
                           "and the rest summarised by their median",
            "auto": f"the same process runs plan auto for {sweep.auto_steps} iterations spread evenly over the "
                    "rounds after the first, started cold (the starting cost values, then its probe) and keeping its "
                    f"own calibration; the first {sweep.auto_excluded} (the probe steps, the first step of the chosen "
                    "plan, warm-up) are left out",
            "update_ms": "the DOS update phase's makespan (both lanes), from the manager's records",
            "predicted_ms": "the manager's prediction for that update phase, made just before it with the cost "
                            "parameters calibrated on every earlier update phase of the process (earlier plans' "
                            "included)",
            "prediction_error": "|predicted - measured| / measured per update phase; median over the measured "
                                "update phases",
            "timing": timing_note,
        },
        "interrupted": interrupted,
        "budgets": budgets,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a reader never sees half a file); NaN becomes null."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_finite(data), fh, indent=2)
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
