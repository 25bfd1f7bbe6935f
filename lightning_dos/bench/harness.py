"""Owns a strategy comparison (``lightning-dos bench``) end to end: its configurations in, results.json, report.md
and the charts out (chart.png; iteration_timeline.png when a configuration recorded one, rank_timelines.png when DOS
auto ran on several devices; the report's dated copy, ``<model>_<hardware>_<date>.md``).

Every configuration of every kind (:mod:`~lightning_dos.bench.kinds`) runs at each device count, each repeat in its
own worker, round-robin, on the :class:`~lightning_dos.bench.pipeline.Pipeline`; a kind that keeps every state on the
GPU is skipped when they clearly cannot fit, a single-device one above one device.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lightning_dos.bench import chart, report
from lightning_dos.bench.compose import NO_OFFLOAD_BYTES_PER_PARAM, command, fit_args
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import BASELINE, KINDS, RunSpec, expand, schedule, single_device_reason
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.pipeline import (
    Launcher,
    Pipeline,
    default_out_dir,
    elapsed_note,
    prepare,
    uses_gpu,
    write_outputs,
)
from lightning_dos.bench.results import aggregate, bench_measurement, compare_to_baseline, scaling


def no_offload_skip_reason(config: BenchConfig, model: dict[str, Any], hardware: dict[str, Any],
                           devices: int = 1) -> str | None:
    """Why a kind that keeps every state on the GPU cannot fit it (each of ``devices`` GPUs its share), or None."""
    total = hardware.get("gpu_memory_gib")
    if config.force_no_offload or not uses_gpu(config, hardware) or not total or not model.get("params"):
        return None
    need = model["no_offload_state_gib_lower_bound"] / devices
    if need <= total:
        return None
    share = "" if devices == 1 else f" (its share of {devices} GPUs)"
    return (f"does not fit: model and optimizer state alone need >= {need:.1f} GiB{share} "
            f"({NO_OFFLOAD_BYTES_PER_PARAM} B/param) but the GPU has {total:.1f} GiB (--force-no-offload runs it)")


def devices_skip_reason(spec: RunSpec, config: BenchConfig, hardware: dict[str, Any]) -> str | None:
    """Why ``spec`` is not run at its device count: a single-device kind on several, or more GPUs than the host
    has; None to run it."""
    reason = single_device_reason(spec)
    if reason is not None:
        return reason
    gpus = hardware.get("gpu_count")
    if spec.devices > 1 and uses_gpu(config, hardware) and gpus and spec.devices > gpus:
        return f"needs {spec.devices} GPUs; this host has {gpus} (set --devices to at most {gpus})"
    return None


def run_line(index: int, total: int, spec: RunSpec, result: dict[str, Any], config: BenchConfig,
             model: dict[str, Any]) -> str:
    """One line summarising a finished run (its figures as :func:`~lightning_dos.bench.results.aggregate` makes
    them), printed as it completes."""
    head = f"[{index}/{total}] {result['label']}"
    if config.repeats > 1:
        head += f" (repeat {result.get('repeat', 0) + 1})"
    if result.get("reused"):
        head += " (reused from an earlier invocation)"
    if result["status"] != "ok":
        return f"{head}: {result['status'].upper()}: {result.get('reason')}{elapsed_note(result)}"
    r = aggregate(spec, [result], config, model)  # over the ranks: the largest GPU's peak, the host's sum
    e2e, gpu = r["e2e_iteration_ms"], r["peak_gpu_gib"]
    tokens_per_s = r["tokens_per_s"] if e2e is None else r["e2e_tokens_per_s"]
    memory = (f"peak GPU {gpu:.2f} GiB, " if gpu is not None else "") + f"host {_num(r['peak_host_gib'], 2)} GiB"
    e2e_text = f"e2e {e2e:.1f} ms/iteration, " if e2e is not None else ""
    return (f"{head}: ok  {e2e_text}{tokens_per_s or 0:,.0f} tokens/s  synchronised {_num(r['iteration_ms'])} ms "
            f"(fwd {_num(r['fwd_ms'])} | bwd {_num(r['bwd_ms'])} | step {_num(r['step_ms'])})  {memory}  "
            f"loss {r['final_loss']:.4f}{elapsed_note(result)}")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_dir_of(out_dir: Path, spec: RunSpec) -> Path:
    """Where ``spec``'s worker keeps its files: ``runs/<configuration>_r<repeat>``."""
    return out_dir / "runs" / f"{spec.slug}_r{spec.repeat}"


