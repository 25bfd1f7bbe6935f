"""Owns one ROK invocation end to end: the placements' runs on the :class:`~lightning_dos.bench.pipeline.Pipeline`
(the NVMe directory's bandwidth first, with ``offload-nvme``), then with a budget each placement's micro-batch search,
its own run standing for the starting micro-batch; rok.json, rok.md and rok.png after every run and search.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from lightning_dos.bench.launcher import launch
from lightning_dos.bench.pipeline import Launcher, Pipeline, elapsed_note, prepare, uses_gpu, write_outputs
from lightning_dos.bench.rok import chart, report
from lightning_dos.bench.rok.config import PLACEMENTS, RokConfig
from lightning_dos.bench.rok.disk import measure_disk
from lightning_dos.bench.rok.report import format_bytes
from lightning_dos.bench.rok.results import GIB, compare_to_keep, placement_summary, probe_of, rok_measurement
from lightning_dos.bench.rok.search import Probe, search_micro_batch

__all__ = ["dry_run_text", "run_rok"]


def _run(pipeline: Pipeline, rok: RokConfig, on_gpu: bool, name: str, micro_batch: int | None = None) -> dict[str, Any]:
    """The worker run of placement ``name``, or its search probe at ``micro_batch``."""
    spec = rok.spec(name, micro_batch)
    return pipeline.run(rok.run_config(name, micro_batch), spec, pipeline.out_dir / "runs" / spec.slug,
                        {"activations": rok.worker_settings(name, on_gpu)})


def placement_line(index: int, total: int, summary: dict[str, Any]) -> str:
    """One line summarising a finished placement run, printed as it completes."""
    head = f"[{index}/{total}] {summary['placement']}" + (" (reused)" if summary.get("reused") else "")
    if summary["status"] != "ok":
        return f"{head}: {summary['status'].upper()}: {summary['reason']}{elapsed_note(summary)}"
    act = summary.get("act") or {}
    moved = f"  offloaded {format_bytes(act.get('offloaded_bytes'))}/iteration" if act.get("offloaded_bytes") else ""
    ms = summary["headline_ms"]
    return (f"{head}: ok  {ms or 0:.1f} ms/iteration ({summary['headline']}), {summary['tokens_per_s'] or 0:,.0f} "
            f"tokens/s  peak activation memory {format_bytes(summary['peak_activation_bytes'])} "
            f"({summary['measure']}){moved}  loss {summary['final_loss']:.4f}{elapsed_note(summary)}")


def probe_line(name: str, probe: Probe, budget_gib: float) -> str:
    """One line per search probe."""
    head = f"{name} at micro-batch {probe.micro_batch}"
    if probe.fits is None:
        return f"{head}: {probe.status.upper()}: {probe.reason}"
    if probe.status == "oom":
        return f"{head}: does not fit: out of memory"
    verdict = "fits" if probe.fits else "does not fit"
    return (f"{head}: {verdict} ({format_bytes(probe.peak_bytes)} vs {budget_gib:g} GiB), "
            f"{probe.tokens_per_s or 0:,.0f} tokens/s{elapsed_note(probe.to_dict())}")


def _search(rok: RokConfig, on_gpu: bool, pipeline: Pipeline, name: str, own: dict[str, Any]) -> dict[str, Any]:
    """The micro-batch search of placement ``name``; ``own`` is its run's raw result (the starting micro-batch)."""
    assert rok.budget_gib is not None
    budget = rok.budget_gib * GIB
    known = probe_of(own, rok.run_config(name), budget, source="placement run")

    def probe(micro_batch: int) -> Probe:
        answer = probe_of(_run(pipeline, rok, on_gpu, name, micro_batch), rok.run_config(name, micro_batch), budget)
        pipeline.done(probe_line(name, answer, rok.budget_gib or 0.0))
        return answer

    return {"placement": name, **search_micro_batch(rok.bench.micro_batch, probe, rok.max_micro_batch, known=known)}


def budget_section(rok: RokConfig, searches: list[dict[str, Any]], measure: str | None) -> dict[str, Any] | None:
    """rok.json's ``budget``: the budget, how the search ran, and every placement's search so far."""
    if rok.budget_gib is None:
        return None
    return {"budget_gib": rok.budget_gib, "budget_bytes": rok.budget_gib * GIB, "measure": measure,
            "start_micro_batch": rok.bench.micro_batch, "max_micro_batch": rok.max_micro_batch,
            "probe_iterations": rok.to_dict()["probe_steps"],
            "method": "from the placement's own micro-batch: double while it fits (up to --max-micro-batch), then "
                      "bisect between the largest that fitted and the smallest that did not; each probe a worker run "
                      "of the warm-up and 2 measured iterations; an out-of-memory error does not fit",
            "searches": searches}


