"""Owns a comparison's figures from raw measurements, and results.json (pure Python): per configuration, pooled over
its successful repeats, the median end-to-end iteration (:func:`e2e_samples`: the headline), the synchronised phases,
throughput, peaks, losses, DOS's update records and each against ``zero3_offload`` at the same device count. A row
at N devices counts every rank's tokens, takes rank 0's times and sums the ranks' host peaks (``per_rank``: each
rank's own); :func:`scaling` sets each configuration at N devices against itself at the smallest count.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench.settings import Run, Windows
from lightning_dos.bench.stats import HOST_KEYS, PHASE_PEAKS, PHASES, finite, median, spread

#: The control every speedup and loss comparison is measured against.
BASELINE = "zero3_offload"
#: The suffix of a row's label at more than one device: ``dos(auto)@dp2``.
DP_SUFFIX = "@dp"

#: How the headline was measured, for results.json and the report.
E2E_NOTE = ("no synchronisation at all in these iterations (no phase marks, losses read after training); each "
            "sample is the wall time from the previous iteration's end to this one's (time.perf_counter at "
            "on_train_batch_end), so it includes loading the batch and any overlap of host and device work that a "
            "training loop gets")

#: Status order from best to worst; a configuration reports its worst repeat.
STATUSES = ("ok", "skipped", "timeout", "oom", "failed")
#: DOS update-record fields summarised by their median over measured update phases.
DOS_FIELDS = ("update_ms", "host_busy_ms", "device_busy_ms", "device_fraction", "h2d_gb", "d2h_gb")
#: Peaks of the host, summed over a run's ranks (one host holds them all).
HOST_PEAKS = ("peak_host_gib", "peak_host_rss_sampled_gib", "ru_maxrss_gib")
#: Peaks of a GPU, the largest over a run's ranks (one GPU each).
GPU_PEAKS = ("peak_gpu_gib", "peak_gpu_reserved_gib")
PEAK_FIELDS = (*GPU_PEAKS, *HOST_PEAKS)


def devices_of(result: dict[str, Any]) -> int:
    """The device count of a result (1 for those from before ``--devices``)."""
    return int(result.get("devices") or 1)


def base_label(label: str) -> str:
    """A row's label without its ``@dp<N>`` suffix: the configuration it measures at any device count."""
    head, sep, tail = label.rpartition(DP_SUFFIX)
    return head if sep and tail.isdigit() else label


def _worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=lambda s: STATUSES.index(s) if s in STATUSES else len(STATUSES))


def pick(values: Sequence[Any] | None, indices: Sequence[int]) -> list[Any]:
    """``values`` at ``indices`` (those present)."""
    values = values or []
    return [values[i] for i in indices if i < len(values)]


def e2e_samples(iterations: dict[str, Any], config: Windows) -> list[float]:
    """The end-to-end ms of each end-to-end iteration ``k``: ``end_k - end_(k-1)`` (the first from the training
    start without warm-up), what a training loop sees; empty without end times."""
    ends = iterations.get("end_s") or []
    samples = []
    for k in config.e2e_iterations:
        previous = ends[k - 1] if 0 < k <= len(ends) else 0.0
        if k < len(ends) and ends[k] is not None and previous is not None:
            samples.append((ends[k] - previous) * 1e3)
    return samples


def series(entries: Sequence[dict[str, Any]], key: str, indices: Sequence[int]) -> list[float]:
    """The finite values of the iteration series ``key`` at ``indices``, pooled over ``entries`` (raw results or
    rank entries)."""
    return finite(v for e in entries for v in pick((e.get("iterations") or {}).get(key), indices))


def phase_figures(entries: Sequence[dict[str, Any]], config: Windows) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each phase's median over the synchronised iterations of ``entries``, and its spread (None without samples)."""
    spreads = {phase: spread(series(entries, phase, config.phase_iterations)) for phase in PHASES}
    return ({phase: None if s is None else s.median for phase, s in spreads.items()},
            {phase: None if s is None else s.to_dict() for phase, s in spreads.items()})


