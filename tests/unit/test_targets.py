"""The project's own targets (``scripts/targets.py``, outside the package), checked against the committed reports:
the JSON of those written before the targets left the bench carries the claims it printed, and the script must still
give the same. The figures the docs show are rendered from the reports (tests/unit/test_results_rendered.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import pytest

from tests.support.script_loader import load_script

TARGETS = load_script("targets")
check_claims = TARGETS.check_claims
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUN_L_TABLE = BENCHMARKS / "gpt-2.7b_H200_2026-11-21_runL-table" / "results.json"
RUN_L_BACKWARD = BENCHMARKS / "gpt-2.7b_H200_2026-11-21_runL-backward" / "results.json"
RUN_P = BENCHMARKS / "gpt-2.7b_H200_2026-11-25_runP" / "results.json"


def _result(label: str, strategy: str, plan: str, iteration: float, step: float, gpu: float, loss: float) -> dict:
    return {"label": label, "strategy": strategy, "plan": plan, "status": "ok", "iteration_ms": iteration,
            "step_ms": step, "peak_gpu_gib": gpu, "final_loss": loss}


def _by_claim(claims: list[dict]) -> dict[str, dict]:
    return {c["claim"]: c for c in claims}


def _results(path: Path) -> dict[str, dict]:
    return {r["label"]: r for r in json.loads(path.read_text())["results"]}


COMPARISONS = sorted(p for p in BENCHMARKS.glob("*/results.json")
                     if "claims" in (doc := json.loads(p.read_text())) and "results" in doc)


@pytest.mark.parametrize("path", COMPARISONS, ids=lambda p: p.parent.name)
def test_the_script_gives_each_committed_report_the_verdicts_it_carries(path: Path) -> None:
    """The reports written while the bench still judged them carry their claims; the script, which judges today,
    gives every one of them the same status and value (claims added since are not in them)."""
    doc = json.loads(path.read_text())
    today = _by_claim(check_claims(doc["results"]))
    for claim in doc["claims"]:
        assert today[claim["claim"]]["status"] == claim["status"], claim["claim"]
        assert today[claim["claim"]]["value"] == pytest.approx(claim["value"]), claim["claim"]


def test_data_parallel_targets_depend_on_the_device_count_and_weigh_the_multi_gpu_peers() -> None:
    """At four devices: 85% of the one-device ratio kept, 3.4x the tokens/s, faster than ZeRO-3 without offload
    and 2x FSDP with CPU offload; at two: 90% kept and no tokens/s target; a peer that did not complete is named."""
    def at(devices: int, label: str, strategy: str, e2e: float, tokens: float = 0.0, status: str = "ok") -> dict:
        suffix = f"@dp{devices}" if devices > 1 else ""
        return {**_row(label + suffix, strategy, e2e, 10.0, status=status), "devices": devices,
                "e2e_tokens_per_s": tokens}
    one = [at(1, "zero3_offload", "zero3_offload", 1000.0), at(1, "dos(auto)", "deep_optimizer_states", 100.0, 1e4)]
    four = [at(4, "zero3_offload", "zero3_offload", 860.0), at(4, "dos(auto)", "deep_optimizer_states", 100.0, 3.5e4),
            at(4, "no_offload", "no_offload", 101.0), at(4, "fsdp_offload", "fsdp_offload", 199.0)]
    claims = _by_claim(check_claims(one + four))
    kept = claims["DOS/zero3_offload ratio at DP=4 vs DP=1"]
    assert (kept["value"], kept["status"]) == (pytest.approx(0.86), "met")
    assert kept["threshold"] == ">= 0.85 x the DP=1 ratio"
    tokens = claims["dos(auto) tokens/s at DP=4 vs DP=1"]
    assert (tokens["value"], tokens["status"]) == (pytest.approx(3.5), "met")
    assert claims["dos(auto) vs no_offload at DP=4"]["status"] == "met"
    fsdp = claims["dos(auto) vs fsdp_offload at DP=4"]
    assert (fsdp["value"], fsdp["status"]) == (pytest.approx(1.99), "missed")
    # 86% kept misses at two devices (90%), which have no tokens/s target; a peer that failed is named
    two = [{**r, "devices": 2, "label": r["label"].replace("@dp4", "@dp2")} for r in four]
    two[2] = {**two[2], "status": "oom"}
    claims = _by_claim(check_claims(one + two))
    assert claims["DOS/zero3_offload ratio at DP=2 vs DP=1"]["status"] == "missed"
    assert "dos(auto) tokens/s at DP=2 vs DP=1" not in claims
    peer = claims["dos(auto) vs no_offload at DP=2"]
    assert peer["status"] == "not measured" and peer["detail"].endswith("; no_offload@dp2: oom")
    # as fast as the peer is not faster
    even = _by_claim(check_claims(one + [*four[:2], {**four[2], "e2e_iteration_ms": 100.0}]))
    assert even["dos(auto) vs no_offload at DP=4"]["status"] == "missed"


def test_a_large_model_on_several_devices_has_its_own_peer_targets() -> None:
    """A model of >= 10B parameters at N > 1 devices: DOS 2.5x vanilla and 1.5x FSDP with CPU offload at N; the
    multi-GPU peers are weighed at the only device count a report ran; a smaller model has no large-model claims."""
    def at(label: str, strategy: str, e2e: float) -> dict:
        return {**_row(label + "@dp4", strategy, e2e, 10.0), "devices": 4}
    four = [at("zero3_offload", "zero3_offload", 240.0), at("dos(auto)", "deep_optimizer_states", 100.0),
            at("no_offload", "no_offload", 120.0), at("fsdp_offload", "fsdp_offload", 150.0)]
    large = "dos(auto) vs {} at DP=4, a model of >= 10B parameters"
    claims = _by_claim(check_claims(four, 13.1e9))
    vanilla, fsdp = claims[large.format("zero3_offload")], claims[large.format("fsdp_offload")]
    assert (vanilla["value"], vanilla["status"], vanilla["threshold"]) == (pytest.approx(2.4), "missed", ">= 2.5x")
    assert (fsdp["value"], fsdp["status"], fsdp["threshold"]) == (pytest.approx(1.5), "met", ">= 1.5x")
    assert claims["dos(auto) vs no_offload at DP=4"]["status"] == "met"
    assert claims["dos(auto) vs fsdp_offload at DP=4"]["status"] == "missed"  # 1.5x of the 2x every model has
    assert not [name for name in _by_claim(check_claims(four, 2.7e9)) if name.endswith("10B parameters")]
    assert not [name for name in _by_claim(check_claims(four)) if name.endswith("10B parameters")]


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


def test_missing_configurations_are_not_measured_and_the_script_prints_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed = _result("zero3_offload", "zero3_offload", "1.0", 2300, 1700, 12.0, 11.0) | {"status": "oom"}
    dos = _result("dos(auto)", "deep_optimizer_states", "auto", 900, 400, 17.0, 11.0)
    claims = check_claims([failed, dos])
    assert {c["status"] for c in claims} == {"not measured"}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"results": [failed, dos]}))
    assert TARGETS.main([str(path)]) == 0  # nothing missed
    printed = capsys.readouterr().out
    assert "not measured  iteration vs zero3_offload (-): -; needs zero3_offload and a DOS configuration" in printed
    assert TARGETS.main([str(RUN_P)]) == 1  # run P missed some of its claims
    assert "missed        end-to-end iteration vs zero3_offload (>= 3.5x): 2.5;" in capsys.readouterr().out


def _iterations(name: str) -> dict:
    path = BENCHMARKS / f"gpt-2.7b_H200_2026-11-21_runL-{name}" / "iterations.json"
    return json.loads(path.read_text())["workers"]


def test_run_l_backward_figures_follow_from_the_committed_iterations() -> None:
    """Run L's reports: their medians are those of the committed iterations (6-30 of every worker), pooled over the
    three interleaved processes of each configuration for the backward; the backward is one busy thread in every
    configuration."""
    warmup = 5
    table = _results(RUN_L_TABLE)
    workers = _iterations("table")
    label_of = {"no_offload_r0": "no_offload", "dos_auto_r0": "dos(auto)", "dos_host_r0": "dos(host)",
                "dos_device_r0": "dos(device)", "dos_0.25_r0": "dos(0.25)", "dos_0.5_r0": "dos(0.5)",
                "dos_0.75_r0": "dos(0.75)"}
    assert set(workers) == set(label_of)
    for worker, label in label_of.items():
        assert median(workers[worker]["bwd_ms"][warmup:]) == pytest.approx(table[label]["bwd_ms"])

    for worker, it in workers.items():
        bwd = it["bwd_ms"][warmup:]
        # the backward is one busy thread (autograd's): the other threads' CPU time is its wall time within 6%
        assert median(it["bwd_other_cpu_ms"][warmup:]) >= 0.94 * median(bwd), worker
        assert max(it["bwd_preempted"][warmup:]) <= 2, worker
        assert median(it["fwd_other_cpu_ms"][warmup:]) < 5, worker  # CPU Adam's pool idles outside the update

    interleaved = _results(RUN_L_BACKWARD)
    pooled = _iterations("backward")
    for label, prefix in (("no_offload", "no_offload_r"), ("dos(auto)", "dos_auto_r")):
        values = [v for w, it in pooled.items() if w.startswith(prefix) for v in it["bwd_ms"][warmup:]]
        assert len(values) == 75 and median(values) == pytest.approx(interleaved[label]["bwd_ms"])


def test_the_step_claim_skips_overlapped_rows() -> None:
    vanilla = _row("zero3_offload", "zero3_offload", 3000.0, 11.0)
    overlapped = _row("dos(auto,overlap)", "deep_optimizer_states", 900.0, 17.0, fwd=500.0, bwd=250.0)
    claims = _by_claim(check_claims([vanilla, overlapped]))
    assert claims["update phase (step) vs zero3_offload"]["status"] == "not measured"
    serial = _row("dos(auto)", "deep_optimizer_states", 1000.0, 12.0)
    claims = _by_claim(check_claims([vanilla, overlapped, serial]))
    assert claims["update phase (step) vs zero3_offload"]["detail"] == "dos(auto) 700.0 ms vs 2700.0 ms"