def run_rok(rok: RokConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
            now: datetime | None = None, resume: bool = False,
            disk_meter: Callable[..., dict[str, Any]] = measure_disk) -> dict[str, Any]:
    """Run every placement of ``rok`` (and the micro-batch search, with a budget); write rok.json, rok.md and
    rok.png under ``out_dir``; return the JSON document."""
    summaries: list[dict[str, Any]] = []
    raw: dict[str, dict[str, Any]] = {}
    searches: list[dict[str, Any]] = []
    with Pipeline(rok.bench, out_dir, launcher, resume, progress, now) as pipeline:
        resolved = pipeline.resolved
        # the search starts from the recipe's micro-batch; tokens per iteration need its sequence length too
        rok = dataclasses.replace(rok, bench=dataclasses.replace(rok.bench, micro_batch=resolved.micro_batch,
                                                                 seq_len=resolved.seq_len))
        on_gpu = uses_gpu(resolved, pipeline.hardware)
        disk = None
        if "offload-nvme" in rok.placements and rok.nvme_path and rok.disk_probe_mib > 0:
            disk = disk_meter(rok.nvme_path, rok.disk_probe_mib, progress=progress)

        def document() -> dict[str, Any]:
            compare_to_keep(summaries)
            measure = next((s["measure"] for s in summaries if s.get("measure")), None)
            doc = pipeline.document("rok_curve", rok_measurement(resolved, summaries), rok=rok.to_dict(),
                                    interrupted=pipeline.interrupted, disk=disk, placements=summaries,
                                    budget=budget_section(rok, searches, measure))
            doc["placements_planned"] = list(rok.placements)
            write_outputs(doc, out_dir, ("rok.json", "rok.png", "rok.md"), chart.render, report.render)
            return doc

        pipeline.stage("rok", "placement", len(rok.placements))
        for index, name in enumerate(rok.placements, start=1):
            raw[name] = result = _run(pipeline, rok, on_gpu, name)
            summary = placement_summary(name, result, rok.run_config(name))
            summaries.append(summary)
            pipeline.done(placement_line(index, len(rok.placements), summary))
            document()
        if rok.budget_gib is not None and not pipeline.interrupted:
            pipeline.stage("budget search", "probe")
            for name in rok.placements:
                searches.append(_search(rok, on_gpu, pipeline, name, raw[name]))
                document()
    return document()


def dry_run_text(rok: RokConfig) -> str:
    """The resolved settings and the worker runs the invocation would make, for ``--dry-run``."""
    hardware, config, model = prepare(rok.bench)
    on_gpu = uses_gpu(config, hardware)
    lines = ["resolved configuration:", json.dumps({"bench": config.to_dict(), "rok": rok.to_dict()}, indent=2), "",
             f"model: {model['preset']}, {model['params'] or 'unknown'} parameters", "",
             f"every placement under {rok.strategy} (plan {rok.plan}), micro-batch {config.micro_batch} "
             f"x seq {config.seq_len}, {config.steps} iterations: {config.warmup} warm-up, {config.e2e_count} end to "
             f"end, {len(config.phase_iterations)} synchronised", "",
             f"peak activation memory: {'the GPU allocator (device)' if on_gpu else 'the offload hooks accounting'}",
             "", f"{len(rok.placements)} worker runs, one per placement:"]
    for name in rok.placements:
        p = PLACEMENTS[name]
        hooks = f"hooks {p.hook_placement}" if rok.hooks(name, on_gpu) else "no hooks"
        nvme = f" under {rok.nvme_path}" if p.offload == "nvme" else ""
        lines.append(f"  {name:<14} checkpointing {'on ' if p.checkpointing else 'off'}  {hooks}{nvme}")
    if "offload-nvme" in rok.placements and rok.disk_probe_mib:
        lines += ["", f"before them: the bandwidth of {rok.nvme_path}, writing and reading back {rok.disk_probe_mib} "
                      "MiB"]
    if rok.budget_gib is not None:
        lines += ["", f"then, per placement, the largest micro-batch whose peak activation memory fits "
                      f"{rok.budget_gib:g} GiB: from {config.micro_batch}, doubling up to {rok.max_micro_batch} then "
                      f"bisecting; each probe a worker run of {rok.to_dict()['probe_steps']} iterations"]
    return "\n".join(lines)
