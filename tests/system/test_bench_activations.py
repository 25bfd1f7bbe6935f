"""The ROK curve, ``lightning-dos bench --activations``: one end-to-end CPU run with real worker processes, plus its
parts.

The end-to-end test runs the four placements of a tiny model under DOS (one fixed plan, so every run updates the
same way) and checks rok.json, the losses (bit-identical whatever the placement), the offload's accounting (offload
keeps less resident than keep), the report and the chart; then, with ``--resume`` (the placements' runs reused), a
budget between keep's and offload-host's peaks, derived from what they measured, under which offload-host fits a
larger micro-batch than keep. The other tests cover the parts alone: argument errors, the doubling/bisection search
with a fake probe, the GPU measure of the meter with CUDA's statistics faked, a harness run with a fake launcher that
reports GPU figures and out-of-memory probes, the project's claims (``scripts/targets.py``, outside the package)
and the disk measurement.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.image
import pytest
import torch

from lightning_dos.bench import main
from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import RunSpec
from lightning_dos.bench.rok.config import RokConfig
from lightning_dos.bench.rok.disk import measure_disk
from lightning_dos.bench.rok.harness import run_rok
from lightning_dos.bench.rok.meter import ActivationMemoryMeter
from lightning_dos.bench.rok.search import Probe, search_micro_batch
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
ROK_BUDGET, ROK_HOST_VS_KEEP, ROK_HOST_VS_RECOMPUTE = TARGETS.ROK_BUDGET, TARGETS.ROK_HOST_VS_KEEP, \
    TARGETS.ROK_HOST_VS_RECOMPUTE
rok_claims = TARGETS.rok_claims
# tests/system/test_bench.py's TINY, with 4 blocks: with the last one kept, offload moves three of them
TINY = ["--model", "debug", "--n-layer", "4", "--n-embd", "64", "--vocab-size", "512", "--seq-len", "32",
        "--micro-batch", "2", "--steps", "4", "--warmup", "1", "--precision", "32-true", "--sub-group-size", "40000",
        "--lr", "0.01"]
# the tiny model's saved tensors are a few KiB: move them all
ROK = [*TINY, "--plans", "host", "--activation-min-tensor-bytes", "0"]
PLACEMENTS = ["keep", "recompute", "offload-host", "offload-nvme"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GIB = 1024**3
PLACEMENT_KEYS = {"placement", "checkpointing", "offload", "hooks", "status", "reason", "micro_batch", "headline_ms",
                  "headline", "tokens_per_s", "e2e_iteration_ms", "fwd_ms", "bwd_ms", "step_ms", "iteration_ms",
                  "peak_activation_bytes", "peak_activation_gib", "measure", "peak_activation_bytes_per_iteration",
                  "act", "losses", "final_loss", "overhead_vs_keep", "reduction_vs_keep", "loss_vs_keep",
                  "peak_gpu_gib", "peak_host_gib"}


# --- end to end ---------------------------------------------------------------------------------------------------


def test_rok_curve_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, nvme = tmp_path / "rok", tmp_path / "nvme"
    nvme.mkdir()
    code = main([*ROK, "--activations", *PLACEMENTS, "--nvme-path", str(nvme), "--disk-probe-mib", "8",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "4/4 placements completed" in printed and "[3/4] offload-host: ok" in printed

    doc = json.loads((out / "rok.json").read_text())
    assert {"hardware", "versions", "config", "rok", "model", "measurement", "disk", "placements", "budget",
            "interrupted"} <= set(doc)
    assert "claims" not in doc  # the report states what was measured; the project's claims are not in it
    assert doc["kind"] == "rok_curve" and doc["interrupted"] is False and doc["budget"] is None
    assert doc["rok"]["placements"] == PLACEMENTS and doc["rok"]["strategy"] == "deep_optimizer_states"
    assert doc["rok"]["plan"] == "host" and doc["rok"]["nvme_path"] == str(nvme)
    assert doc["config"]["micro_batch"] == 2 and doc["hardware"]["bench_device"]["type"] == "cpu"
    assert set(doc["measurement"]["memory_measures"]) == {"accounting"}  # no GPU: the hooks' accounting
    placements = {p["placement"]: p for p in doc["placements"]}
    assert list(placements) == PLACEMENTS
    for name, p in placements.items():
        assert PLACEMENT_KEYS <= set(p), name
        assert p["status"] == "ok" and p["measure"] == "accounting" and p["hooks"] is True, name
        assert p["headline"] == "end to end" and p["headline_ms"] > 0 and p["tokens_per_s"] > 0, name
        assert p["checkpointing"] == (name == "recompute"), name
        assert len(p["losses"]) == 4 and all(math.isfinite(v) for v in p["losses"]), name
    # fp32 on a CPU, one fixed plan: keeping, recomputing and offloading train bit for bit the same
    assert all(p["losses"] == placements["keep"]["losses"] for p in placements.values())
    assert all(p["loss_vs_keep"]["identical"] for p in placements.values())
    keep, host, nvme_run = placements["keep"], placements["offload-host"], placements["offload-nvme"]
    # keep's hooks only measure: nothing moved; offload moves, restores everything it moved, and keeps less resident
    assert keep["act"]["offloaded_bytes"] == 0 and keep["act"]["kept_bytes"] > 0
    assert host["act"]["offloaded_bytes"] > 0 and host["act"]["restored_bytes"] == host["act"]["offloaded_bytes"]
    assert host["peak_activation_bytes"] < keep["peak_activation_bytes"]
    assert host["reduction_vs_keep"] == pytest.approx(1 - host["peak_activation_bytes"] / keep["peak_activation_bytes"])
    assert nvme_run["act"]["nvme_written_bytes"] == nvme_run["act"]["offloaded_bytes"] > 0
    assert nvme_run["act"]["nvme_read_bytes"] == nvme_run["act"]["nvme_written_bytes"]
    assert placements["recompute"]["peak_activation_bytes"] < keep["peak_activation_bytes"]
    assert doc["disk"]["error"] is None and doc["disk"]["write_mb_s"] > 0 and doc["disk"]["read_mb_s"] > 0
    assert not list(nvme.iterdir())  # the activation files and the bandwidth file are gone
    claims = rok_claims(doc["placements"], doc["budget"])
    assert [c["claim"] for c in claims] == [ROK_HOST_VS_KEEP, ROK_HOST_VS_RECOMPUTE]
    assert all(c["status"] in ("met", "missed") for c in claims)

    report = (out / "rok.md").read_text()
    for text in ("## ROK curve", "| placement | status | iteration ms | overhead vs keep | peak activation memory | "
                 "reduction vs keep | tokens/s |", "| offload-host | ok |", "## Activation offload counters",
                 "## NVMe directory bandwidth", "Peak activation memory (accounting)",
                 "![iteration time against peak activation memory](rok.png)"):
        assert text in report, text
    assert "What the memory buys" not in report and "claim" not in report.lower()
    one_panel = matplotlib.image.imread(out / "rok.png")
    assert (out / "rok.png").read_bytes()[:8] == PNG_SIGNATURE and one_panel.shape[0] >= 400

    # what the memory buys: a budget between offload-host's peak and keep's, from what they measured
    budget = (keep["peak_activation_bytes"] + host["peak_activation_bytes"]) / 2 / GIB
    code = main([*ROK, "--activations", "keep", "offload-host", "--out", str(out), "--resume",
                 "--activation-budget-gib", f"{budget:.9f}"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[1/2] keep (reused): ok" in printed and "[2/2] offload-host (reused): ok" in printed
    doc = json.loads((out / "rok.json").read_text())
    assert all(p["reused"] for p in doc["placements"])
    section = doc["budget"]
    assert section["budget_gib"] == pytest.approx(budget) and section["start_micro_batch"] == 2
    searches = {s["placement"]: s for s in section["searches"]}
    assert searches["keep"]["status"] == searches["offload-host"]["status"] == "found"
    # keep's own run (micro-batch 2) is over the budget, offload-host's under it
    assert searches["keep"]["probes"][0] == {**searches["keep"]["probes"][0], "micro_batch": 2, "fits": False,
                                             "source": "placement run"}
    assert searches["offload-host"]["probes"][0]["fits"] is True
    assert searches["offload-host"]["largest_micro_batch"] > searches["keep"]["largest_micro_batch"] >= 1
    for search in searches.values():
        best = search["largest_micro_batch"]
        assert search["peak_bytes"] <= budget * GIB and search["tokens_per_s"] > 0
        fits = {p["micro_batch"]: p["fits"] for p in search["probes"]}
        assert fits[best] is True and fits.get(best + 1) is False  # bisection ends next to the first too big
        assert all(p["status"] == "ok" and p["peak_bytes"] for p in search["probes"])
    report = (out / "rok.md").read_text()
    assert "## What the memory buys: the largest micro-batch within" in report
    assert "| placement | largest micro-batch | its peak activation memory | its tokens/s | search |" in report
    two_panels = matplotlib.image.imread(out / "rok.png")
    assert two_panels.shape[1] > one_panel.shape[1]  # the search's panel beside the curve


# --- arguments ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["--activations", "keep", "sideways"], "--activations: unknown placement(s) 'sideways'"),
    (["--activations", "keep", "keep"], "--activations: keep given more than once"),
    (["--activations", "keep", "--sweep"], "--activations: cannot be combined with --sweep"),
    (["--activations", "keep", "--devices", "2"], "--devices: [2]; --activations runs on one device"),
    (["--activations", "offload-nvme"], "--nvme-path: offload-nvme writes the activations to files; set --nvme-path"),
    (["--activations", "offload-nvme", "--nvme-path", "/no/such/dir"], "--nvme-path: '/no/such/dir' does not exist"),
    (["--activations", "keep", "--nvme-path", "."], "--nvme-path: only used by the offload-nvme placement"),
    (["--nvme-path", "."], "--nvme-path: only with --activations"),
    (["--activation-budget-gib", "4"], "--activation-budget-gib: only with --activations"),
    (["--activations", "keep", "--activation-budget-gib", "0"], "--activation-budget-gib: 0.0 must be"),
    (["--activations", "keep", "--strategies", "zero3_offload", "deep_optimizer_states"],
     "--activations runs under one strategy"),
    (["--activations", "keep", "--strategies", "static_split"], "--activations runs under one strategy"),
    (["--activations", "keep", "--plans", "host", "device"], "--activations runs every placement under one DOS plan"),
    (["--activations", "keep", "--strategies", "zero3_offload", "--plans", "host"], "only deep_optimizer_states"),
    (["--activations", "keep", "--no-activation-checkpointing"], "(each placement sets it): not used by --activations"),
    (["--activations", "keep", "--repeats", "2"], "--repeats: not used by --activations"),
    (["--activations", "keep", "--activation-budget-gib", "1", "--max-micro-batch", "1"],
     "--max-micro-batch: 1 is below --micro-batch 2"),
])
def test_bad_rok_arguments_are_usage_errors(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err, err


def test_rok_defaults_and_the_runs_each_placement_makes(tmp_path: Path) -> None:
    rok = parse_args([*TINY, "--activations", "offload-nvme", "keep", "--nvme-path", str(tmp_path)]).rok
    assert rok is not None and rok.placements == ["offload-nvme", "keep"]
    assert (rok.strategy, rok.plan, rok.budget_gib, rok.keep_last_layers) == ("deep_optimizer_states", "auto", None, 1)
    assert rok.min_tensor_bytes == 1 << 20 and rok.max_micro_batch == 1024 and rok.nvme_path == str(tmp_path)
    assert parse_args([*TINY, "--activations", "keep", "--strategies", "zero3_offload"]).rok.plan == 1.0
    keep, probe = rok.run_config("keep"), rok.run_config("recompute", micro_batch=8)
    assert not keep.activation_checkpointing and (keep.micro_batch, keep.steps) == (2, 4)
    assert probe.activation_checkpointing and (probe.micro_batch, probe.steps, probe.e2e_steps) == (8, 3, 1)
    assert rok.spec("recompute", micro_batch=8).label == "recompute@mb8"
    # keep and recompute run with measuring hooks only where the hooks are the memory measure (off a GPU)
    assert rok.worker_settings("keep", on_gpu=False)["hooks"] and not rok.worker_settings("keep", on_gpu=True)["hooks"]
    nvme = rok.worker_settings("offload-nvme", on_gpu=True)
    assert nvme["hooks"] and nvme["offload"] == "nvme" and nvme["nvme_path"] == str(tmp_path)
    assert rok.worker_settings("keep", on_gpu=False)["nvme_path"] is None


def test_rok_dry_run_lists_the_placements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--activations", *PLACEMENTS, "--nvme-path", str(tmp_path), "--activation-budget-gib", "2",
                 "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "4 worker runs, one per placement" in printed and "every placement under deep_optimizer_states" in printed
    assert "recompute      checkpointing on " in printed and f"hooks nvme under {tmp_path}" in printed
    assert "largest micro-batch whose peak activation memory fits 2 GiB" in printed
    assert not list(tmp_path.iterdir())


# --- the search ---------------------------------------------------------------------------------------------------


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


# --- the meter's GPU measure --------------------------------------------------------------------------------------


def test_the_meter_resets_the_gpu_peak_each_forward_and_keeps_the_process_peak(
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
    for activations in (300, 700):
        meter.on_train_batch_start(trainer, None, None, 0)
        state["peak"] = state["allocated"] + activations  # forward and backward
        meter.on_after_backward(trainer, None)
        meter.on_train_batch_end(trainer, None, None, None, 0)
    assert meter.device_bytes == [300, 700]
    assert meter.accounting_bytes == [None, None] and meter.counters == [None, None]  # no hooks
    # the peak before the first reset (model set-up) is not lost
    assert meter.peaks.process_peaks() == {"peak_gpu_gib": 5000 / 1024**3, "peak_gpu_reserved_gib": 6000 / 1024**3}


# --- the harness, with a fake launcher ----------------------------------------------------------------------------


def _gpu_result(spec: RunSpec, config: BenchConfig, activation_bytes: int, ms: float) -> dict[str, Any]:
    """A raw worker result as a GPU run reports it: end times, phases, losses and the meter's device bytes."""
    steps = config.steps
    nan = float("nan")
    iterations = {phase: [ms] * steps for phase in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")}
    for i in config.e2e_iterations:
        for phase in iterations:
            iterations[phase][i] = nan
    iterations.update(end_s=[ms / 1e3 * (k + 1) for k in range(steps)], loss=[3.0 - 0.1 * k for k in range(steps)])
    return {**spec.to_dict(), "status": "ok", "reason": None, "iterations": iterations, "peak_gpu_gib": 10.0,
            "peak_host_gib": 2.0,
            "device": {"type": "cuda", "name": "Fake GPU", "total_memory_gib": 80.0, "device_count": 1},
            "activations": {"device_bytes": [activation_bytes] * steps, "accounting_bytes": [None] * steps,
                            "counters": [None] * steps}}


def test_a_search_on_a_gpu_counts_out_of_memory_as_too_big(tmp_path: Path) -> None:
    """Device bytes per micro-batch as a GPU's allocator would give them; keep runs out of memory above 4."""
    per_sample = {"keep": 3 * GIB, "recompute": GIB, "offload-host": GIB}
    ms = {"keep": 100.0, "recompute": 130.0, "offload-host": 103.0}
    config = parse_args([*TINY, "--micro-batch", "4", "--accelerator", "gpu", "--activations", "keep", "recompute",
                         "offload-host", "--activation-budget-gib", "40", "--max-micro-batch", "64"])
    rok = config.rok
    assert rok is not None
    launched: list[str] = []

    def launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
        launched.append(spec.label)
        name = extra["activations"]["placement"]
        assert extra["activations"]["hooks"] == (name == "offload-host")  # on a GPU keep and recompute run bare
        if name == "keep" and cfg.micro_batch > 4:
            return {**spec.to_dict(), "status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}
        return _gpu_result(spec, cfg, per_sample[name] * cfg.micro_batch, ms[name])

    doc = run_rok(rok, tmp_path, launcher=launcher, progress=False, disk_meter=lambda *a, **k: {})
    assert launched[:3] == ["keep", "recompute", "offload-host"]
    placements = {p["placement"]: p for p in doc["placements"]}
    assert placements["keep"]["measure"] == "device" and placements["keep"]["act"] is None
    assert placements["offload-host"]["reduction_vs_keep"] == pytest.approx(2 / 3)
    assert placements["offload-host"]["overhead_vs_keep"] == pytest.approx(0.03)
    searches = {s["placement"]: s for s in doc["budget"]["searches"]}
    # keep: 4 x 3 GiB is within 40 GiB; above 4 this fake GPU runs out of memory, though 5 x 3 GiB would be too
    assert [(p["micro_batch"], p["fits"], p["status"]) for p in searches["keep"]["probes"]] == [
        (4, True, "ok"), (8, False, "oom"), (6, False, "oom"), (5, False, "oom")]
    assert searches["keep"]["largest_micro_batch"] == 4
    assert searches["offload-host"]["largest_micro_batch"] == 40 and searches["recompute"]["largest_micro_batch"] == 40
    claims = {c["claim"]: c for c in rok_claims(doc["placements"], doc["budget"])}
    assert claims[ROK_HOST_VS_KEEP]["status"] == "met"  # 67% less at +3%
    assert claims[ROK_HOST_VS_RECOMPUTE]["status"] == "met"  # faster, same memory
    # both fit micro-batch 40 in the budget, keep 4: each against keep by the tokens/s their searches measured
    leaders = [searches[name]["tokens_per_s"] for name in ("recompute", "offload-host")]
    assert claims[ROK_BUDGET]["value"] == pytest.approx(min(leaders) / searches["keep"]["tokens_per_s"])
    assert claims[ROK_BUDGET]["status"] == ("met" if claims[ROK_BUDGET]["value"] > 1 else "missed")
    assert "at micro-batch 40; keep" in claims[ROK_BUDGET]["detail"]
    report = (tmp_path / "rok.md").read_text()
    assert "Peak activation memory (device): torch.cuda.max_memory_allocated" in report
    assert "4: OOM" not in report and "8: OOM" in report
    assert (tmp_path / "rok.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_failed_placement_is_reported_and_not_searched_blindly(tmp_path: Path) -> None:
    rok = parse_args([*TINY, "--accelerator", "gpu", "--activations", "keep", "offload-host",
                      "--activation-budget-gib", "40"]).rok
    assert rok is not None

    def launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
        if extra["activations"]["placement"] == "offload-host":
            return {**spec.to_dict(), "status": "failed", "reason": "RuntimeError: injected"}
        return _gpu_result(spec, cfg, GIB * cfg.micro_batch, 100.0)

    doc = run_rok(rok, tmp_path, launcher=launcher, progress=False)
    host = doc["placements"][1]
    assert host["status"] == "failed" and host["peak_activation_bytes"] is None and host["reduction_vs_keep"] is None
    search = doc["budget"]["searches"][1]
    assert search["status"] == "incomplete" and search["largest_micro_batch"] == 0
    assert search["reason"] == "micro-batch 2: failed: RuntimeError: injected"
    assert all(c["status"] == "not measured" for c in rok_claims(doc["placements"], doc["budget"]))
    report = (tmp_path / "rok.md").read_text()
    assert "- offload-host: failed: RuntimeError: injected" in report


def test_an_interrupted_rok_run_reports_what_ran(tmp_path: Path) -> None:
    rok = parse_args([*TINY, "--accelerator", "gpu", "--activations", "keep", "recompute", "offload-host",
                      "--activation-budget-gib", "40"]).rok
    assert rok is not None
    launched: list[str] = []

    def launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
        launched.append(spec.label)
        if spec.label == "recompute":
            raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) while its worker runs
        return _gpu_result(spec, cfg, GIB * cfg.micro_batch, 100.0)

    doc = run_rok(rok, tmp_path, launcher=launcher, progress=False)
    assert launched == ["keep", "recompute"]  # nothing after the interruption, no search
    assert doc["interrupted"] is True and doc["budget"]["searches"] == []
    assert [p["status"] for p in doc["placements"]] == ["ok", "skipped", "skipped"]
    assert "**Interrupted**" in (tmp_path / "rok.md").read_text()


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


# --- claims and the disk ------------------------------------------------------------------------------------------


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


def test_rok_config_validation_lists_every_problem(tmp_path: Path) -> None:
    rok = RokConfig(bench=BenchConfig(strategies=["deep_optimizer_states"], plans=["auto"]),
                    placements=["keep", "offload-nvme", "keep"], keep_last_layers=-1, budget_gib=float("nan"))
    with pytest.raises(ValueError) as err:
        rok.validate()
    text = str(err.value)
    for part in ("--activations: keep given more than once", "--nvme-path: offload-nvme writes",
                 "--activation-keep-last-layers: -1 must be an integer >= 0", "--activation-budget-gib: nan"):
        assert part in text, part
