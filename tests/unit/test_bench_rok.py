"""The ROK curve's parts (pure code): the micro-batch search, the meter's GPU measure (CUDA's counters faked), the
measuring hooks that leave training bit for bit the same, a curve on a fake GPU (a launcher that reports the
allocator's figures and out-of-memory probes), a failed and an interrupted one, the project's claims on it
(``scripts/targets.py``, outside the package) and the disk's bandwidth."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.rok.disk import measure_disk
from lightning_dos.bench.rok.meter import ActivationMemoryMeter
from lightning_dos.bench.rok.search import Probe, search_micro_batch
from lightning_dos.bench.rok.study import run_rok
from lightning_dos.bench.runner import Runner
from lightning_dos.bench.settings import Run
from tests.support.bench import PNG_SIGNATURE, TINY
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
ROK_BUDGET, ROK_HOST_VS_KEEP, ROK_HOST_VS_RECOMPUTE = TARGETS.ROK_BUDGET, TARGETS.ROK_HOST_VS_KEEP, \
    TARGETS.ROK_HOST_VS_RECOMPUTE
rok_claims = TARGETS.rok_claims
GIB = 1024**3


def _fake_probe(fits_up_to: int, calls: list[int], unknown: int | None = None) -> Any:
    def probe(micro_batch: int) -> Probe:
        calls.append(micro_batch)
        if micro_batch == unknown:
            return Probe(micro_batch, None, status="timeout", reason="no result")
        return Probe(micro_batch, micro_batch <= fits_up_to, peak_bytes=100 * micro_batch,
                     tokens_per_s=10.0 * micro_batch)
    return probe


@pytest.mark.parametrize(("start", "fits_up_to", "cap", "probes", "status", "largest"), [
    (2, 11, 1024, [2, 4, 8, 16, 12, 10, 11], "found", 11),  # doubling, then bisection between 8 and 16
    (4, 4, 1024, [4, 8, 6, 5], "found", 4),
    (8, 3, 1024, [8, 4, 2, 3], "found", 3),  # the start is too big: bisection between 0 and it
    (4, 0, 1024, [4, 2, 1], "none fits", 0),
    (3, 10**6, 20, [3, 6, 12, 20], "capped", 20),  # the cap itself is tried once doubling would pass it
    (1, 1, 1, [1], "capped", 1),
])
def test_search_doubles_then_bisects(start: int, fits_up_to: int, cap: int, probes: list[int], status: str,
                                     largest: int) -> None:
    calls: list[int] = []
    result = search_micro_batch(start, _fake_probe(fits_up_to, calls), cap)
    assert calls == probes
    assert [p["micro_batch"] for p in result["probes"]] == probes
    assert result["status"] == status and result["largest_micro_batch"] == largest
    if largest:
        assert result["peak_bytes"] == 100 * largest and result["tokens_per_s"] == 10.0 * largest
    else:
        assert result["peak_bytes"] is None and result["tokens_per_s"] is None


def test_search_uses_a_known_answer_and_stops_when_a_probe_cannot_tell() -> None:
    calls: list[int] = []
    known = Probe(2, True, peak_bytes=200, tokens_per_s=20.0, source="placement run")
    result = search_micro_batch(2, _fake_probe(5, calls, unknown=8), 64, known=known)
    assert calls == [4, 8]  # micro-batch 2 is known: not probed again
    assert result["probes"][0]["source"] == "placement run"
    assert result["status"] == "incomplete" and result["largest_micro_batch"] == 4
    assert result["reason"] == "micro-batch 8: timeout: no result"
    with pytest.raises(ValueError, match="start 0 must be >= 1"):
        search_micro_batch(0, _fake_probe(5, []), 64)


def test_the_meter_resets_the_gpu_peak_each_forward_but_the_first_and_keeps_the_process_peak(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"allocated": 1000, "peak": 5000, "reserved": 6000}

    def reset(device: Any) -> None:
        state["peak"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: state["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: state["reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    meter = ActivationMemoryMeter()
    meter.on_fit_start(trainer, None)
    for activations in (300, 700, 500):
        meter.on_train_batch_start(trainer, None, None, 0)
        state["peak"] = max(state["peak"], state["allocated"] + activations)  # forward and backward
        meter.on_after_backward(trainer, None)
        meter.on_train_batch_end(trainer, None, None, None, 0)
    # the first batch (warm-up) is not measured: DOS places its residents there from the peak since the process began
    assert meter.device_bytes == [None, 700, 500]
    assert meter.accounting_bytes == [None] * 3 and meter.counters == [None] * 3  # no hooks
    # the peak before the first reset (model set-up) is not lost
    assert meter.peaks.process_peaks() == {"peak_gpu_gib": 5000 / 1024**3, "peak_gpu_reserved_gib": 6000 / 1024**3}


def _gpu_result(wanted: dict[str, Any], activation_bytes: int, ms: float) -> dict[str, Any]:
    """A raw worker result as a GPU run reports it: end times, phases, losses and the meter's device bytes."""
    spec = Run(**wanted["run"])
    nan = float("nan")
    iterations = {phase: [ms] * spec.steps for phase in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")}
    for i in spec.e2e_iterations:
        for phase in iterations:
            iterations[phase][i] = nan
    iterations.update(end_s=[ms / 1e3 * (k + 1) for k in range(spec.steps)],
                      loss=[3.0 - 0.1 * k for k in range(spec.steps)])
    return {**wanted["run"], "status": "ok", "reason": None, "iterations": iterations, "peak_gpu_gib": 10.0,
            "peak_host_gib": 2.0, "device": {"type": "cuda", "name": "Fake GPU", "total_memory_gib": 80.0},
            "activations": {"device_bytes": [activation_bytes] * spec.steps, "accounting_bytes": [None] * spec.steps,
                            "counters": [None] * spec.steps}}


def _runner(tmp_path: Path, launcher: Any, *argv: str) -> tuple[Runner, Any]:
    settings, rok, _, _ = parse_args(["rok", "--set", *TINY, "trainer.accelerator=gpu", "data.batch_size=4",
                                      "--steps", "4", "--warmup", "1", "--out", str(tmp_path), *argv])
    return Runner(settings, progress=False, launcher=launcher), rok


def test_a_search_on_a_gpu_counts_out_of_memory_as_too_big(tmp_path: Path) -> None:
    """Device bytes per micro-batch as a GPU's allocator would give them; keep runs out of memory above 4."""
    per_sample = {"keep": 3 * GIB, "recompute": GIB, "offload-host": GIB}
    ms = {"keep": 100.0, "recompute": 130.0, "offload-host": 103.0}
    launched: list[str] = []

    def launcher(wanted: dict[str, Any], run_dir: Path, timeout_s: float) -> dict[str, Any]:
        spec = wanted["run"]
        launched.append(spec["label"])
        settings = spec["extra"]["activations"]
        name, micro_batch = settings["placement"], settings["micro_batch"]
        assert settings["hooks"] == (name == "offload-host")  # on a GPU keep and recompute run bare
        assert spec["sets"]["model.activation_checkpointing"] == (name == "recompute")
        if name == "keep" and micro_batch > 4:
            return {**spec, "status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}
        return _gpu_result(wanted, per_sample[name] * micro_batch, ms[name])

    runner, rok = _runner(tmp_path, launcher, "--activation-budget-gib", "40", "--max-micro-batch", "64")
    with runner:
        doc = run_rok(runner, rok, disk_meter=lambda *a, **k: {})
    assert launched[:3] == ["keep", "recompute", "offload-host"]
    placements = {p["placement"]: p for p in doc["placements"]}
    assert placements["keep"]["measure"] == "device" and placements["keep"]["act"] is None
    assert placements["offload-host"]["reduction_vs_keep"] == pytest.approx(2 / 3)
    assert placements["offload-host"]["overhead_vs_keep"] == pytest.approx(0.03)
    searches = {s["placement"]: s for s in doc["budget"]["searches"]}
    assert [(p["micro_batch"], p["fits"], p["status"]) for p in searches["keep"]["probes"]] == [
        (4, True, "ok"), (8, False, "oom"), (6, False, "oom"), (5, False, "oom")]
    assert searches["keep"]["largest_micro_batch"] == 4
    assert searches["offload-host"]["largest_micro_batch"] == 40 and searches["recompute"]["largest_micro_batch"] == 40
    claims = {c["claim"]: c for c in rok_claims(doc["placements"], doc["budget"])}
    assert claims[ROK_HOST_VS_KEEP]["status"] == "met" and claims[ROK_HOST_VS_RECOMPUTE]["status"] == "met"
    leaders = [searches[name]["tokens_per_s"] for name in ("recompute", "offload-host")]
    assert claims[ROK_BUDGET]["value"] == pytest.approx(min(leaders) / searches["keep"]["tokens_per_s"])
    report = (tmp_path / "rok.md").read_text()
    assert "device: torch.cuda.max_memory_allocated" in report and "| keep | 4 |" in report
    assert (tmp_path / "rok.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_failed_or_interrupted_curve_reports_what_ran(tmp_path: Path) -> None:
    launched: list[str] = []

    def launcher(wanted: dict[str, Any], run_dir: Path, timeout_s: float) -> dict[str, Any]:
        spec = wanted["run"]
        launched.append(spec["label"])
        if spec["label"] == "offload-host":
            return {**spec, "status": "failed", "reason": "RuntimeError: injected"}
        if spec["label"] == "recompute":
            raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) while its worker runs
        return _gpu_result(wanted, GIB * spec["extra"]["activations"]["micro_batch"], 100.0)

    runner, rok = _runner(tmp_path / "failed", launcher, "--placements", "keep", "offload-host",
                          "--activation-budget-gib", "40")
    with runner:
        doc = run_rok(runner, rok)
    host = doc["placements"][1]
    assert host["status"] == "failed" and host["peak_activation_bytes"] is None and host["reduction_vs_keep"] is None
    search = doc["budget"]["searches"][1]  # not searched blindly: its own run could not tell
    assert (search["status"], search["largest_micro_batch"]) == ("incomplete", 0)
    assert all(c["status"] == "not measured" for c in rok_claims(doc["placements"], doc["budget"]))
    launched.clear()
    runner, rok = _runner(tmp_path / "interrupted", launcher, "--activation-budget-gib", "40")
    with runner:
        doc = run_rok(runner, rok)
    assert launched == ["keep", "recompute"]  # nothing after the interruption, no search
    assert doc["interrupted"] is True and doc["budget"]["searches"] == []
    assert [p["status"] for p in doc["placements"]] == ["ok", "skipped", "skipped"]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["keep", "recompute"])
def test_measuring_hooks_do_not_change_training(checkpointing: bool) -> None:
    """keep and recompute run with the offload's hooks in placement ``keep`` where those are the memory measure (off a
    GPU): the loss and every gradient are bit for bit those of the same step without hooks."""
    import torch.nn.functional as F

    from lightning_dos.activations import ActivationOffload
    from lightning_dos.models.gpt import GPT, GPTConfig

    def step(hooks: bool) -> tuple[float, list[torch.Tensor], dict[str, float]]:
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_name("debug", n_layer=3, n_embd=64, vocab_size=128, block_size=16,
                                        activation_checkpointing=checkpointing))
        x, y = torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))
        offload = ActivationOffload("keep", layers=model, min_tensor_bytes=0)
        with offload if hooks else torch.enable_grad():
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        metrics = offload.metrics()
        offload.close()
        return float(loss.detach()), [p.grad.clone() for p in model.parameters()], metrics

    bare_loss, bare_grads, _ = step(hooks=False)
    loss, grads, metrics = step(hooks=True)
    assert loss == bare_loss and all(torch.equal(a, b) for a, b in zip(grads, bare_grads))
    assert metrics["act/offloaded_bytes"] == 0 and metrics["act/device_peak_bytes"] > 0


