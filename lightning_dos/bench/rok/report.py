"""Owns rok.md, the ROK curve's markdown report (it formats rok.json), and the byte formatting its figures share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_dos.bench import markdown as md

__all__ = ["byte_unit", "format_bytes", "render"]

UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def byte_unit(value: float) -> tuple[str, float]:
    """The unit that shows ``value`` bytes best (GiB, MiB, KiB or B) and its size."""
    return next(((unit, float(size)) for unit, size in UNITS if abs(value) >= size), ("B", 1.0))


def format_bytes(value: float | None) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``512 B``; ``–`` for None."""
    if value is None:
        return md.MISSING
    unit, size = byte_unit(value)
    if size == 1.0:
        return f"{value:.0f} B"
    return f"{value / size:.3g} {unit}" if abs(value) / size < 100 else f"{value / size:,.0f} {unit}"


def _curve_table(placements: Sequence[dict[str, Any]]) -> list[str]:
    header = ("placement", "status", "iteration ms", "overhead vs keep", "peak activation memory",
              "reduction vs keep", "tokens/s")
    rows = [(p["placement"], p["status"], md.num(p.get("headline_ms")),
             md.pct(p.get("overhead_vs_keep"), signed=True), format_bytes(p.get("peak_activation_bytes")),
             md.pct(p.get("reduction_vs_keep")), md.num(p.get("tokens_per_s"), 0)) for p in placements]
    return md.table(header, rows)


def _phase_table(placements: Sequence[dict[str, Any]]) -> list[str]:
    header = ("placement", "fwd ms", "bwd ms", "step ms", "iteration ms (synchronised)", "peak GPU GiB",
              "peak host GiB", "final loss", "loss vs keep")
    rows = []
    for p in placements:
        loss = p.get("loss_vs_keep")
        agree = md.MISSING if not loss else (
            "identical" if loss["identical"] else f"max diff {md.sig(loss['max_abs_diff'])}")
        rows.append((p["placement"], md.num(p.get("fwd_ms")), md.num(p.get("bwd_ms")), md.num(p.get("step_ms")),
                     md.num(p.get("iteration_ms")), md.num(p.get("peak_gpu_gib"), 2),
                     md.num(p.get("peak_host_gib"), 2), md.num(p.get("final_loss"), 4), agree))
    return md.table(header, rows)


def _counter_table(placements: Sequence[dict[str, Any]]) -> list[str]:
    header = ("placement", "saved tensors", "offloaded", "restored", "kept on device", "late restores (all)",
              "restore wait ms", "NVMe written", "NVMe read", "host pool")
    rows = []
    for p in placements:
        act = p.get("act")
        if not act:
            rows.append((p["placement"], "no hooks" if p.get("status") == "ok" else md.MISSING, *[md.MISSING] * 8))
            continue
        wait = act.get("restore_wait_s")
        rows.append((p["placement"], md.num(act.get("saved_tensors"), 0), format_bytes(act.get("offloaded_bytes")),
                     format_bytes(act.get("restored_bytes")), format_bytes(act.get("kept_bytes")),
                     md.num(act.get("late_restores_total"), 0), md.num(None if wait is None else wait * 1e3, 2),
                     format_bytes(act.get("nvme_written_bytes")), format_bytes(act.get("nvme_read_bytes")),
                     format_bytes(act.get("host_pool_bytes"))))
    return md.table(header, rows)


def _disk_lines(disk: dict[str, Any] | None) -> list[str]:
    if not disk:
        return []
    lines = ["## NVMe directory bandwidth", ""]
    if disk.get("error"):
        return lines + [f"Not measured in `{disk['directory']}`: {disk['error']}.", ""]
    lines += md.table(("directory", "file", "write MB/s (with fsync)", "read MB/s", "how"),
                      [(f"`{disk['directory']}`", format_bytes(disk["bytes"]), md.num(disk.get("write_mb_s"), 0),
                        md.num(disk.get("read_mb_s"), 0), disk.get("read_cache") or md.MISSING)])
    return lines + ["", "A temporary file written in 8 MiB chunks and fsync-ed, read back, then removed; MB = 10^6 "
                    "bytes.", ""]


def _probe_text(probe: dict[str, Any]) -> str:
    mb = probe["micro_batch"]
    if probe["fits"] is None:
        return f"{mb}: {probe['status']}"
    if probe["status"] == "oom":
        return f"{mb}: OOM"
    return f"{mb}: {format_bytes(probe['peak_bytes'])} {'fits' if probe['fits'] else 'too big'}"