def run_bench(config: BenchConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
              now: datetime | None = None, resume: bool = False) -> dict[str, Any]:
    """Run every configuration of ``config`` (``resume``: reuse those that finished in ``out_dir`` running exactly
    the same), write results.json, report.md, the charts and the dated copy under ``out_dir``; return the JSON."""
    with Pipeline(config, out_dir, launcher, resume, progress, now) as pipeline:
        hardware, resolved, model = pipeline.hardware, pipeline.resolved, pipeline.model
        specs = expand(config)
        runs = schedule(specs, config.repeats)
        raw: dict[str, list[dict[str, Any]]] = {spec.label: [] for spec in specs}
        pipeline.stage("bench", "config", len(runs))
        for index, spec in enumerate(runs, start=1):
            too_big = no_offload_skip_reason(resolved, model, hardware, spec.devices)
            skip = devices_skip_reason(spec, resolved, hardware) or (
                too_big if KINDS[spec.strategy].keeps_states_on_device else None)
            result = pipeline.run(config, spec, run_dir_of(out_dir, spec), skip=skip)
            raw[spec.label].append(result)
            pipeline.done(run_line(index, len(runs), spec, result, resolved, model))
    results = [aggregate(spec, raw[spec.label], resolved, model) for spec in specs]
    base = compare_to_baseline(results)
    pipeline.devices = [r["device"] for r in results if r.get("device")]  # how phases were timed, row by row
    doc = pipeline.document(None, bench_measurement(resolved), baseline=BASELINE, results=results)
    doc["interrupted"] = pipeline.interrupted
    doc["reused"] = sorted({r["label"] for runs_ in raw.values() for r in runs_ if r.get("reused")})
    if (section := scaling(results)) is not None:  # more than one device count ran
        doc["scaling"] = section
    figures = {"timeline": ("iteration_timeline.png", chart.render_timeline),
               "rank_timelines": ("rank_timelines.png", chart.render_rank_timelines)}
    write_outputs(doc, out_dir, ("results.json", "chart.png", "report.md"), chart.render,
                  functools.partial(report.render, base=base), figures, copy=report.report_name(doc))
    return doc


def dry_run_text(config: BenchConfig) -> str:
    """The resolved configuration and the configurations it expands to, each with its ``lightning-dos fit`` (run
    directories under the default ``--out``), for ``--dry-run`` (nothing is written)."""
    hardware, resolved, model = prepare(config)
    out_dir = default_out_dir("bench", config, datetime.now(timezone.utc))
    specs = expand(config)
    lines = ["resolved configuration:", json.dumps(resolved.to_dict(), indent=2), "", f"model: {json.dumps(model)}", "",
             f"iterations of each run: {config.warmup} warm-up, then {config.e2e_count} end to end (unsynchronised), "
             f"then {len(config.phase_iterations)} phase by phase (synchronised)", "",
             f"{len(specs)} configurations x {config.repeats} repeat(s), device counts "
             f"{', '.join(str(d) for d in config.devices)}:"]
    for spec in specs:
        reason = devices_skip_reason(spec, resolved, hardware)
        lines.append(f"  {spec.label:<28} strategy={spec.strategy} plan={spec.plan} devices={spec.devices}"
                     + (f"  (skipped: {reason})" if reason else ""))
        lines.append(f"    {command(fit_args(config, spec, run_dir_of(out_dir, spec), write=False))}")
    return "\n".join(lines)