def _summary(name: str, ms: float | None, peak: int | None) -> dict[str, Any]:
    return {"placement": name, "status": "ok" if ms is not None else "failed", "headline_ms": ms,
            "headline": "end to end", "peak_activation_bytes": peak}


def test_rok_claims_met_missed_and_not_measured() -> None:
    met = rok_claims([_summary("keep", 100.0, 1000), _summary("recompute", 130.0, 500),
                      _summary("offload-host", 104.0, 500)])
    assert [c["status"] for c in met] == ["met", "met"]
    assert met[0]["value"] == pytest.approx(0.5) and met[1]["value"] == pytest.approx(130 / 104)
    slow = rok_claims([_summary("keep", 100.0, 1000), _summary("recompute", 130.0, 400),
                       _summary("offload-host", 106.0, 500)])
    assert [c["status"] for c in slow] == ["missed", "missed"]  # 6% over keep; more memory than recompute
    small = rok_claims([_summary("keep", 100.0, 1000), _summary("offload-host", 101.0, 700)])
    assert [c["status"] for c in small] == ["missed", "not measured"]  # 30% less only; no recompute
    assert [c["status"] for c in rok_claims([_summary("keep", 100.0, 1000), _summary("offload-host", None, None)])] \
        == ["not measured", "not measured"]


