"""Owns report.md, a strategy comparison's markdown report, and its file names: ``report.md`` plus
``<model>_<hardware>_<date>.md``.

It formats results.json (:mod:`~lightning_dos.bench.results`) and computes nothing new, so the report and the JSON
always agree. The hardware and versions sections and the number formats are :mod:`~lightning_dos.bench.markdown`'s,
shared with sweep.md and rok.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lightning_dos.bench import markdown as md
from lightning_dos.bench.config import HOST_KEYS
from lightning_dos.bench.kinds import BASELINE, KINDS
from lightning_dos.planning.placement import RESIDENT_BYTES_PER_PARAM


def hardware_slug(hardware: dict[str, Any]) -> str:
    """Short hardware name for file names: ``H200`` for "NVIDIA H200", ``cpu`` without a GPU."""
    name = hardware.get("gpu_name")
    if not name:
        return "cpu"
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", str(name).strip(), flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-") or "gpu"


def report_name(doc: dict[str, Any]) -> str:
    """``<model>_<hardware>_<date>.md``, e.g. ``gpt-2.7b_H200_2026-11-21.md``."""
    model = re.sub(r"[^A-Za-z0-9.-]+", "-", str(doc["config"]["model"]))
    return f"{model}_{hardware_slug(doc['hardware'])}_{doc['date'][:10]}.md"


def _config_lines(doc: dict[str, Any]) -> list[str]:
    cfg = doc["config"]
    on_off = {True: "on", False: "off", None: "the recipe's"}
    recipe = f"`{cfg['recipe']}`" if cfg.get("recipe") else "the bench's own (`recipe.yaml` beside each run)"
    lines = [f"- Recipe: {recipe}"
             ", then each configuration's strategy fragment and the flags given, as `lightning-dos fit` composes "
             "them (each run's command is the first line of its `worker.log`)",
             f"- Model: {md.model_text(doc['model'])}",
             f"- Batch: micro-batch {cfg['micro_batch']} x seq {cfg['seq_len']} = "
             f"{cfg['micro_batch'] * cfg['seq_len']:,} tokens per iteration per device"
             + ("" if (cfg.get("devices") or [1]) == [1] else
                f"; on {md.devices_text(cfg['devices'])} devices, data parallel: a row at N devices trains N times "
                "that per iteration, one micro-batch per rank"),
             f"- Precision {cfg['precision']}, activation checkpointing {on_off[cfg.get('activation_checkpointing')]}",
             f"- Data: {cfg['data']}, seed {cfg['seed']} (same model init, data and order for every configuration"
             f"{_host_init_text(cfg)}); AdamW lr {cfg['learning_rate']}", ""]
    rows = [(r["label"], f"`{r['strategy_config']}`" if r.get("strategy_config") else md.MISSING,
             ", ".join(f"{k}={v}" for k, v in (r.get("strategy_args") or {}).items()) or "none")
            for r in doc["results"]]
    lines += md.table(("configuration", "strategy fragment", "set over it"), rows)
    return lines + ["", "Full configuration (as in results.json):", "", *md.json_block(cfg)]


def _host_init_text(cfg: dict[str, Any]) -> str:
    """What the configuration line adds for the kinds that build the model on the host (``builds_on_host``)."""
    host = [name for name in cfg.get("strategies") or [] if name in KINDS and KINDS[name].builds_on_host]
    if not host:
        return ""
    return (f", except that {' and '.join(host)} {'builds' if len(host) == 1 else 'build'} the model on the host: on "
            "a GPU its initial weights are other draws of the same distribution, so its losses differ from the "
            "others' from the first step")


def _iterations_text(numbers: Sequence[int]) -> str:
    """``iterations 2-4``, ``iteration 2`` or ``none`` (1-based, consecutive)."""
    if not numbers:
        return "none"
    return f"iterations {numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else f"iteration {numbers[0]}"


def _measurement_lines(doc: dict[str, Any]) -> list[str]:
    m, cfg = doc["measurement"], doc["config"]
    e2e, phases = m.get("e2e_iterations") or [], m.get("phase_iterations", m["measured_iterations"])
    lines = [
        f"- {cfg['steps']} iterations per run, {cfg['repeats']} repeat(s), each in a fresh process, interleaved; "
        f"warm-up left out: {_iterations_text(m['warmup_iterations'])}. Medians over every successful repeat:",
        f"  - end to end (what a user sees): {_iterations_text(e2e)} ({len(e2e)} per repeat); "
        + (f"{m['e2e']}." if e2e and m.get("e2e") else "not measured (--e2e-steps 0)."),
        f"  - phase by phase (synchronised): {_iterations_text(phases)} ({len(phases)} per repeat); {m['timing']}",
        "- tokens/s: tokens per iteration (every device of the row) / median iteration; TFLOP/s: model FLOPs per "
        "token x tokens/s. Peak GPU memory: the allocator's (allocated) over the process; peak host memory: the larger "
        "of a 50 ms RSS sampler and ru_maxrss.",
    ]
    if (cfg.get("devices") or [1]) != [1]:
        lines.append("- Data parallel: a row at N devices ran N ranks, one process each; its times are rank 0's, its "
                     "host peak the ranks' sum, its GPU peak the largest rank's (each rank's: results.json's "
                     "per_rank); it is compared with zero3_offload at the same device count.")
    return lines


def _with_spread(r: dict[str, Any], key: str) -> str:
    """A median with its p25-p75 spread."""
    spread = (r.get("spread") or {}).get(key)
    return md.num(r.get(key)) + (f" ({md.num(spread['p25'])}-{md.num(spread['p75'])})" if spread else "")


def _e2e_table(results: Sequence[dict[str, Any]]) -> list[str]:
    """The headline table: end-to-end iteration, tokens/s, peak memory and the end-to-end speedup."""
    return md.table(("configuration", "status", "iteration ms (p25-p75)", "tokens/s", "devices", "peak GPU GiB",
                     "peak host GiB", f"vs {BASELINE}"),
                    [(r["label"], r["status"], _with_spread(r, "e2e_iteration_ms"),
                      md.num(r.get("e2e_tokens_per_s"), 0), str(r.get("devices", 1)), md.num(r["peak_gpu_gib"], 2),
                      md.num(r["peak_host_gib"], 2),
                      md.ratio((r.get("speedup_vs_zero3_offload") or {}).get("e2e_iteration"))) for r in results])


def _results_table(results: Sequence[dict[str, Any]]) -> list[str]:
    return md.table(("configuration", "status", "fwd ms", "bwd ms", "step ms", "iteration ms (p25-p75)", "tokens/s",
                     "devices", "TFLOP/s", "peak GPU GiB", "peak host GiB", "final loss"),
                    [(r["label"], r["status"], md.num(r["fwd_ms"]), md.num(r["bwd_ms"]), md.num(r["step_ms"]),
                      _with_spread(r, "iteration_ms"), md.num(r["tokens_per_s"], 0), str(r.get("devices", 1)),
                      md.sig(r["tflops_per_s"]), md.num(r["peak_gpu_gib"], 2), md.num(r["peak_host_gib"], 2),
                      md.num(r["final_loss"], 4)) for r in results])


def _phase_peak_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """Where each row's GPU memory peaked: its largest peak per phase of the synchronised iterations."""
    rows = []
    for r in results:
        by_phase = r.get("peak_gpu_gib_by_phase")
        if not by_phase:
            continue
        measured = {phase: v for phase, v in by_phase.items() if v is not None}
        top = max(measured, key=measured.__getitem__) if measured else None
        rows.append((r["label"], *(md.num(by_phase.get(phase), 2) for phase in ("fwd", "bwd", "step")),
                     md.num(r.get("peak_gpu_gib"), 2), top or "-"))
    if not rows:
        return []
    lines = ["", "### Peak GPU memory by phase", "",
             "The largest allocated GPU memory in each phase of the synchronised iterations (the peak is reset at "
             "every phase boundary; the step runs from the backward's end to the iteration's). With `overlap` the "
             "update's memory is in the next forward's and backward's.", ""]
    return lines + md.table(("configuration", "fwd GiB", "bwd GiB", "step GiB", "whole run GiB", "highest phase"),
                            rows)


