"""Owns ``lightning-dos bench rok``: one row (default ``dos(auto)`` of ``configs/bench/compare.yaml``) under each
activation placement, each in a worker of its own (the NVMe directory's bandwidth first, with ``offload-nvme``), then
with a budget each placement's micro-batch search, its own run standing for the starting micro-batch; rok.json, rok.md
and rok.png after every run and search.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_dos.activations.options import DEFAULT_KEEP_LAST_LAYERS, DEFAULT_MIN_TENSOR_BYTES
from lightning_dos.bench.report import MISSING, Table, num, pct
from lightning_dos.bench.rok import chart
from lightning_dos.bench.rok.chart import format_bytes
from lightning_dos.bench.rok.disk import measure_disk
from lightning_dos.bench.rok.results import (
    PLACEMENTS,
    compare_to_keep,
    placement_summary,
    probe_of,
    rok_measurement,
)
from lightning_dos.bench.rok.search import Probe, search_micro_batch
from lightning_dos.bench.rows import load_rows, make_run, table_path
from lightning_dos.bench.runner import Runner
from lightning_dos.bench.settings import Run, is_count
from lightning_dos.planning.placement import GIB

#: Measured iterations of a search probe, after the warm-up.
PROBE_MEASURED_STEPS = 2


@dataclass
class RokSettings:
    """What one ROK curve runs besides the invocation's settings."""

    placements: list[str] = field(default_factory=lambda: ["keep", "recompute", "offload-host"])
    row: str = "dos(auto)"  # the row of --rows every placement runs under
    nvme_path: str | None = None  # a local NVMe directory for offload-nvme's files (and the bandwidth test's)
    budget_gib: float | None = None  # the micro-batch search's peak activation memory budget; None: no search
    min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES  # the offload's: smaller saved storages stay on the device
    keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS  # the offload's: the last N blocks keep their activations
    max_micro_batch: int = 1024  # the largest micro-batch the search tries
    disk_probe_mib: int = 256  # MiB measuring the NVMe directory's bandwidth (0: not measured)

    def problems(self) -> list[str]:
        """Every setting this curve cannot run."""
        from lightning_dos.activations.options import MIN_FREE_DISK_BYTES, check_nvme_path

        problems = [f"--placements: {name!r} is not one of {', '.join(PLACEMENTS)}" for name in self.placements
                    if name not in PLACEMENTS]
        if not self.placements or len(set(self.placements)) < len(self.placements):
            problems.append(f"--placements: give each of {', '.join(PLACEMENTS)} at most once")
        if ("offload-nvme" in self.placements) != (self.nvme_path is not None):
            problems.append("--nvme-path: offload-nvme writes the activations to files under it; give both or neither")
        elif self.nvme_path is not None:
            free = MIN_FREE_DISK_BYTES + max(0, self.disk_probe_mib) * 2**20
            try:
                check_nvme_path(self.nvme_path, key="--nvme-path", min_free_bytes=free)
            except ValueError as err:
                problems.append(str(err))
        if self.budget_gib is not None and not (math.isfinite(self.budget_gib) and self.budget_gib > 0):
            problems.append(f"--activation-budget-gib {self.budget_gib}: give a number of GiB > 0")
        for flag, value, least in (("--activation-min-tensor-bytes", self.min_tensor_bytes, 0),
                                   ("--activation-keep-last-layers", self.keep_last_layers, 0),
                                   ("--max-micro-batch", self.max_micro_batch, 1),
                                   ("--disk-probe-mib", self.disk_probe_mib, 0)):
            if not is_count(value, least):
                problems.append(f"{flag} {value!r} must be an integer >= {least}")
        return problems


def placement_run(runner: Runner, rok: RokSettings, name: str, micro_batch: int | None = None) -> Run:
    """The worker run of placement ``name``, or its search probe at ``micro_batch`` (the warm-up and
    :data:`PROBE_MEASURED_STEPS` iterations, the first end to end if the study times any so)."""
    s, placement = runner.settings, PLACEMENTS[name]
    (row,) = load_rows(table_path("compare", s.rows), [rok.row])
    sets: dict[str, Any] = {"model.activation_checkpointing": placement.checkpointing}
    windows = {"steps": s.steps, "warmup": s.warmup, "e2e_steps": s.e2e_steps}
    if micro_batch is not None:
        sets["data.batch_size"] = micro_batch
        windows = {"steps": s.warmup + PROBE_MEASURED_STEPS, "warmup": s.warmup, "e2e_steps": min(1, s.e2e_count)}
    run = make_run(row, runner.overrides, name if micro_batch is None else f"{name}@mb{micro_batch}", sets=sets,
                   **windows)
    hooks = placement.offload is not None or not runner.uses_gpu  # off a GPU the hooks' accounting is the measure
    run.extra = {"activations": {
        "placement": name, "checkpointing": placement.checkpointing, "hooks": hooks,
        "offload": placement.offload or "keep", "nvme_path": rok.nvme_path if placement.offload == "nvme" else None,
        "min_tensor_bytes": rok.min_tensor_bytes, "keep_last_layers": rok.keep_last_layers,
        "micro_batch": micro_batch or runner.workload["micro_batch"]}}
    return run


