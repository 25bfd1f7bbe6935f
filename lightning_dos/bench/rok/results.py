"""Owns turning ROK workers' raw measurements into figures and rok.json (pure Python).

A placement's headline is the median end-to-end iteration (the synchronised one without an end-to-end window); its
peak activation memory the largest over the measured iterations of the measure it has (device, else accounting);
its ``act/*`` counters per-iteration medians; against ``keep`` its overhead, memory reduction and loss agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_dos.bench.results import e2e_samples, iteration_windows, phase_figures, pick, series
from lightning_dos.bench.rok.search import Probe
from lightning_dos.bench.settings import Windows
from lightning_dos.bench.stats import finite, median
from lightning_dos.planning.placement import GIB


@dataclass(frozen=True)
class Placement:
    """One point of the ROK curve."""

    name: str  # what --placements takes
    checkpointing: bool  # activation checkpointing: each block's internals recomputed in backward
    offload: str | None  # where the offload moves saved tensors ("host", "nvme"); None: nothing moves


#: Every placement, in the order they run and are reported (the reference, ``keep``, first).
PLACEMENTS: dict[str, Placement] = {p.name: p for p in (
    Placement("keep", False, None), Placement("recompute", True, None), Placement("offload-host", False, "host"),
    Placement("offload-nvme", False, "nvme"))}
#: The memory measures: what each one is, for rok.json and the report.
MEASURES = {
    "device": "torch.cuda.max_memory_allocated over each measured iteration's forward and backward, less the memory "
              "allocated when its forward started (the peak is reset at every forward's start); the largest over the "
              "measured iterations",
    "accounting": "no device memory statistics here (CPU): the activation offload's own accounting, "
                  "act/device_peak_bytes, the most bytes of tensors saved for backward held resident at once (kept "
                  "storages plus restored ones); the largest over the measured iterations. It counts what autograd "
                  "saves: under recompute, each block's input, not the internals a block recomputes during backward "
                  "(a GPU's measure includes those)",
}
#: The ``act/*`` counters kept per placement, besides the memory measure.
COUNTERS = ("saved_tensors", "offloaded_tensors", "offloaded_bytes", "restored_tensors", "restored_bytes",
            "kept_bytes", "late_restores", "restore_wait_s", "write_wait_s", "nvme_written_bytes", "nvme_read_bytes",
            "host_pool_bytes", "host_peak_bytes", "nvme_peak_bytes", "device_peak_bytes")


def activation_peak(result: dict[str, Any], config: Windows) -> tuple[int | None, str | None, list[int | None]]:
    """``(peak bytes, measure, per measured iteration)`` of a worker's result: the GPU allocator's figures where the
    run has them, else the offload's accounting; ``(None, None, [])`` without either."""
    raw = result.get("activations") or {}
    measured = range(config.warmup, config.steps)
    for measure, key in (("device", "device_bytes"), ("accounting", "accounting_bytes")):
        values = pick(raw.get(key), measured)
        present = [int(v) for v in values if v is not None]
        if present:
            return max(present), measure, values
    return None, None, []


def headline(result: dict[str, Any], config: Windows) -> tuple[float | None, str]:
    """``(ms, how)``: the median end-to-end iteration, or the synchronised one when none was timed end to end."""
    e2e = median(e2e_samples(result.get("iterations") or {}, config))
    if e2e is not None:
        return e2e, "end to end"
    return median(series([result], "iteration_ms", config.phase_iterations)), "synchronised"


def counters(result: dict[str, Any], config: Windows) -> dict[str, float | None] | None:
    """Per-iteration medians of the ``act/*`` counters over the measured iterations, plus ``late_restores_total``;
    None for a run without the offload's hooks."""
    per = [c for c in pick((result.get("activations") or {}).get("counters"), range(config.warmup, config.steps)) if c]
    if not per:
        return None
    out: dict[str, float | None] = {name: median([c.get(f"act/{name}") for c in per]) for name in COUNTERS}
    out["late_restores_total"] = sum(finite([c.get("act/late_restores") for c in per]))
    out["iterations"] = float(len(per))
    return out