def _speedup_lines(results: Sequence[dict[str, Any]], base: dict[str, Any] | None) -> list[str]:
    if base is None:
        return [f"No successful `{BASELINE}` run in this invocation, so no speedups or loss comparison."]
    rows, loss_rows = [], []
    for r in results:
        s, loss = r.get("speedup_vs_zero3_offload"), r.get("loss_vs_zero3_offload")
        if not s:
            continue
        rows.append((r["label"], md.ratio(s.get("e2e_iteration")), md.ratio(s["iteration"]), md.ratio(s["step"]),
                     md.ratio(s["bwd"]), md.ratio(s.get("peak_gpu"))))
        loss_rows.append((r["label"], md.num(r["final_loss"], 6), md.sci(loss["final_abs_diff"]),
                          md.sci(loss["final_rel_diff"]), md.sci(loss["max_abs_diff"]),
                          str(loss["iterations_compared"])))
    lines = [f"`{BASELINE}`'s time over each configuration's at the same device count (> 1: faster than vanilla "
             f"offload), end to end then synchronised; and its peak GPU memory over `{BASELINE}`'s (< 1: less).", ""]
    lines += md.table(("configuration", "e2e iteration", "iteration (sync)", "step (sync)", "bwd (sync)",
                       "peak GPU memory"), rows)
    lines += ["", "## Loss agreement vs zero3_offload", "",
              "Same seed, data and initial weights: a difference comes from the update path (CPU Adam or fused GPU "
              "Adam, reduced precision).", ""]
    lines += md.table(("configuration", "final loss", "abs diff", "rel diff", "max abs diff (all iterations)",
                       "iterations"), loss_rows)
    return lines


