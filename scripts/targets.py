"""The project's own targets for ``lightning-dos bench`` reports: met / missed / not measured, from a report's JSON.

A bench report states what was measured (figures side by side, and ratios of configurations measured in the same
invocation); whether those ratios meet what this project aims for on its reference GPU host is a question for the
project, not for a user's report, so the thresholds live here, outside the package::

    python scripts/targets.py runs/compare/<run>/results.json  # strategy comparison: the claims
    python scripts/targets.py runs/sweep/<run>/sweep.json      # plan sweep: the four targets, per budget and overall
    python scripts/targets.py runs/rok/<run>/rok.json          # ROK curve: the curve's claims

``tests/unit/test_targets.py`` checks the committed reports under benchmarks/ with these functions (their JSON
carries the statuses the bench printed when they were measured).

**Claims** (a comparison): every claim is a ratio of two figures from the same invocation (never against numbers from
elsewhere): first the headline, DOS's best end-to-end iteration (unsynchronised, what a user sees) against vanilla
ZeRO-3 offload's; then, synchronised, DOS's best iteration against vanilla's and against the static split at ratio
0.5 (at lower peak GPU memory than that split), its step (the update phase) against vanilla's, and its final loss
against vanilla's. A claim whose configurations did not both complete is "not measured", never "met". Results from
before the end-to-end figures were recorded (no ``e2e_iteration_ms`` key) get no end-to-end claim. These are checked
at the smallest device count that ran; with several device counts the data-parallel claims are added, each only where
the device counts it needs ran: at every larger count N, DOS ``auto``'s speedup over vanilla keeps at least 90% of
what it is at the smallest count, and DOS ``auto`` is faster than the static split 0.5 at N at lower peak GPU memory
(both end to end where every figure has it, else synchronised).

**ROK claims**: offload-host against keep (peak activation memory at least 40% lower, at most 5% more time per
iteration) and against recompute (faster, at no more peak activation memory); with a budget, the placement fitting
the largest micro-batch against keep's tokens/s.

**Targets** (a plan sweep), per budget and over the invocation: ``auto`` within 5% of the best swept plan, the median
prediction error of the swept plans' update phases at most 10%, no process out of memory, failed or timed out, and
``auto`` faster than every ``stride:K``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What a DOS row's label says when it asked for its update overlapped with the next forward: ``dos(auto,overlap)``.
OVERLAP_SUFFIX = ",overlap"


def devices_of(result: dict[str, Any]) -> int:
    """The device count of a result (1 for those from before ``--devices``)."""
    return int(result.get("devices") or 1)


def median(values: Sequence[float]) -> float | None:
    """The median of ``values``; None when there are none."""
    return statistics.median(values) if values else None

#: the claims, with their thresholds (from the project's targets for the reference GPU host)
ITERATION_VS_VANILLA = 2.5
#: the headline, end to end (the time per iteration a user sees): at least this many times vanilla's
E2E_VS_VANILLA = 3.5
E2E_CLAIM = "end-to-end iteration vs zero3_offload"
#: against torchao's CPUOffloadOptimizer: at most this share of its end-to-end iteration ...
E2E_VS_TORCHAO = 0.8
#: ... by a DOS configuration whose peak GPU memory is at most this share of its
GPU_VS_TORCHAO = 0.6
#: DOS's forward + backward (synchronised) at most this many times plain PyTorch's (the floor one GPU can reach)
FWD_BWD_VS_PLAIN = 1.15
#: the kinds that offload the optimizer state, which the fastest DOS configuration must beat end to end
OFFLOADING_PEERS = ("zero3_offload", "static_split", "torchao_offload", "superoffload", "zenflow", "fsdp_offload")
ITERATION_VS_SPLIT = 1.4
SPLIT_RATIO = 0.5
STEP_VS_VANILLA = 3.0
LOSS_REL_TOLERANCE = 1e-2  # bf16: final losses within 1% of vanilla's
#: data parallel, per device count N (the entry of the largest count <= N): DOS auto's speedup over vanilla at N
#: devices keeps at least this share of the one at the smallest count
DP_SPEEDUP_KEPT = {2: 0.9, 4: 0.85, 8: 0.8}
#: ... and its tokens/s at N devices are at least this many times its own at one device
DP_TOKENS_SCALING = {4: 3.4, 8: 6.0}
#: ... and at N > 1 devices it is this many times faster, end to end, than each multi-GPU peer at N
DP_VS_PEERS = {"no_offload": 1.0, "fsdp_offload": 2.0}
#: a model of at least this many parameters (one that needs offload on a node) ...
LARGE_MODEL_PARAMS = 10e9
#: ... at N > 1 devices: DOS auto this many times faster, end to end, than each of these at N
LARGE_DP_VS_PEERS = {"zero3_offload": 2.5, "fsdp_offload": 1.5}


def _ok(results: Sequence[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    return [r for r in results if r.get("strategy") == strategy and r.get("status") == "ok"
            and r.get("iteration_ms") is not None]


def _status(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "missed")


def _claim(name: str, threshold: str, value: float | None, met: bool | None, detail: str) -> dict[str, Any]:
    return {"claim": name, "threshold": threshold, "value": value, "status": _status(met), "detail": detail}


def check_claims(results: Sequence[dict[str, Any]], params: float | None = None) -> list[dict[str, Any]]:
    """One entry per claim: the measured value, the threshold and met / missed / not measured.

    The single-device claims at the smallest device count of ``results``; then, per larger count, the data-parallel
    ones (:func:`dp_claims`); at every count above one, DOS against the multi-GPU peers (:func:`dp_peer_claims`).
    """
    counts = sorted({devices_of(r) for r in results}) or [1]
    reference = counts[0]
    claims = _device_claims([r for r in results if devices_of(r) == reference])
    if reference > 1:  # no single-device row: the split claim at the smallest count is a data-parallel one too
        claims.append(_dp_split_claim(results, reference))
    for devices in counts[1:]:
        claims += dp_claims(results, reference, devices)
    for devices in (n for n in counts if n > 1):
        claims += dp_peer_claims(results, devices, params)
    return claims


def _device_claims(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The claims of one device count's results."""
    dos = _ok(results, "deep_optimizer_states")
    vanilla = next(iter(_ok(results, "zero3_offload")), None)
    split = next((r for r in _ok(results, "static_split") if float(r.get("plan", -1)) == SPLIT_RATIO), None)
    best = min(dos, key=lambda r: r["iteration_ms"], default=None)
    claims = []
    if any("e2e_iteration_ms" in r for r in results):
        claims.append(_e2e_claim(dos, vanilla))
        claims += peer_claims(results)

    if best is not None and vanilla is not None:
        ratio = vanilla["iteration_ms"] / best["iteration_ms"]
        detail = f"{best['label']} {best['iteration_ms']:.1f} ms vs {vanilla['label']} {vanilla['iteration_ms']:.1f} ms"
        claims.append(_claim("iteration vs zero3_offload", f">= {ITERATION_VS_VANILLA}x", ratio,
                             ratio >= ITERATION_VS_VANILLA, detail))
        # an overlapped row's step returns once the update is issued (the update runs in the next forward)
        serial = _without_overlap(dos)
        if serial:
            step_best = min(serial, key=lambda r: r["step_ms"])
            step_ratio = vanilla["step_ms"] / step_best["step_ms"]
            claims.append(_claim("update phase (step) vs zero3_offload", f">= {STEP_VS_VANILLA}x", step_ratio,
                                 step_ratio >= STEP_VS_VANILLA,
                                 f"{step_best['label']} {step_best['step_ms']:.1f} ms vs {vanilla['step_ms']:.1f} ms"))
        else:
            claims.append(_claim("update phase (step) vs zero3_offload", f">= {STEP_VS_VANILLA}x", None, None,
                                 "needs a DOS configuration without overlap (an overlapped step holds no update)"))
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