def run_rok(runner: Runner, rok: RokSettings,
            disk_meter: Callable[..., dict[str, Any]] = measure_disk) -> dict[str, Any]:
    """Run every placement (and the micro-batch search, with a budget); write rok.json, rok.md and rok.png after every
    run; return the JSON document."""
    micro_batch, seq_len = runner.workload["micro_batch"], runner.workload["seq_len"]
    summaries: list[dict[str, Any]] = []
    searches: list[dict[str, Any]] = []
    first = placement_run(runner, rok, rok.placements[0])  # every placement runs its row's strategy and plan
    disk = None
    if rok.nvme_path and rok.disk_probe_mib > 0 and not runner.dry_run:
        disk = disk_meter(rok.nvme_path, rok.disk_probe_mib, progress=runner.progress)

    def write() -> dict[str, Any]:
        compare_to_keep(summaries)
        measure = next((s["measure"] for s in summaries if s.get("measure")), None)
        budget = None if rok.budget_gib is None else {
            "budget_gib": rok.budget_gib, "budget_bytes": rok.budget_gib * GIB, "measure": measure,
            "start_micro_batch": micro_batch, "max_micro_batch": rok.max_micro_batch,
            "probe_iterations": runner.settings.warmup + PROBE_MEASURED_STEPS,
            "method": "from the placement's own micro-batch: double while it fits (up to --max-micro-batch), then "
                      "bisect; each probe a worker run of the warm-up and 2 measured iterations; an out-of-memory "
                      "error does not fit", "searches": searches}
        return runner.write("rok_curve", rok_measurement(runner.settings, summaries), ("rok.json", "rok.png", "rok.md"),
                            chart.render, tables, rok={**vars(rok), "strategy": first.strategy, "plan": first.plan},
                            disk=disk, placements=summaries, budget=budget, placements_planned=list(rok.placements))

    raw: dict[str, dict[str, Any]] = {}
    runner.stage("rok", "placement", len(rok.placements))
    for name in rok.placements:
        spec = placement_run(runner, rok, name)
        raw[name] = runner.run(spec, runner.out_dir / "runs" / spec.slug)
        summaries.append(placement_summary(name, raw[name], spec, micro_batch, micro_batch * seq_len))
        p = summaries[-1]
        runner.done(name, raw[name], ms=num(p["headline_ms"]), tokens_per_s=num(p["tokens_per_s"], 0),
                    peak_activation_memory=format_bytes(p["peak_activation_bytes"]), measure=p["measure"])
        write()
    if rok.budget_gib is not None and not runner.interrupted:
        runner.stage("budget search", "probe")
        budget = rok.budget_gib * GIB
        for name in rok.placements:
            def probe(batch: int, name: str = name) -> Probe:
                spec = placement_run(runner, rok, name, batch)
                answer = probe_of(runner.run(spec, runner.out_dir / "runs" / spec.slug), spec, batch,
                                  batch * seq_len, budget)
                runner.done(spec.label, answer.to_dict(), fits=answer.fits, peak=format_bytes(answer.peak_bytes))
                return answer

            known = probe_of(raw[name], placement_run(runner, rok, name), micro_batch, micro_batch * seq_len, budget,
                             source="placement run")
            searches.append({"placement": name, **search_micro_batch(micro_batch, probe, rok.max_micro_batch, known)})
            write()
    return write()


def tables(doc: dict[str, Any]) -> list[Table]:
    """The curve, the placements' counters, the disk and the budget's search."""
    placements = doc["placements"]
    out = [Table("ROK curve", ("placement", "status", "iteration ms", "overhead vs keep", "peak activation memory",
                               "reduction vs keep", "tokens/s", "loss vs keep", "offloaded / iteration"),
                 [(p["placement"], p["status"], num(p.get("headline_ms")), pct(p.get("overhead_vs_keep")),
                   format_bytes(p.get("peak_activation_bytes")), pct(p.get("reduction_vs_keep")),
                   num(p.get("tokens_per_s"), 0),
                   MISSING if not p.get("loss_vs_keep") else "identical" if p["loss_vs_keep"]["identical"]
                   else f"max diff {p['loss_vs_keep']['max_abs_diff']:.2e}",
                   format_bytes((p.get("act") or {}).get("offloaded_bytes"))) for p in placements],
                 "Iteration: " + doc["measurement"]["headline"] + ". Peak activation memory: "
                 + "; ".join(f"{k}: {v}" for k, v in doc["measurement"]["memory_measures"].items()) + ".")]
    disk = doc.get("disk")
    if disk:
        out.append(Table("NVMe directory bandwidth", ("directory", "write MB/s (fsync)", "read MB/s", "how", "error"),
                         [(disk["directory"], num(disk.get("write_mb_s"), 0), num(disk.get("read_mb_s"), 0),
                           disk.get("read_cache") or MISSING, disk.get("error") or MISSING)]))
    budget = doc.get("budget")
    if budget:
        out.append(Table(f"The largest micro-batch within {budget['budget_gib']:g} GiB",
                         ("placement", "largest micro-batch", "its peak", "its tokens/s", "search", "probes"),
                         [(s["placement"], s["largest_micro_batch"], format_bytes(s.get("peak_bytes")),
                           num(s.get("tokens_per_s"), 0), s["status"],
                           "; ".join(f"{p['micro_batch']}: {'fits' if p['fits'] else p['status']}"
                                     for p in s["probes"])) for s in budget["searches"]], budget["method"] + "."))
    return out