def _subgroups_cell(d: dict[str, Any]) -> str:
    """The subgroup count, and how many of them stay resident on the device (``resident_gib``), if any."""
    resident = len(d.get("resident_subgroups") or ())
    return f"{d['subgroups']} ({resident} resident)" if resident else str(d["subgroups"])


def _dos_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    rows = []
    for r in results:
        d = r.get("dos")
        if not d:
            continue
        rows.append((r["label"], d["plan"] + ("" if d["active"] else " (inactive: DeepSpeed's host update ran)"),
                     _subgroups_cell(d), md.num(d["device_fraction"], 2), md.num(d["update_ms"]),
                     md.num(d["host_busy_ms"]), md.num(d["device_busy_ms"]), md.num(d["h2d_gb"], 2),
                     md.num(d["d2h_gb"], 2),
                     str(d["demoted_subgroups_max"]), md.num(d.get("device_buffer_gib"), 2),
                     md.num(RESIDENT_BYTES_PER_PARAM * (d.get("resident_params") or 0) / 1024**3, 2)))
    return md.section("DOS update phase", "Medians over the synchronised iterations' update phases, from the "
                      "strategy's records: update = both lanes' makespan, busy = each lane's compute, GB moved per "
                      "step, buffers = the executor's GPU memory, resident = the resident subgroups' state.",
                      ("configuration", "plan", "subgroups", "device fraction", "update ms", "host busy ms",
                       "device busy ms", "H2D GB", "D2H GB", "demoted (max)", "buffers GiB", "resident GiB"), rows)


def _host_thread_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    rows = []
    for r in results:
        h = r.get("host_threads") or {}
        if not any(v is not None for v in h.values()):
            continue
        rows.append((r["label"], *(md.num(h.get(key), 0 if key.endswith("preempted") else 1) for key in HOST_KEYS)))
    header = ("configuration", *(key.replace("_other_cpu_ms", " other CPU ms").replace("_", " ") for key in HOST_KEYS))
    return md.section("Host threads", "Medians over the synchronised iterations, per phase: CPU ms of the threads "
                      "other than the training thread, and the training thread's involuntary switches (other threads "
                      "taking its core slow it).", header, rows)


def _failure_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    failed = [r for r in results if r["status"] != "ok"]
    if not failed:
        return []
    lines = ["## Configurations that did not complete", ""]
    for r in failed:
        logs = ", ".join(f"`{run['log']}`" for run in r.get("runs", []) if run.get("log"))
        lines.append(f"- **{r['label']}**: {r['status']}: {r['reason']}" + (f" (log: {logs})" if logs else ""))
    return lines + [""]


def _scaling_table(section: dict[str, Any]) -> list[str]:
    ref = section["reference_devices"]
    rows = []
    for row in section["rows"]:
        e2e, sync = row["speedup_e2e"], row["speedup_iteration"]
        tokens, tokens_sync = row["e2e_tokens_per_s"], row["tokens_per_s"]
        rows.append((row["label"], str(row["devices"]), md.ratio(e2e["reference"]), md.ratio(e2e["at_n"]),
                     md.ratio(e2e["ratio"]), md.ratio(sync["ratio"]), md.num(tokens["reference"], 0),
                     md.num(tokens["at_n"], 0), md.ratio(tokens["ratio"]), md.ratio(tokens_sync["ratio"])))
    header = ("configuration", "devices N", f"vs {BASELINE} at {ref}", f"vs {BASELINE} at N", "kept (N / " + str(ref)
              + ")", "kept, synchronised", f"tokens/s at {ref}", "tokens/s at N", "tokens/s scaling",
              "scaling, synchronised")
    return md.table(header, rows)