def _budget_lines(budget: dict[str, Any] | None) -> list[str]:
    if not budget:
        return []
    lines = [f"## What the memory buys: the largest micro-batch within {budget['budget_gib']:g} GiB", "",
             f"Peak activation memory budget {budget['budget_gib']:g} GiB ({format_bytes(budget['budget_bytes'])}), "
             f"measured as above. Search: {budget['method']}.", ""]
    rows = []
    for s in budget["searches"]:
        rows.append((s["placement"], str(s["largest_micro_batch"]) if s["status"] != "incomplete"
                     else f">= {s['largest_micro_batch']}", format_bytes(s.get("peak_bytes")),
                     md.num(s.get("tokens_per_s"), 0), s["status"] + (f" ({s['reason']})" if s.get("reason") else ""),
                     "; ".join(_probe_text(p) for p in s["probes"])))
    lines += md.table(("placement", "largest micro-batch", "its peak activation memory", "its tokens/s", "search",
                     "probes (micro-batch: peak)"), rows)
    return lines + ["", "tokens/s of the starting micro-batch come from the placement's own run, the others from "
                    "their probe's (end to end where timed so).", ""]


def _hooks_text(p: dict[str, Any]) -> str:
    """Whether a placement ran with the offload's hooks (``keep``'s only measure)."""
    if p.get("hooks") and not p.get("offload"):
        return "on, measuring only (placement keep)"
    return md.MISSING if p.get("hooks") is None else ("on" if p["hooks"] else "off")


def render(doc: dict[str, Any], chart: str | None = "rok.png") -> str:
    """rok.md of a rok.json document."""
    cfg, rok, model, m = doc["config"], doc["rok"], doc["model"], doc["measurement"]
    placements = doc["placements"]
    planned = doc.get("placements_planned") or []
    lines = md.heading(doc, "ROK curve", "**Interrupted**: what ran after the interruption is missing or marked "
                       "skipped.", f"**Partial**: {len(placements)} of {len(planned)} placements so far."
                       if len(planned) > len(placements) else None)
    measures = m.get("memory_measures") or {}
    lines += ["", "## Configuration", "",
              f"- Model: {md.model_text(model)}; micro-batch {cfg['micro_batch']} x seq {cfg['seq_len']} = "
              f"{cfg['micro_batch'] * cfg['seq_len']:,} tokens per iteration, {cfg['precision']}, data {cfg['data']}, "
              f"seed {cfg['seed']}",
              f"- Strategy: {rok['strategy']} (plan {rok['plan']}), sub_group_size "
              f"{cfg['sub_group_size'] or 'of its fragment'}, the same for every placement, each in a fresh process",
              f"- Activation offload: min_tensor_bytes {rok['min_tensor_bytes']:,}, keep_last_layers "
              f"{rok['keep_last_layers']}" + (f", NVMe path `{rok['nvme_path']}`" if rok.get("nvme_path") else ""),
              f"- Iterations: {cfg['steps']} per run; warm-up {m['warmup_iterations'] or 'none'}, end to end "
              f"{m['e2e_iterations'] or 'none'}, synchronised {m['phase_iterations'] or 'none'}",
              f"- Iteration ms (the headline): {m['headline']}. Overhead vs keep = iteration / keep's - 1; "
              "reduction vs keep = 1 - peak activation memory / keep's; tokens/s = tokens per iteration / iteration.",
              f"- {m['timing']}"]
    if measures:
        lines += [f"- Peak activation memory ({name}): {text}." for name, text in measures.items()]
    lines += ["", *md.table(("placement", "activation checkpointing", "saved tensors go to", "offload hooks"),
                            [(p["placement"], "on" if p["checkpointing"] else "off",
                              p["offload"] or "stay on the device", _hooks_text(p)) for p in placements])]
    lines += ["", "## ROK curve", ""]
    if chart:
        lines += [f"![iteration time against peak activation memory]({chart})", ""]
    lines += _curve_table(placements)
    lines += ["", "## Phases (synchronised iterations)", ""]
    lines += _phase_table(placements)
    lines += ["", "## Activation offload counters (act/*, per iteration, median over the measured iterations)", ""]
    lines += _counter_table(placements)
    failed = [p for p in placements if p["status"] != "ok"]
    if failed:
        lines += ["", "## Not completed", ""]
        lines += [f"- {p['placement']}: {p['status']}: {p['reason']} (log: `{p.get('log')}`)" for p in failed]
    lines += [""]
    lines += _disk_lines(doc.get("disk"))
    lines += _budget_lines(doc.get("budget"))
    lines += ["Full resolved configuration:", "", *md.json_block({"bench": cfg, "rok": rok}), "",
              "Per-iteration figures (activation memory, act/* counters, phase times, losses) are in each "
              "run's `result.json` under `runs/`, with its log.", ""]
    return "\n".join(lines)