def _losses(iterations: dict[str, Any]) -> dict[str, Any]:
    losses = iterations.get("loss") or []
    return {"final_loss": losses[-1] if losses else None, "losses": losses}


def _dos_steps(runs: Sequence[dict[str, Any]], indices: Sequence[int]) -> list[dict[str, Any]]:
    """The DOS update records of iterations ``indices``, pooled (all after the first index's where they are not one
    per iteration)."""
    steps = []
    for r in runs:
        record_steps = r["dos"]["steps"]
        ran = len((r.get("iterations") or {}).get("iteration_ms") or [])
        aligned = len(record_steps) == ran  # one update phase per iteration: the records follow the iterations
        steps += pick(record_steps, indices) if aligned else record_steps[min(indices, default=0):]
    return steps


def summarize_dos(runs: Sequence[dict[str, Any]], indices: Sequence[int],
                  per_step: bool = False) -> dict[str, Any] | None:
    """Medians of the DOS update records of iterations ``indices``, pooled over ``runs`` (``per_step``: with every
    record's ``update_ms``); None without records."""
    with_dos = [r for r in runs if r.get("dos")]
    if not with_dos:
        return None
    steps = _dos_steps(with_dos, indices)
    first = with_dos[0]["dos"]
    summary: dict[str, Any] = {
        "active": first["active"],
        "overlapped": first.get("overlapped"),
        "subgroups": first["subgroups"],
        "largest_subgroup": first.get("largest_subgroup"),
        "resident_subgroups": first.get("resident_subgroups", []),
        "resident_params": first.get("resident_params", 0),
        "plan": first["plan"],
        "lanes": [step["lanes"] for step in first["steps"]],
        "update_phases": len(steps),
        "demoted_subgroups_max": max((step["demoted_subgroups"] for step in steps), default=0),
        **{name: median([step[name] for step in steps]) for name in DOS_FIELDS},
    }
    # device memory the executor held for the phase (slots, scratch, upload ring); absent from earlier reports
    buffers = [step.get("device_buffer_gib") for step in steps]
    summary["device_buffer_gib"] = median(buffers) if buffers and None not in buffers else None
    update = spread([step["update_ms"] for step in steps])
    summary["update_ms_spread"] = None if update is None else update.to_dict()
    if per_step:
        summary["update_ms_per_step"] = [step["update_ms"] for step in steps]
    return summary


def summarize_host_threads(ok: Sequence[dict[str, Any]], indices: Sequence[int]) -> dict[str, float | None]:
    """Medians over iterations ``indices`` of the other threads' CPU ms and the training thread's involuntary
    switches, per phase."""
    return {key: median(series(ok, key, indices)) for key in HOST_KEYS}


def summarize_phase_peaks(ok: Sequence[dict[str, Any]], indices: Sequence[int]) -> dict[str, float | None] | None:
    """The largest peak GPU GiB of each phase over the synchronised iterations of every rank; None off a GPU."""
    entries = [e for r in ok for e in rank_entries(r)]
    out = {key.removesuffix("_peak_gpu_gib"): max(series(entries, key, indices), default=None) for key in PHASE_PEAKS}
    return out if any(v is not None for v in out.values()) else None