def _rank_table(results: Sequence[dict[str, Any]]) -> list[str]:
    rows = []
    for r in results:
        if r.get("devices", 1) == 1 or r["status"] != "ok":
            continue
        for rank in r.get("per_rank") or []:
            dos = rank.get("dos") or {}
            rows.append((r["label"], str(rank["rank"]), md.num(rank.get("e2e_iteration_ms")),
                         md.num(rank.get("iteration_ms")), md.num(rank.get("peak_host_gib"), 2),
                         md.num(rank.get("peak_gpu_gib"), 2), md.num(dos.get("update_ms")),
                         md.num(dos.get("device_fraction"), 2), md.num(rank.get("final_loss"), 4)))
    if not rows:
        return []
    return md.table(("configuration", "rank", "e2e iteration ms", "iteration ms (sync)", "peak host GiB",
                     "peak GPU GiB", "DOS update ms", "device fraction", "final loss"), rows)


def _data_parallel_lines(doc: dict[str, Any], rank_timelines: str | None) -> list[str]:
    """The Data parallel section: how each configuration's advantage over vanilla and its tokens/s carry from the
    smallest device count to each larger one, each rank's own figures, and the ranks' timelines."""
    section = doc.get("scaling")
    if not section:
        return []
    ref = section["reference_devices"]
    lines = ["## Data parallel", "",
             f"Each configuration at N devices against itself at {ref}: its speedup over `{BASELINE}` (end to end) and "
             f"the share kept at N; its tokens/s (all ranks) and their ratio (N / {ref} is perfect scaling).", ""]
    if section["rows"]:
        lines += _scaling_table(section)
    else:
        lines.append(f"No configuration completed both at {ref} and at a larger device count.")
    ranks = _rank_table(doc["results"])
    if ranks:
        lines += ["", "Each rank's own figures:", "", *ranks]
    if rank_timelines:
        lines += ["", f"![every rank's last synchronised iteration of DOS auto, on one time axis]({rank_timelines})"]
    return lines + [""]


def render(doc: dict[str, Any], base: dict[str, Any] | None, chart: str | None = "chart.png",
           timeline: str | None = None, rank_timelines: str | None = None) -> str:
    """The markdown report of a results.json document; ``chart``, ``timeline`` and ``rank_timelines`` are the images
    to link, if any."""
    results = doc["results"]
    resumed = ("**Resumed** (`--resume`): measured by an earlier invocation with the same settings and reused here: "
               + ", ".join(doc["reused"]) + ".") if doc.get("reused") else None
    lines = md.heading(doc, "bench", "**The bench was interrupted**: configurations after the interruption were not "
                       "run.", resumed)
    lines += ["", "## Configuration", ""]
    lines += _config_lines(doc)
    lines += ["", "## How it was measured", ""]
    lines += _measurement_lines(doc)
    lines += ["", "## What a user sees: end-to-end time per iteration", "",
              "Median wall time per iteration, nothing synchronised (as in a training run); the last column is "
              f"`{BASELINE}`'s over each configuration's.", ""]
    lines += _e2e_table(results)
    lines += ["", "## Phase by phase (synchronised)", "",
              "Medians over the synchronised iterations: each phase's device work is charged to it.", ""]
    lines += _results_table(results)
    lines += _phase_peak_lines(results)
    if chart:
        lines += ["", f"![fwd / bwd / step per configuration, and peak memory]({chart})"]
    if timeline:
        lines += ["", f"![one synchronised iteration per configuration: phases and DOS's update lanes]({timeline})"]
    lines += ["", f"## Speedup vs {BASELINE}", ""]
    lines += _speedup_lines(results, base)
    lines += [""]
    lines += _data_parallel_lines(doc, rank_timelines)
    lines += _dos_lines(results)
    lines += _host_thread_lines(results)
    lines += _failure_lines(results)
    lines += ["Raw samples and per-repeat details: `results.json`; each run's command, config and log: `runs/`.", ""]
    return "\n".join(lines)
