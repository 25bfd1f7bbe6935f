"""Owns the check of DOS's claims against the configurations measured in one bench run.

Every claim is a ratio of two figures from the same invocation (never against numbers from elsewhere):
DOS's best iteration against vanilla ZeRO-3 offload and against the static split at ratio 0.5 (at lower
peak GPU memory than that split), its step (the update phase) against vanilla's, and its final loss against
vanilla's. A claim whose configurations did not both complete is "not measured", never "met".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the claims, with their thresholds (from the project's targets for the reference GPU host)
ITERATION_VS_VANILLA = 2.5
ITERATION_VS_SPLIT = 1.4
SPLIT_RATIO = 0.5
STEP_VS_VANILLA = 3.0
LOSS_REL_TOLERANCE = 1e-2  # bf16: final losses within 1% of vanilla's


def _ok(results: Sequence[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    return [r for r in results if r.get("strategy") == strategy and r.get("status") == "ok"
            and r.get("iteration_ms") is not None]


def _claim(name: str, threshold: str, value: float | None, met: bool | None, detail: str) -> dict[str, Any]:
    status = "not measured" if met is None else ("met" if met else "missed")
    return {"claim": name, "threshold": threshold, "value": value, "status": status, "detail": detail}


def check_claims(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per claim: the measured value, the threshold and met / missed / not measured."""
    dos = _ok(results, "deep_optimizer_states")
    vanilla = next(iter(_ok(results, "zero3_offload")), None)
    split = next((r for r in _ok(results, "static_split") if float(r.get("plan", -1)) == SPLIT_RATIO), None)
    best = min(dos, key=lambda r: r["iteration_ms"], default=None)
    claims = []

    if best is not None and vanilla is not None:
        ratio = vanilla["iteration_ms"] / best["iteration_ms"]
        detail = f"{best['label']} {best['iteration_ms']:.1f} ms vs {vanilla['label']} {vanilla['iteration_ms']:.1f} ms"
        claims.append(_claim("iteration vs zero3_offload", f">= {ITERATION_VS_VANILLA}x", ratio,
                             ratio >= ITERATION_VS_VANILLA, detail))
        step_best = min(dos, key=lambda r: r["step_ms"])
        step_ratio = vanilla["step_ms"] / step_best["step_ms"]
        claims.append(_claim("update phase (step) vs zero3_offload", f">= {STEP_VS_VANILLA}x", step_ratio,
                             step_ratio >= STEP_VS_VANILLA,
                             f"{step_best['label']} {step_best['step_ms']:.1f} ms vs {vanilla['step_ms']:.1f} ms"))
        final, base = best.get("final_loss"), vanilla.get("final_loss")
        rel = abs(final - base) / abs(base) if final is not None and base else None
        claims.append(_claim("final loss vs zero3_offload", f"within {LOSS_REL_TOLERANCE:.0%}", rel,
                             None if rel is None else rel <= LOSS_REL_TOLERANCE,
                             f"{best['label']} {final} vs {base}"))
    else:
        for name in ("iteration vs zero3_offload", "update phase (step) vs zero3_offload",
                     "final loss vs zero3_offload"):
            claims.append(_claim(name, "-", None, None, "needs zero3_offload and a DOS configuration"))

    lighter = [r for r in dos if split is not None and r.get("peak_gpu_gib") is not None
               and split.get("peak_gpu_gib") is not None and r["peak_gpu_gib"] < split["peak_gpu_gib"]]
    name = f"iteration vs static_split {SPLIT_RATIO} at lower peak GPU memory"
    if split is None or not dos:
        claims.append(_claim(name, f">= {ITERATION_VS_SPLIT}x", None, None,
                             f"needs static_split {SPLIT_RATIO} and a DOS configuration"))
    elif not lighter:
        claims.append(_claim(name, f">= {ITERATION_VS_SPLIT}x", None, False,
                             f"no DOS configuration used less GPU memory than the split's {split['peak_gpu_gib']} GiB"))
    else:
        cand = min(lighter, key=lambda r: r["iteration_ms"])
        ratio = split["iteration_ms"] / cand["iteration_ms"]
        claims.append(_claim(name, f">= {ITERATION_VS_SPLIT}x", ratio, ratio >= ITERATION_VS_SPLIT,
                             f"{cand['label']} {cand['iteration_ms']:.1f} ms, {cand['peak_gpu_gib']:.1f} GiB vs "
                             f"{split['label']} {split['iteration_ms']:.1f} ms, {split['peak_gpu_gib']:.1f} GiB"))
    return claims