def rank_entries(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A raw result's measurements per rank; one without ``per_rank`` is its own rank 0."""
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
    """A raw result's peaks over its ranks: host peaks summed (one host), GPU peaks the largest."""
    entries = rank_entries(run)
    peaks = {name: _sum_or_none([e.get(name) for e in entries]) for name in HOST_PEAKS}
    peaks.update({name: max(finite(e.get(name) for e in entries), default=None) for name in GPU_PEAKS})
    return peaks


def summarize_ranks(ok: Sequence[dict[str, Any]], config: Windows) -> list[dict[str, Any]]:
    """Each rank's own figures, pooled over the successful repeats ``ok``."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for run in ok:
        for entry in rank_entries(run):
            by_rank.setdefault(int(entry.get("rank", 0)), []).append(entry)
    out = []
    for rank, entries in sorted(by_rank.items()):
        synchronised = series(entries, "iteration_ms", config.phase_iterations)
        e2e = [v for e in entries for v in e2e_samples(e.get("iterations") or {}, config)]
        first = entries[0].get("iterations") or {}
        out.append({
            "rank": rank,
            "iteration_ms": median(synchronised),
            "iteration_ms_samples": synchronised,
            "e2e_iteration_ms": median(e2e),
            "e2e_samples": e2e,
            "end_s": first.get("end_s"),
            **_losses(first),
            **{name: max(finite(e.get(name) for e in entries), default=None) for name in (*HOST_PEAKS, *GPU_PEAKS)},
            "dos": summarize_dos(entries, config.phase_iterations, per_step=True),
            "iteration_timeline": next((e["iteration_timeline"] for e in entries if e.get("iteration_timeline")),
                                       None),
            "cores": entries[0].get("cores"),
        })
    return out


def aggregate(spec: Run, runs: Sequence[dict[str, Any]], tokens: int | None,
              model: dict[str, Any]) -> dict[str, Any]:
    """The result of one configuration from its repeats' raw results (any status); ``tokens`` per iteration and
    device."""
    ok = [r for r in runs if r.get("status") == "ok"]
    status = _worst([r.get("status", "failed") for r in runs]) if runs else "failed"
    reasons = [f"repeat {r.get('repeat', 0) + 1}/{len(runs)}: {r.get('reason')}" if len(runs) > 1 else r.get("reason")
               for r in runs if r.get("status") != "ok"]
    result: dict[str, Any] = {
        "label": spec.label, "strategy": spec.strategy, "plan": spec.plan, "devices": spec.devices, "status": status,
        "reason": "; ".join(str(r) for r in reasons) if reasons else None, "repeats": len(runs), "repeats_ok": len(ok),
        "strategy_config": f"configs/strategy/{spec.fragment}.yaml" if spec.fragment else None,
        "strategy_args": spec.args}
    tokens = tokens * spec.devices if tokens else None  # every rank's: the figures below are totals
    result["tokens_per_iteration"] = tokens
    # the headline: end to end, unsynchronised
    e2e = spread([v for r in ok for v in e2e_samples(r["iterations"], spec)])
    result["e2e_iteration_ms"] = None if e2e is None else e2e.median
    result["e2e_tokens_per_s"] = tokens / (e2e.median / 1e3) if tokens and e2e and e2e.median > 0 else None
    result["e2e_measured_iterations"] = 0 if e2e is None else e2e.n
    # phase by phase: the synchronised iterations only
    phase_indices = spec.phase_iterations
    medians, spreads = phase_figures(ok, spec)
    result.update(medians)
    result["spread"] = {**spreads, "e2e_iteration_ms": None if e2e is None else e2e.to_dict()}
    result["measured_iterations"] = 0 if spreads["iteration_ms"] is None else spreads["iteration_ms"]["n"]
    iteration_ms = result["iteration_ms"]
    result["tokens_per_s"] = tokens / (iteration_ms / 1e3) if tokens and iteration_ms else None
    flops = model.get("flops_per_token")
    result["tflops_per_s"] = result["tokens_per_s"] * flops / 1e12 if result["tokens_per_s"] and flops else None
    peaks = [run_peaks(r) for r in ok]
    result.update({name: max(finite(p[name] for p in peaks), default=None) for name in PEAK_FIELDS})
    result["host_in_use_gib"] = max(finite(r.get("host_in_use_gib") for r in ok), default=None)
    result["peak_gpu_gib_by_phase"] = summarize_phase_peaks(ok, phase_indices)
    per_rank = summarize_ranks(ok, spec)
    result["peak_host_gib_per_rank"] = [r["peak_host_gib"] for r in per_rank]
    result.update(_losses(ok[0]["iterations"] if ok else {}))
    result["dos"] = summarize_dos(ok, phase_indices)
    result["host_threads"] = summarize_host_threads(ok, phase_indices)
    result["iteration_timeline"] = next((r["iteration_timeline"] for r in ok if r.get("iteration_timeline")), None)
    result["device"] = ok[0].get("device") if ok else None
    result["per_rank"] = per_rank
    result["runs"] = [
        {**{key: r.get(key) for key in ("status", "reason", "returncode", "elapsed_s", "log")},
         "repeat": r.get("repeat", 0),
         "e2e_iteration_ms": median(e2e_samples(r["iterations"], spec)) if r.get("iterations") else None,
         "iteration_ms": median(series([r], "iteration_ms", phase_indices)),
         "final_loss": r["iterations"]["loss"][-1] if r.get("iterations") else None}
        for r in runs]
    return result


def skipped(spec: Run, reason: str) -> dict[str, Any]:
    """The raw result of a run not made."""
    return {**spec.to_dict(), "status": "skipped", "reason": reason}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def compare_to_baseline(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Add ``speedup_vs_zero3_offload`` (vanilla's time over each row's: end to end, synchronised; and each
    row's peak GPU memory over vanilla's) and ``loss_vs_zero3_offload`` to every result, against vanilla at the same
    device count; return the baseline of the first device count that has one."""
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
            "e2e_iteration": ratio(base.get("e2e_iteration_ms"), r.get("e2e_iteration_ms")),
            "iteration": ratio(base["iteration_ms"], r["iteration_ms"]),
            "step": ratio(base["step_ms"], r["step_ms"]),
            "bwd": ratio(base["bwd_ms"], r["bwd_ms"]),
            "peak_gpu": ratio(r.get("peak_gpu_gib"), base.get("peak_gpu_gib")),  # memory: this row's over vanilla's
        }
        pairs = [(a, b) for a, b in zip(r["losses"], base["losses"]) if a is not None and b is not None]
        final, base_final = r["final_loss"], base["final_loss"]
        diff = abs(final - base_final) if final is not None and base_final is not None else None
        r["loss_vs_zero3_offload"] = {
            "final_abs_diff": diff,
            "final_rel_diff": diff / abs(base_final) if diff is not None and base_final else None,
            "max_abs_diff": max((abs(a - b) for a, b in pairs), default=None),
            "iterations_compared": len(pairs),
        }
    return next(iter(bases.values()), None)