def _auto(results: Sequence[dict[str, Any]], devices: int) -> dict[str, Any] | None:
    return next((r for r in _ok(results, "deep_optimizer_states") if devices_of(r) == devices
                 and str(r.get("plan")).strip().lower() == "auto"), None)


def _at(results: Sequence[dict[str, Any]], strategy: str, devices: int) -> list[dict[str, Any]]:
    return [r for r in _ok(results, strategy) if devices_of(r) == devices]


def _timed(rows: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """The figure to compare ``rows`` by: ``e2e_iteration_ms`` when every one has it, else ``iteration_ms``."""
    if all(r.get("e2e_iteration_ms") for r in rows):
        return "e2e_iteration_ms", "end to end"
    return "iteration_ms", "synchronised"


def dp_claims(results: Sequence[dict[str, Any]], reference: int, devices: int) -> list[dict[str, Any]]:
    """The data-parallel claims at ``devices`` against the ``reference`` (smallest) device count."""
    claims = [_dp_speedup_claim(results, reference, devices), _dp_split_claim(results, devices)]
    if reference == 1 and devices in DP_TOKENS_SCALING:
        claims.append(_dp_tokens_claim(results, devices))
    return claims


def dp_peer_claims(results: Sequence[dict[str, Any]], devices: int, params: float | None) -> list[dict[str, Any]]:
    """DOS auto against each multi-GPU peer at ``devices`` (:data:`DP_VS_PEERS`), and, for a model of ``params`` >=
    :data:`LARGE_MODEL_PARAMS`, against :data:`LARGE_DP_VS_PEERS`."""
    claims = [_dp_peer_claim(results, peer, devices, target) for peer, target in DP_VS_PEERS.items()]
    if params is not None and params >= LARGE_MODEL_PARAMS:
        suffix = f", a model of >= {LARGE_MODEL_PARAMS / 1e9:g}B parameters"
        claims += [_dp_peer_claim(results, peer, devices, target, suffix) for peer, target in LARGE_DP_VS_PEERS.items()]
    return claims


def _by_count(table: dict[int, float], devices: int) -> float:
    """``table``'s entry for the largest device count <= ``devices``."""
    return table[max(n for n in table if n <= devices)]


def _dp_tokens_claim(results: Sequence[dict[str, Any]], devices: int) -> dict[str, Any]:
    """DOS auto's tokens/s at ``devices`` over its own at one device, against :data:`DP_TOKENS_SCALING`."""
    target = DP_TOKENS_SCALING[devices]
    name, threshold = f"dos(auto) tokens/s at DP={devices} vs DP=1", f">= {target:g}x"
    one, many = _auto(results, 1), _auto(results, devices)
    if one is None or many is None:
        return _claim(name, threshold, None, None, f"needs dos(auto) at 1 and at {devices} devices")
    key = "e2e_tokens_per_s" if one.get("e2e_tokens_per_s") and many.get("e2e_tokens_per_s") else "tokens_per_s"
    ratio = many[key] / one[key]
    how = "end to end" if key.startswith("e2e") else "synchronised"
    return _claim(name, threshold, ratio, ratio >= target, f"{many[key]:,.0f} vs {one[key]:,.0f} tokens/s ({how})")


def _dp_peer_claim(results: Sequence[dict[str, Any]], peer: str, devices: int, target: float,
                   suffix: str = "") -> dict[str, Any]:
    """DOS auto against ``peer`` at ``devices``, end to end where both have it, against ``target`` (> 1x when it is
    1, else at least it); ``suffix`` ends the claim's name."""
    name = f"dos(auto) vs {peer} at DP={devices}{suffix}"
    threshold = f"> {target:g}x" if target == 1 else f">= {target:g}x"
    auto, other = _auto(results, devices), next(iter(_at(results, peer, devices)), None)
    if auto is None or other is None:
        why = _not_ok([r for r in results if devices_of(r) == devices], peer)
        return _claim(name, threshold, None, None, f"needs dos(auto) and {peer} at {devices} devices{why}")
    key, how = _timed([auto, other])
    ratio = other[key] / auto[key]
    return _claim(name, threshold, ratio, ratio > target if target == 1 else ratio >= target,
                  f"{auto[key]:.1f} ms vs {other['label']} {other[key]:.1f} ms ({how})")


def _dp_speedup_claim(results: Sequence[dict[str, Any]], reference: int, devices: int) -> dict[str, Any]:
    """DOS auto's speedup over vanilla at ``devices`` over the same at ``reference``, against
    :data:`DP_SPEEDUP_KEPT`."""
    name = f"DOS/zero3_offload ratio at DP={devices} vs DP={reference}"
    target = _by_count(DP_SPEEDUP_KEPT, devices)
    threshold = f">= {target:g} x the DP={reference} ratio"
    pairs = [(next(iter(_at(results, "zero3_offload", d)), None), _auto(results, d)) for d in (reference, devices)]
    rows = [r for pair in pairs for r in pair if r is not None]
    if len(rows) < 4:
        return _claim(name, threshold, None, None,
                      f"needs zero3_offload and dos(auto) at {reference} and at {devices} devices")
    key, how = _timed(rows)
    (vanilla_ref, auto_ref), (vanilla_n, auto_n) = rows[:2], rows[2:]
    ratio_ref, ratio_n = vanilla_ref[key] / auto_ref[key], vanilla_n[key] / auto_n[key]
    kept = ratio_n / ratio_ref
    return _claim(name, threshold, kept, kept >= target,
                  f"dos(auto) {ratio_n:.2f}x zero3_offload at DP={devices}, {ratio_ref:.2f}x at DP={reference} "
                  f"({how})")


def _dp_split_claim(results: Sequence[dict[str, Any]], devices: int) -> dict[str, Any]:
    """DOS auto faster than the static split 0.5 at ``devices``, at lower peak GPU memory (the largest rank's)."""
    name = f"dos(auto) vs static_split {SPLIT_RATIO} at DP={devices} at lower peak GPU memory"
    threshold = "> 1x, less GPU memory"
    auto = _auto(results, devices)
    split = next((r for r in _at(results, "static_split", devices) if float(r.get("plan", -1)) == SPLIT_RATIO), None)
    if auto is None or split is None:
        return _claim(name, threshold, None, None,
                      f"needs dos(auto) and static_split {SPLIT_RATIO} at {devices} devices")
    key, how = _timed([auto, split])
    ratio = split[key] / auto[key]
    detail = f"{auto['label']} {auto[key]:.1f} ms vs {split['label']} {split[key]:.1f} ms ({how})"
    gpu, split_gpu = auto.get("peak_gpu_gib"), split.get("peak_gpu_gib")
    if gpu is None or split_gpu is None:
        return _claim(name, threshold, ratio, None, detail + "; no GPU memory figures (no GPU)")
    detail += f"; peak GPU {gpu:.1f} vs {split_gpu:.1f} GiB"
    return _claim(name, threshold, ratio, ratio > 1.0 and gpu < split_gpu, detail)


def _e2e_claim(dos: Sequence[dict[str, Any]], vanilla: dict[str, Any] | None) -> dict[str, Any]:
    """Vanilla's median end-to-end iteration over the fastest DOS configuration's, against :data:`E2E_VS_VANILLA`."""
    best = _e2e_best(dos)
    threshold = f">= {E2E_VS_VANILLA}x"
    if vanilla is None or not vanilla.get("e2e_iteration_ms") or best is None:
        return _claim(E2E_CLAIM, threshold, None, None,
                      "needs end-to-end iterations of zero3_offload and a DOS configuration")
    ratio = vanilla["e2e_iteration_ms"] / best["e2e_iteration_ms"]
    return _claim(E2E_CLAIM, threshold, ratio, ratio >= E2E_VS_VANILLA,
                  f"{best['label']} {best['e2e_iteration_ms']:.1f} ms vs {vanilla['label']} "
                  f"{vanilla['e2e_iteration_ms']:.1f} ms, end to end")


def _e2e_best(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of ``rows`` with the shortest end-to-end iteration (None: none has one)."""
    return min((r for r in rows if r.get("e2e_iteration_ms")), key=lambda r: r["e2e_iteration_ms"], default=None)


def _without_overlap(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DOS rows that ran without ``overlap`` (their ``dos`` summary says so; older reports: their label): their
    synchronised phases hold the whole update in the step."""
    def overlapped(row: dict[str, Any]) -> bool:
        flag = (row.get("dos") or {}).get("overlapped")
        return OVERLAP_SUFFIX in row["label"] if flag is None else bool(flag)

    return [r for r in rows if not overlapped(r)]


def peer_claims(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """DOS against the peers a user could pick instead, end to end: torchao's offload (faster at less GPU memory),
    every other offloading row, and plain PyTorch's forward + backward (the floor one GPU can reach; DOS's fastest
    configuration without overlap, whose synchronised forward holds no wait for an update in flight)."""
    dos = _ok(results, "deep_optimizer_states")
    claims = []

    name = f"end-to-end iteration vs torchao_offload at <= {GPU_VS_TORCHAO:.0%} its peak GPU memory"
    threshold = f"<= {E2E_VS_TORCHAO}x"
    torchao = _e2e_best(_ok(results, "torchao_offload"))
    if torchao is None or torchao.get("peak_gpu_gib") is None:
        claims.append(_claim(name, threshold, None, None, "needs torchao_offload end to end, with its peak GPU memory"
                             + _not_ok(results, "torchao_offload")))
    else:
        cap = GPU_VS_TORCHAO * torchao["peak_gpu_gib"]
        best = _e2e_best([r for r in dos if r.get("peak_gpu_gib") is not None and r["peak_gpu_gib"] <= cap])
        if best is None:
            claims.append(_claim(name, threshold, None, False if dos else None,
                                 f"no DOS configuration ran end to end within {cap:.1f} GiB"))
        else:
            ratio = best["e2e_iteration_ms"] / torchao["e2e_iteration_ms"]
            claims.append(_claim(name, threshold, ratio, ratio <= E2E_VS_TORCHAO,
                                 f"{best['label']} {best['e2e_iteration_ms']:.1f} ms, "
                                 f"{best['peak_gpu_gib']:.1f} GiB vs torchao_offload "
                                 f"{torchao['e2e_iteration_ms']:.1f} ms, {torchao['peak_gpu_gib']:.1f} GiB"))

    name, threshold = "end-to-end iteration vs every other offloading row", "> 1x the fastest"
    best = _e2e_best(dos)
    others = [r for kind in OFFLOADING_PEERS for r in _ok(results, kind) if r.get("e2e_iteration_ms")]
    missing = "".join(_not_ok(results, kind) for kind in OFFLOADING_PEERS)
    if best is None or not others:
        claims.append(_claim(name, threshold, None, None, "needs DOS and another offloading row end to end" + missing))
    else:
        rival = min(others, key=lambda r: r["e2e_iteration_ms"])
        ratio = rival["e2e_iteration_ms"] / best["e2e_iteration_ms"]
        claims.append(_claim(name, threshold, ratio, ratio > 1.0,
                             f"{best['label']} {best['e2e_iteration_ms']:.1f} ms vs the fastest other, "
                             f"{rival['label']} {rival['e2e_iteration_ms']:.1f} ms" + missing))

    name, threshold = "forward + backward vs plain", f"<= {FWD_BWD_VS_PLAIN}x"
    plain = next(iter(_ok(results, "plain")), None)
    # an overlapped row's synchronised forward holds its wait for the update in flight: not a forward to compare
    serial = _e2e_best(_without_overlap(dos))
    if serial is None or plain is None or serial.get("fwd_ms") is None or plain.get("fwd_ms") is None:
        claims.append(_claim(name, threshold, None, None,
                             "needs plain and the phase times of a DOS configuration without overlap"
                             + _not_ok(results, "plain")))
    else:
        ours, floor = serial["fwd_ms"] + serial["bwd_ms"], plain["fwd_ms"] + plain["bwd_ms"]
        ratio = ours / floor
        claims.append(_claim(name, threshold, ratio, ratio <= FWD_BWD_VS_PLAIN,
                             f"{serial['label']} {serial['fwd_ms']:.1f} + {serial['bwd_ms']:.1f} ms vs plain "
                             f"{plain['fwd_ms']:.1f} + {plain['bwd_ms']:.1f} ms (synchronised)"))
    return claims


def _not_ok(results: Sequence[dict[str, Any]], strategy: str) -> str:
    """``; <label>: <status>`` for each row of ``strategy`` that did not complete, to say why a claim lacks it."""
    return "".join(f"; {r['label']}: {r.get('status')}" for r in results
                   if r.get("strategy") == strategy and r.get("status") != "ok")


#: auto's median update time may exceed the best swept plan's by at most this share.
AUTO_WITHIN = 0.05
#: Median relative prediction error over the swept plans' measured update phases, at most.
PREDICTION_ERROR = 0.10
AUTO_VS_BEST = "auto within 5% of the best swept plan"
PREDICTION = "median prediction error <= 10%"
NO_OOM = "no OOM"
AUTO_VS_STRIDES = "auto beats every stride:K"
TARGETS = (AUTO_VS_BEST, PREDICTION, NO_OOM, AUTO_VS_STRIDES)
#: Statuses that miss the no-OOM target: out of memory, a crash, or no result in time.
FAILED_STATUSES = ("oom", "failed", "timeout")


def _target(name: str, threshold: str, value: float | None, met: bool | None, detail: str) -> dict[str, Any]:
    return {"target": name, "threshold": threshold, "value": value, "status": _status(met), "detail": detail}


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def best_plan(plans: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The completed swept plan with the smallest median update time."""
    done = [p for p in plans if p["status"] == "ok" and p["update_ms"] is not None]
    return min(done, key=lambda p: p["update_ms"], default=None)


def check_targets(plans: Sequence[dict[str, Any]], auto: dict[str, Any],
                  processes: dict[str, str]) -> list[dict[str, Any]]:
    """The four targets for one budget: met / missed / not measured, each with its figure.

    ``processes`` maps each process to its status.
    """
    targets = []
    auto_ms = auto["update_ms"] if auto["status"] == "ok" else None
    best = best_plan(plans)
    if auto_ms is None or best is None:
        targets.append(_target(AUTO_VS_BEST, f"<= +{AUTO_WITHIN:.0%}", None, None,
                               "needs auto and at least one swept plan measured"))
    else:
        excess = auto_ms / best["update_ms"] - 1.0
        targets.append(_target(AUTO_VS_BEST, f"<= +{AUTO_WITHIN:.0%}", excess, auto_ms <= best["update_ms"] *
                               (1.0 + AUTO_WITHIN), f"auto {_ms(auto_ms)} vs best swept {best['plan']} "
                               f"{_ms(best['update_ms'])} ({excess:+.1%})"))

    errors = [e for p in plans for e in p["rel_errors"]]
    error = median(errors)
    measured_plans = sum(1 for p in plans if p["rel_errors"])
    targets.append(_target(PREDICTION, f"<= {PREDICTION_ERROR:.0%}", error,
                           None if error is None else error <= PREDICTION_ERROR,
                           f"median over {len(errors)} measured update phases of {measured_plans} swept plans"
                           if errors else "no swept plan measured"))

    failed = {name: status for name, status in processes.items() if status in FAILED_STATUSES}
    unknown = {name: status for name, status in processes.items() if status != "ok" and name not in failed}
    if failed:
        where = [f"plan {p['plan']}" for p in plans if p["status"] in FAILED_STATUSES]
        where += ["auto"] if auto["status"] in FAILED_STATUSES else []
        detail = "; ".join(f"{name}: {status}" for name, status in failed.items())
        detail += f" (during {', '.join(where)})" if where else ""
        targets.append(_target(NO_OOM, "every process completes", float(len(failed)), False, detail))
    elif unknown:
        targets.append(_target(NO_OOM, "every process completes", None, None,
                               "; ".join(f"{name}: {status}" for name, status in unknown.items())))
    else:
        demoted = max((p["demoted_max"] or 0 for p in plans), default=0)
        targets.append(_target(NO_OOM, "every process completes", 0.0, True,
                               f"{len(processes)} processes, {len(plans)} plans completed; at most {demoted} "
                               "subgroups demoted to fit"))

    strides = [p for p in plans if p["kind"] == "stride" and p["status"] == "ok" and p["update_ms"] is not None]
    if auto_ms is None or not strides:
        targets.append(_target(AUTO_VS_STRIDES, "< every stride:K", None, None, "needs auto and a stride:K measured"))
    else:
        fastest = min(strides, key=lambda p: p["update_ms"])
        ratio = auto_ms / fastest["update_ms"]
        targets.append(_target(AUTO_VS_STRIDES, "< every stride:K", ratio, auto_ms < fastest["update_ms"],
                               f"auto {_ms(auto_ms)} vs fastest {fastest['plan']} {_ms(fastest['update_ms'])} "
                               f"({ratio:.3f}x) of {len(strides)} stride plans"))
    return targets


def budget_targets(budget: dict[str, Any]) -> list[dict[str, Any]]:
    """The four targets of one budget of a sweep.json (its plans, auto and its process's status)."""
    return check_targets(budget["plans"], budget["auto"], {"sweep process": budget["fixed"]["status"]})


def overall_targets(budgets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target over all budgets: missed if any budget missed it, else not measured if any did not measure it.

    The value is the worst budget's (largest: excess, error, failed processes, ratio).
    """
    out = []
    per_budget = [(b["budget"]["label"], {t["target"]: t for t in budget_targets(b)}) for b in budgets]
    for name in TARGETS:
        per = [(label, targets[name]) for label, targets in per_budget]
        statuses = [t["status"] for _, t in per]
        if not per:
            status = "not measured"
        elif "missed" in statuses:
            status = "missed"
        elif "not measured" in statuses:
            status = "not measured"
        else:
            status = "met"
        values = [t["value"] for _, t in per if t["value"] is not None]
        out.append({"target": name, "threshold": per[0][1]["threshold"] if per else "-",
                    "value": max(values) if values else None, "status": status,
                    "detail": "; ".join(f"{label}: {t['status']}" for label, t in per)})
    return out


# ------------------------------------------------------------------ ROK curve (bench rok)

#: offload-host's peak activation memory at least this much below keep's ...
ROK_REDUCTION = 0.40
#: ... at most this much slower per iteration (TBA: 47% less activation memory at a few percent).
ROK_OVERHEAD = 0.05
ROK_HOST_VS_KEEP = "offload-host cuts peak activation memory >= 40% vs keep at <= 5% iteration overhead"
ROK_HOST_VS_RECOMPUTE = "offload-host faster than recompute at equal or lower memory"
ROK_BUDGET = "within the activation budget, the placement fitting the largest micro-batch beats keep's tokens/s"
ROK_CLAIMS = (ROK_HOST_VS_KEEP, ROK_HOST_VS_RECOMPUTE, ROK_BUDGET)
#: How a finished micro-batch search ended (:data:`~lightning_dos.bench.rok.search.SEARCH_STATUSES` less "incomplete").
_SEARCHED = ("found", "capped", "none fits")


def _measured(placements: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The completed placement ``name`` with an iteration time and a peak activation memory, or None."""
    return next((p for p in placements if p["placement"] == name and p["status"] == "ok"
                 and p.get("headline_ms") is not None and p.get("peak_activation_bytes") is not None), None)


def rok_claims(placements: Sequence[dict[str, Any]], budget: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The ROK curve's claims, from its placements' summaries (:mod:`lightning_dos.bench.rok.results`) and, with an
    activation budget, its micro-batch searches (rok.json's ``budget``): met / missed / not measured, each with its
    figure. Times are each placement's headline (end to end where measured)."""
    host, keep, recompute = (_measured(placements, name) for name in ("offload-host", "keep", "recompute"))
    claims = []
    threshold = f">= {ROK_REDUCTION:.0%} less, <= +{ROK_OVERHEAD:.0%} time"
    if host is None or keep is None:
        claims.append(_claim(ROK_HOST_VS_KEEP, threshold, None, None, "needs keep and offload-host completed"))
    else:
        reduction = 1.0 - host["peak_activation_bytes"] / keep["peak_activation_bytes"]
        overhead = host["headline_ms"] / keep["headline_ms"] - 1.0
        claims.append(_claim(ROK_HOST_VS_KEEP, threshold, reduction,
                             reduction >= ROK_REDUCTION and overhead <= ROK_OVERHEAD,
                             f"peak activation memory {reduction:.1%} below keep's; iteration {overhead:+.1%} "
                             f"({host['headline_ms']:.1f} vs {keep['headline_ms']:.1f} ms, {host['headline']})"))
    if host is None or recompute is None:
        claims.append(_claim(ROK_HOST_VS_RECOMPUTE, "> 1x, memory <= recompute's", None, None,
                             "needs recompute and offload-host completed"))
    else:
        speedup = recompute["headline_ms"] / host["headline_ms"]
        memory = host["peak_activation_bytes"] / recompute["peak_activation_bytes"]
        claims.append(_claim(ROK_HOST_VS_RECOMPUTE, "> 1x, memory <= recompute's", speedup,
                             speedup > 1.0 and memory <= 1.0,
                             f"recompute {recompute['headline_ms']:.1f} ms / offload-host {host['headline_ms']:.1f} "
                             f"ms ({host['headline']}); offload-host's peak activation memory {memory:.2f}x "
                             "recompute's"))
    if budget is not None:
        claims.append(_budget_claim(budget))
    return claims


def _budget_claim(budget: dict[str, Any]) -> dict[str, Any]:
    """Each placement at the largest micro-batch its search found within the budget: the one(s) fitting the largest
    (other than keep) against keep at its own largest, by tokens/s; met when every such placement is faster."""
    threshold = "> 1x keep's tokens/s, each at its largest micro-batch"
    done = {s["placement"]: s for s in budget.get("searches", []) if s["status"] in _SEARCHED}
    keep = done.get("keep")
    others = [s for name, s in done.items() if name != "keep" and s["largest_micro_batch"] > 0]
    if keep is None or not others:
        return _claim(ROK_BUDGET, threshold, None, None, "needs keep's search and another placement's, finished")
    largest = max(s["largest_micro_batch"] for s in others)
    leaders = [s for s in others if s["largest_micro_batch"] == largest]
    gib = f"{budget['budget_gib']:g} GiB"
    if largest <= keep["largest_micro_batch"]:
        return _claim(ROK_BUDGET, threshold, None, False,
                      f"no placement fits a larger micro-batch than keep's {keep['largest_micro_batch']} in {gib}")
    if any(s["tokens_per_s"] is None for s in leaders) or (keep["largest_micro_batch"] and not keep["tokens_per_s"]):
        return _claim(ROK_BUDGET, threshold, None, None, "a search found its micro-batch without a throughput")
    keep_tps = keep["tokens_per_s"] or 0.0
    described = "; ".join(f"{s['placement']} {s['tokens_per_s']:,.0f} tokens/s" for s in leaders)
    detail = (f"in {gib}: {described} at micro-batch {largest}; keep {keep_tps:,.0f} tokens/s at micro-batch "
              f"{keep['largest_micro_batch']}")
    if not keep_tps:
        return _claim(ROK_BUDGET, threshold, None, True, detail)
    ratio = min(s["tokens_per_s"] for s in leaders) / keep_tps
    return _claim(ROK_BUDGET, threshold, ratio, ratio > 1.0, detail)


def targets_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's targets for a report's JSON: a comparison's claims, a sweep's targets over its budgets, or a
    ROK curve's claims (each entry names its target as ``claim`` or ``target``)."""
    if doc.get("kind") == "plan_sweep":
        return overall_targets(doc["budgets"])
    if doc.get("kind") == "rok_curve":
        return rok_claims(doc["placements"], doc.get("budget"))
    return check_claims(doc["results"], (doc.get("model") or {}).get("params"))


def main(argv: list[str] | None = None) -> int:
    """Print every target of each report given (results.json, sweep.json or rok.json); 0 when none was missed."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python scripts/targets.py REPORT.json [...]", file=sys.stderr)
        return 2
    missed = False
    for path in paths:
        print(path)
        for entry in targets_of(json.loads(Path(path).read_text(encoding="utf-8"))):
            value = "-" if entry["value"] is None else f"{entry['value']:.3g}"
            print(f"  {entry['status']:<13} {entry.get('claim') or entry.get('target')} ({entry['threshold']}): "
                  f"{value}; {entry['detail']}")
            missed |= entry["status"] == "missed"
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
