"""Owns ``lightning-dos bench compare``: one recipe under every row of a row table (default
``configs/bench/compare.yaml``: vanilla ZeRO-3 offload, the static splits, DOS, no offload and the peers), each
configuration at each device count, each repeat in its own worker, round-robin; results.json, report.md and chart.png.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_dos.bench import chart
from lightning_dos.bench.report import MISSING, Table, num, ratio
from lightning_dos.bench.results import (
    BASELINE,
    DP_SUFFIX,
    aggregate,
    bench_measurement,
    compare_to_baseline,
    scaling,
)
from lightning_dos.bench.rows import load_rows, make_run, table_path
from lightning_dos.bench.runner import Runner
from lightning_dos.bench.settings import Run


def runs_of(runner: Runner) -> list[Run]:
    """Every configuration at every device count (repeat 0), in report order: all at the first count, then the next;
    one at N > 1 devices is labelled ``<label>@dp<N>``."""
    s = runner.settings
    rows = load_rows(table_path("compare", s.rows), s.only)
    windows = {"steps": s.steps, "warmup": s.warmup, "e2e_steps": s.e2e_steps}
    gpus = runner.hardware.get("gpu_count")
    runs = []
    for devices in s.devices:
        for row in rows:
            run = make_run(row, runner.overrides, row.label if devices == 1 else f"{row.label}{DP_SUFFIX}{devices}",
                           devices, **windows)
            if run.skip is None and devices > 1 and runner.uses_gpu and gpus and devices > gpus:
                run.skip = f"needs {devices} GPUs; this host has {gpus} (set --devices to at most {gpus})"
            runs.append(run)
    return runs


def run_compare(runner: Runner) -> dict[str, Any]:
    """Run every configuration ``--repeats`` times, round-robin; write results.json, report.md and chart.png."""
    specs = runs_of(runner)
    schedule = [dataclasses.replace(spec, repeat=r) for r in range(runner.settings.repeats) for spec in specs]
    raw: dict[str, list[dict[str, Any]]] = {spec.label: [] for spec in specs}
    runner.stage("compare", "run", len(schedule))
    for spec in schedule:
        result = runner.run(spec, runner.out_dir / "runs" / f"{spec.slug}_r{spec.repeat}")
        raw[spec.label].append(result)
        row = aggregate(spec, [result], runner.tokens, runner.model)
        runner.done(spec.label, result, e2e_ms=num(row["e2e_iteration_ms"]),
                    tokens_per_s=num(row["e2e_tokens_per_s"], 0), synchronised_ms=num(row["iteration_ms"]),
                    peak_GPU_GiB=num(row["peak_gpu_gib"], 2),
                    host_GiB=num(row["peak_host_gib"], 2), loss=num(row["final_loss"], 4))
    results = [aggregate(spec, raw[spec.label], runner.tokens, runner.model) for spec in specs]
    compare_to_baseline(results)
    section = scaling(results)  # None unless more than one device count ran
    return runner.write(None, bench_measurement(runner.settings), ("results.json", "chart.png", "report.md"),
                        chart.render, tables, baseline=BASELINE, results=results,
                        reused=sorted({r["label"] for runs in raw.values() for r in runs if r.get("reused")}),
                        **({} if section is None else {"scaling": section}))


def tables(doc: dict[str, Any]) -> list[Table]:
    """report.md's tables: end to end, phase by phase, against the baseline, DOS's update phase, data parallel."""
    results = doc["results"]
    ok = [r for r in results if r["status"] == "ok"]
    out = [Table("End to end (what a user sees)", ("configuration", "status", "iteration ms", "tokens/s",
                                                   "peak GPU GiB", "process RSS GiB", "host in use GiB",
                                                   f"vs {BASELINE}"),
                 [(r["label"], r["status"], num(r.get("e2e_iteration_ms")), num(r.get("e2e_tokens_per_s"), 0),
                   num(r["peak_gpu_gib"], 2), num(r["peak_host_gib"], 2), num(r.get("host_in_use_gib"), 2),
                   ratio((r.get("speedup_vs_zero3_offload") or {}).get("e2e_iteration"))) for r in results],
                 "Median wall time per iteration with nothing synchronised; host in use: the whole host's memory in "
                 "use at the run's peak less before it (driver-pinned pages included)."),
           Table("Phase by phase (synchronised)", ("configuration", "fwd ms", "bwd ms", "step ms", "iteration ms",
                                                   "TFLOP/s", "final loss", f"loss diff vs {BASELINE}"),
                 [(r["label"], num(r["fwd_ms"]), num(r["bwd_ms"]), num(r["step_ms"]), num(r["iteration_ms"]),
                   num(r["tflops_per_s"], 2), num(r["final_loss"], 4),
                   MISSING if not r.get("loss_vs_zero3_offload") else
                   f"{r['loss_vs_zero3_offload']['max_abs_diff']:.2e}") for r in ok])]
    dos = [(r["label"], r["dos"]) for r in ok if r.get("dos")]
    out.append(Table("DOS update phase", ("configuration", "plan", "subgroups", "resident", "device fraction",
                                          "update ms", "host busy ms", "device busy ms", "demoted (max)"),
                     [(label, d["plan"] + ("" if d["active"] else " (inactive)"), d["subgroups"],
                       len(d.get("resident_subgroups") or ()), num(d["device_fraction"], 2), num(d["update_ms"]),
                       num(d["host_busy_ms"]), num(d["device_busy_ms"]), d["demoted_subgroups_max"])
                      for label, d in dos], "Medians over the synchronised iterations' update phases."))
    if doc.get("scaling"):
        out.append(Table("Data parallel", ("configuration", "devices", f"vs {BASELINE} kept", "tokens/s scaling"),
                         [(row["label"], row["devices"], ratio(row["speedup_e2e"]["ratio"]),
                           ratio(row["e2e_tokens_per_s"]["ratio"])) for row in doc["scaling"]["rows"]],
                         f"Each configuration at N devices against itself at {doc['scaling']['reference_devices']}."))
    out.append(Table("Not completed", ("configuration", "status", "reason"),
                     [(r["label"], r["status"], r["reason"]) for r in results if r["status"] != "ok"]))
    return out