def _scale(at_reference: float | None, at_n: float | None) -> dict[str, float | None]:
    return {"reference": at_reference, "at_n": at_n, "ratio": ratio(at_n, at_reference)}


def scaling(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Each configuration at every larger device count N against itself at the smallest: its speedup over vanilla
    and its tokens/s, each ``{reference, at_n, ratio}``; None with one device count."""
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
            speedups = [side.get("speedup_vs_zero3_offload") or {} for side in (ref, at_n)]
            rows.append({
                "label": label, "strategy": r["strategy"], "plan": r["plan"], "devices": devices,
                "reference_devices": reference,
                "speedup_e2e": _scale(*(s.get("e2e_iteration") for s in speedups)),
                "speedup_iteration": _scale(*(s.get("iteration") for s in speedups)),
                "e2e_tokens_per_s": _scale(ref.get("e2e_tokens_per_s"), at_n.get("e2e_tokens_per_s")),
                "tokens_per_s": _scale(ref.get("tokens_per_s"), at_n.get("tokens_per_s")),
            })
    return {"device_counts": counts, "reference_devices": reference, "baseline": BASELINE, "rows": rows}


def iteration_windows(config: Windows) -> dict[str, list[int]]:
    """Which iterations (from 1) were warm-up, measured, timed end to end and timed phase by phase."""
    return {"warmup_iterations": list(range(1, config.warmup + 1)),
            "measured_iterations": list(range(config.warmup + 1, config.steps + 1)),
            "e2e_iterations": [k + 1 for k in config.e2e_iterations],
            "phase_iterations": [k + 1 for k in config.phase_iterations]}


def bench_measurement(config: Windows) -> dict[str, Any]:
    """results.json's ``measurement``: the iteration windows, the statistic and the end-to-end timing."""
    return {**iteration_windows(config), "statistic": "median over the measured iterations of all successful repeats; "
            "spread = min, p25, p75, max", "e2e": E2E_NOTE}


def read_json(path: Path) -> Any:
    """The JSON in ``path``; None where it is missing, unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


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
