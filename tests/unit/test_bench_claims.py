"""The bench's claim checks, on hand-made rows (the committed reports and what the docs quote from them:
tests/unit/test_committed_reports.py).
"""

from __future__ import annotations

import pytest

from lightning_dos.bench import report
from lightning_dos.bench.claims import (
    check_claims,
)


def _result(label: str, strategy: str, plan: str, iteration: float, step: float, gpu: float, loss: float) -> dict:
    return {"label": label, "strategy": strategy, "plan": plan, "status": "ok", "iteration_ms": iteration,
            "step_ms": step, "peak_gpu_gib": gpu, "final_loss": loss}


def _by_claim(claims: list[dict]) -> dict[str, dict]:
    return {c["claim"]: c for c in claims}


def _row(label: str, strategy: str, e2e: float, gpu: float, fwd: float = 100.0, bwd: float = 200.0,
         status: str = "ok") -> dict[str, object]:
    return {"label": label, "strategy": strategy, "status": status, "iteration_ms": e2e, "e2e_iteration_ms": e2e,
            "peak_gpu_gib": gpu, "fwd_ms": fwd, "bwd_ms": bwd, "step_ms": e2e - fwd - bwd, "plan": "auto"}


def test_peer_claims_weigh_dos_against_each_peer() -> None:
    """torchao_offload: only DOS rows within 60% of its GPU memory count; every other offloading row: the fastest;
    plain: forward + backward; a peer that did not complete is named in the claim that lacks it."""
    torchao = _row("torchao_offload", "torchao_offload", 1000.0, 20.0)
    heavy = _row("dos(device)", "deep_optimizer_states", 700.0, 15.0, fwd=110.0, bwd=220.0)  # fast, but 75% of 20
    light = _row("dos(auto)", "deep_optimizer_states", 790.0, 11.0, fwd=110.0, bwd=230.0)
    plain = _row("plain", "plain", 320.0, 40.0, fwd=100.0, bwd=200.0)
    zen = _row("zenflow", "zenflow", 0.0, 0.0, status="oom")
    claims = _by_claim(check_claims([torchao, heavy, light, plain, zen]))
    vs_torchao = claims["end-to-end iteration vs torchao_offload at <= 60% its peak GPU memory"]
    assert vs_torchao["value"] == pytest.approx(0.79) and vs_torchao["status"] == "met"
    assert vs_torchao["detail"].startswith("dos(auto) 790.0 ms, 11.0 GiB")
    others = claims["end-to-end iteration vs every other offloading row"]
    assert others["value"] == pytest.approx(1000 / 700) and others["status"] == "met"
    assert others["detail"].endswith("; zenflow: oom")
    fwd_bwd = claims["forward + backward vs plain"]  # the fastest DOS row end to end: dos(device)
    assert fwd_bwd["value"] == pytest.approx(330 / 300) and fwd_bwd["status"] == "met"
    slower = _by_claim(check_claims([torchao, dict(light, e2e_iteration_ms=900.0), plain]))
    assert slower["end-to-end iteration vs torchao_offload at <= 60% its peak GPU memory"]["status"] == "missed"
    only_heavy = _by_claim(check_claims([torchao, heavy]))
    claim = only_heavy["end-to-end iteration vs torchao_offload at <= 60% its peak GPU memory"]
    assert claim["status"] == "missed" and "within 12.0 GiB" in claim["detail"]
    alone = _by_claim(check_claims([light]))
    assert {alone[name]["status"] for name in ("end-to-end iteration vs every other offloading row",
                                               "forward + backward vs plain")} == {"not measured"}
    # an overlapped row, fastest end to end: its synchronised forward holds the wait for the update in flight, so
    # the forward + backward claim weighs the fastest row without overlap
    overlapped = _row("dos(auto,overlap)", "deep_optimizer_states", 650.0, 11.5, fwd=450.0, bwd=220.0)
    mixed = _by_claim(check_claims([torchao, light, overlapped, plain]))
    assert mixed["forward + backward vs plain"]["value"] == pytest.approx(340 / 300)
    assert mixed["forward + backward vs plain"]["detail"].startswith("dos(auto) 110.0 + 230.0 ms")
    assert mixed["end-to-end iteration vs every other offloading row"]["detail"].startswith("dos(auto,overlap)")
    only_overlapped = _by_claim(check_claims([torchao, overlapped, plain]))
    assert only_overlapped["forward + backward vs plain"]["status"] == "not measured"


def test_static_split_claim_needs_less_gpu_memory() -> None:
    vanilla = _result("zero3_offload", "zero3_offload", "1.0", 2300, 1700, 12.0, 11.0)
    split = _result("static_split(0.5)", "static_split", "0.5", 1400, 800, 33.0, 11.0)
    fast_heavy = _result("dos(device)", "deep_optimizer_states", "device", 800, 300, 40.0, 11.05)
    light = _result("dos(0.5)", "deep_optimizer_states", "0.5", 900, 400, 17.0, 11.02)
    claims = _by_claim(check_claims([vanilla, split, fast_heavy, light]))
    c = claims["iteration vs static_split 0.5 at lower peak GPU memory"]
    assert c["value"] == pytest.approx(1400 / 900) and c["status"] == "met"  # the 40 GiB run does not count
    assert claims["iteration vs zero3_offload"]["value"] == pytest.approx(2300 / 800)
    only_heavy = _by_claim(check_claims([vanilla, split, fast_heavy]))
    assert only_heavy["iteration vs static_split 0.5 at lower peak GPU memory"]["status"] == "missed"


def test_missing_configurations_are_not_measured_and_render() -> None:
    failed = _result("zero3_offload", "zero3_offload", "1.0", 2300, 1700, 12.0, 11.0) | {"status": "oom"}
    dos = _result("dos(auto)", "deep_optimizer_states", "auto", 900, 400, 17.0, 11.0)
    claims = check_claims([failed, dos])
    assert {c["status"] for c in claims} == {"not measured"}
    text = "\n".join(report._claim_lines(claims))
    assert "## Claims checked in this run" in text and "not measured" in text


def test_the_step_claim_skips_overlapped_rows() -> None:
    vanilla = _row("zero3_offload", "zero3_offload", 3000.0, 11.0)
    overlapped = _row("dos(auto,overlap)", "deep_optimizer_states", 900.0, 17.0, fwd=500.0, bwd=250.0)
    claims = _by_claim(check_claims([vanilla, overlapped]))
    assert claims["update phase (step) vs zero3_offload"]["status"] == "not measured"
    serial = _row("dos(auto)", "deep_optimizer_states", 1000.0, 12.0)
    claims = _by_claim(check_claims([vanilla, overlapped, serial]))
    assert claims["update phase (step) vs zero3_offload"]["detail"] == "dos(auto) 700.0 ms vs 2700.0 ms"