def placement_summary(name: str, result: dict[str, Any], config: Windows, micro_batch: int,
                      tokens: int) -> dict[str, Any]:
    """One placement's figures from its worker's raw result (any status): ``config`` is its run, ``tokens`` per
    iteration."""
    p = PLACEMENTS[name]
    raw = result.get("activations") or {}
    iterations = result.get("iterations") or {}
    ok = result.get("status") == "ok"
    ms, how = headline(result, config) if ok else (None, "end to end" if config.e2e_count else "synchronised")
    peak, measure, per_iteration = activation_peak(result, config) if ok else (None, None, [])
    medians, spreads = phase_figures([result], config)
    losses = iterations.get("loss") or []
    return {
        "placement": name,
        "checkpointing": p.checkpointing,
        "offload": p.offload,
        "hooks": raw.get("hooks"),
        "status": result.get("status", "failed"),
        "reason": result.get("reason"),
        "micro_batch": micro_batch,
        "tokens_per_iteration": tokens,
        "headline_ms": ms,
        "headline": how,
        "tokens_per_s": tokens / (ms / 1e3) if ms else None,
        "e2e_iteration_ms": median(e2e_samples(iterations, config)) if ok else None,
        **medians,
        "spread": spreads,
        "peak_activation_bytes": peak,
        "peak_activation_gib": None if peak is None else peak / GIB,
        "measure": measure,
        "peak_activation_bytes_per_iteration": per_iteration,
        "accounting_peak_bytes": max(finite(pick(raw.get("accounting_bytes"), range(config.warmup, config.steps))),
                                     default=None),
        "act": counters(result, config) if ok else None,
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "peak_gpu_gib": result.get("peak_gpu_gib"),
        "peak_host_gib": result.get("peak_host_gib"),
        "device": result.get("device"),
        "elapsed_s": result.get("elapsed_s"),
        "log": result.get("log"),
        "reused": bool(result.get("reused")),
    }


def compare_to_keep(placements: list[dict[str, Any]]) -> None:
    """Add ``overhead_vs_keep`` (time / keep's - 1), ``reduction_vs_keep`` (1 - peak / keep's) and ``loss_vs_keep``
    (largest absolute loss difference over the iterations, and whether every loss is identical) to every summary;
    None where keep or the placement did not complete."""
    keep = next((p for p in placements if p["placement"] == "keep" and p["status"] == "ok"), None)
    for p in placements:
        ok = keep is not None and p["status"] == "ok"
        p["overhead_vs_keep"] = (p["headline_ms"] / keep["headline_ms"] - 1.0
                                 if ok and p["headline_ms"] and keep["headline_ms"] else None)
        p["reduction_vs_keep"] = (1.0 - p["peak_activation_bytes"] / keep["peak_activation_bytes"]
                                  if ok and p["peak_activation_bytes"] is not None and keep["peak_activation_bytes"]
                                  else None)
        pairs = list(zip(p["losses"], keep["losses"])) if ok else []
        p["loss_vs_keep"] = None if not pairs else {
            "max_abs_diff": max(abs(a - b) for a, b in pairs if a is not None and b is not None),
            "identical": all(a == b for a, b in pairs) and len(p["losses"]) == len(keep["losses"]),
            "iterations_compared": len(pairs)}


def probe_of(result: dict[str, Any], config: Windows, micro_batch: int, tokens: int, budget_bytes: float,
             source: str = "probe") -> Probe:
    """The search probe a worker's result (or a placement's own run) stands for: it fits when it completed with its
    peak activation memory within ``budget_bytes``; not when it ran out of memory; unknown otherwise."""
    status = result.get("status", "failed")
    common = {"micro_batch": micro_batch, "status": status, "reason": result.get("reason"), "source": source,
              "elapsed_s": result.get("elapsed_s"), "log": result.get("log")}
    if status == "oom":
        return Probe(fits=False, **common)
    if status != "ok":
        return Probe(fits=None, **common)
    peak, _, _ = activation_peak(result, config)
    ms, _ = headline(result, config)
    tokens_per_s = tokens / (ms / 1e3) if ms else None
    if peak is None:
        return Probe(fits=None, tokens_per_s=tokens_per_s,
                     **{**common, "reason": "no activation memory measured (no GPU statistics, no offload hooks)"})
    return Probe(fits=peak <= budget_bytes, peak_bytes=peak, tokens_per_s=tokens_per_s, **common)


def rok_measurement(config: Windows, placements: list[dict[str, Any]]) -> dict[str, Any]:
    """rok.json's ``measurement``: the iteration windows, the headline and the memory measures the placements used."""
    return {**iteration_windows(config), "headline": "the median end-to-end iteration (unsynchronised, as the bench's "
            "headline); the synchronised median where no iteration was timed end to end",
            "memory_measures": {m: MEASURES[m] for m in sorted({p["measure"] for p in placements if p.get("measure")})}}