def _search(name: str, largest: int, tokens_per_s: float | None, status: str = "found") -> dict[str, Any]:
    return {"placement": name, "status": status, "largest_micro_batch": largest, "tokens_per_s": tokens_per_s}


def _budget_status(*searches: dict[str, Any]) -> tuple[str, float | None]:
    (claim,) = [c for c in rok_claims([], {"budget_gib": 8.0, "searches": list(searches)}) if c["claim"] == ROK_BUDGET]
    return claim["status"], claim["value"]


def test_the_budget_claim() -> None:
    """The placement(s) fitting the largest micro-batch against keep at its own largest, by tokens/s."""
    assert [c["claim"] for c in rok_claims([])] == [ROK_HOST_VS_KEEP, ROK_HOST_VS_RECOMPUTE]  # no budget: no claim
    keep = _search("keep", 2, 12_000.0)
    assert _budget_status(keep, _search("recompute", 6, 31_000.0), _search("offload-host", 6, 18_000.0)) \
        == ("met", pytest.approx(1.5))  # both tie at 6: the slower of the two decides
    assert _budget_status(keep, _search("recompute", 6, 31_000.0), _search("offload-host", 6, 11_000.0))[0] == "missed"
    # only the largest counts: a placement fitting less is not the one the claim is about
    assert _budget_status(keep, _search("recompute", 5, 9_000.0), _search("offload-host", 6, 13_000.0))[0] == "met"
    assert _budget_status(keep, _search("offload-host", 2, 20_000.0)) == ("missed", None)  # no larger micro-batch
    assert _budget_status(_search("keep", 0, None, "none fits"), _search("offload-host", 1, 900.0)) == ("met", None)
    assert _budget_status(keep, _search("offload-host", 6, 9_000.0, "incomplete"))[0] == "not measured"
    assert _budget_status(_search("offload-host", 6, 9_000.0))[0] == "not measured"  # keep was not searched


def test_disk_bandwidth_is_measured_and_the_file_removed(tmp_path: Path) -> None:
    disk = measure_disk(tmp_path, 8, progress=False)
    assert disk["error"] is None and disk["bytes"] == 8 << 20
    assert disk["write_mb_s"] > 0 and disk["read_mb_s"] > 0 and disk["read_cache"]
    assert not list(tmp_path.iterdir())
    missing = measure_disk(tmp_path / "gone", 8, progress=False)
    assert missing["error"] and missing["write_mb_s"] is None


def test_rok_settings_report_every_problem(tmp_path: Path) -> None:
    from lightning_dos.bench.rok.study import RokSettings

    problems = RokSettings(placements=["keep", "offload-nvme", "keep"], keep_last_layers=-1,
                           budget_gib=float("nan")).problems()
    text = "; ".join(problems)
    for part in ("--placements: give each of", "--nvme-path: offload-nvme writes",
                 "--activation-keep-last-layers -1 must be an integer >= 0", "--activation-budget-gib nan"):
        assert part in text, part
    assert not RokSettings(placements=["offload-nvme"], nvme_path=str(tmp_path), disk_probe_mib=0).problems()
