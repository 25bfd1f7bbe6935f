"""The bench harness: one end-to-end CPU run through ``main`` with real worker processes, plus its parts.

The end-to-end test runs a tiny model under vanilla ZeRO-3 offload and DOS (auto, host, device and a lane list
of the wrong length that must fail in its worker) and checks results.json (the end-to-end headline, the
synchronised phases, the iteration timeline), the report and both figures. The other tests cover the timer (no
synchronisation in end-to-end iterations) and the parent alone: argument resolution, statistics, aggregation
(exact end-to-end figures from hand-made end times), comparisons (and the project's targets, scripts/targets.py,
on them), the timeline figure, failure
classification (timeouts with a real child process) and a harness run whose launcher fails one configuration.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from lightning_dos.bench import chart, main
from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.compose import BENCH_RECIPE, payload
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.harness import devices_skip_reason, no_offload_skip_reason, run_bench
from lightning_dos.bench.kinds import (
    RunSpec,
    at_devices,
    base_label,
    expand,
    plan_argument,
    schedule,
    single_device_reason,
)
from lightning_dos.bench.launcher import classify_exit, launch, rank_failure
from lightning_dos.bench.pipeline import prepare, reusable
from lightning_dos.bench.report import hardware_slug
from lightning_dos.bench.results import aggregate, compare_to_baseline, e2e_samples, scaling
from lightning_dos.bench.stats import spread
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
E2E_CLAIM, check_claims = TARGETS.E2E_CLAIM, TARGETS.check_claims
TINY = ["--model", "debug", "--n-layer", "2", "--n-embd", "64", "--vocab-size", "512", "--seq-len", "32",
        "--micro-batch", "2", "--steps", "4", "--warmup", "1", "--precision", "32-true", "--sub-group-size", "40000",
        "--lr", "0.01"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULT_KEYS = {"label", "strategy", "plan", "status", "reason", "fwd_ms", "bwd_ms", "step_ms", "iteration_ms",
               "spread", "tokens_per_s", "tflops_per_s", "peak_gpu_gib", "peak_gpu_reserved_gib", "peak_host_gib",
               "final_loss", "losses", "dos", "runs", "speedup_vs_zero3_offload", "loss_vs_zero3_offload",
               "e2e_iteration_ms", "e2e_tokens_per_s", "e2e_measured_iterations", "iteration_timeline"}


# --- end to end ---------------------------------------------------------------------------------------------------


def test_bench_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    code = main([*TINY, "--strategies", "zero3_offload", "deep_optimizer_states",
                 "--plans", "host", "device", "host,device", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[1/5] zero3_offload: ok" in printed and "dos(host,device): FAILED" in printed

    doc = json.loads((out / "results.json").read_text())
    assert {"hardware", "versions", "config", "date", "results", "model", "measurement"} <= set(doc)
    hw = doc["hardware"]
    for key in ("gpu_name", "gpu_count", "gpu_memory_gib", "cpu_model", "cpu_cores_logical", "host_ram_gib", "pcie"):
        assert key in hw
    assert hw["cpu_cores_logical"] >= 1 and hw["host_ram_gib"] > 0
    assert hw["bench_device"]["type"] == "cpu"
    assert set(doc["versions"]) == {"python", "torch", "cuda", "lightning", "deepspeed", "lightning-dos"}
    assert doc["config"]["steps"] == 4 and doc["config"]["warmup"] == 1 and doc["config"]["out"] == str(out)
    assert doc["measurement"]["measured_iterations"] == [2, 3, 4]
    # default --e2e-steps: half the 3 measured iterations, rounded down: iteration 2 end to end, 3-4 synchronised
    assert doc["config"]["e2e_steps"] is None
    assert (doc["measurement"]["e2e_iterations"], doc["measurement"]["phase_iterations"]) == ([2], [3, 4])

    by_label = {r["label"]: r for r in doc["results"]}
    assert list(by_label) == ["zero3_offload", "dos(auto)", "dos(host)", "dos(device)", "dos(host,device)"]
    for result in doc["results"]:
        assert RESULT_KEYS <= set(result), RESULT_KEYS - set(result)

    # the failing configuration is reported as such, and did not stop the others
    failed = by_label.pop("dos(host,device)")
    assert failed["status"] == "failed"
    assert "plan" in failed["reason"] and "subgroups" in failed["reason"]
    assert failed["iteration_ms"] is None and failed["final_loss"] is None
    assert (out / failed["runs"][0]["log"]).is_file()

    base = by_label["zero3_offload"]
    assert base["strategy"] == "zero3_offload" and base["plan"] == 1.0 and base["dos"] is None
    for label, result in by_label.items():
        assert result["status"] == "ok", (label, result["reason"])
        for phase in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms"):
            assert result[phase] > 0, (label, phase)
            s = result["spread"][phase]
            assert s["n"] == 2 and s["min"] <= s["p25"] <= s["median"] <= s["p75"] <= s["max"]  # synchronised only
        assert result["iteration_ms"] >= result["fwd_ms"]
        # the headline: iteration 2, unsynchronised, from the raw end times (its phases were not timed)
        raw = json.loads((out / result["runs"][0]["log"]).with_name("result.json").read_text())["iterations"]
        assert [raw[phase][1] for phase in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")] == [None] * 4
        assert raw["fwd_ms"][2] is not None and raw["end_s"] == sorted(raw["end_s"]) and len(raw["end_s"]) == 4
        assert result["e2e_iteration_ms"] == pytest.approx((raw["end_s"][1] - raw["end_s"][0]) * 1e3)
        assert result["e2e_iteration_ms"] > 0
        assert result["spread"]["e2e_iteration_ms"]["n"] == result["e2e_measured_iterations"] == 1
        assert result["e2e_tokens_per_s"] == pytest.approx(64 / (result["e2e_iteration_ms"] / 1e3))
        assert result["speedup_vs_zero3_offload"]["e2e_iteration"] > 0
        assert result["tokens_per_s"] == pytest.approx(64 / (result["iteration_ms"] / 1e3))
        assert result["tflops_per_s"] > 0
        assert result["peak_gpu_gib"] is None and result["peak_gpu_reserved_gib"] is None  # no GPU here
        assert 0.05 < result["peak_host_gib"] < 24
        assert len(result["losses"]) == 4 and math.isfinite(result["final_loss"])
        assert result["speedup_vs_zero3_offload"]["iteration"] > 0
        threads = result["host_threads"]
        assert set(threads) == {f"{p}_{k}" for p in ("fwd", "bwd", "step") for k in ("other_cpu_ms", "preempted")}
        assert all(v is not None and v >= 0 for v in threads.values()), threads
    for plan in ("auto", "host", "device"):
        dos = by_label[f"dos({plan})"]
        assert dos["strategy"] == "deep_optimizer_states" and dos["plan"] == plan
        # fp32 on the CPU: the interleaved update must train exactly like vanilla offload
        assert abs(dos["final_loss"] - base["final_loss"]) < 1e-4
        assert dos["loss_vs_zero3_offload"]["max_abs_diff"] < 1e-4
        summary = dos["dos"]
        assert summary["active"] and summary["subgroups"] >= 3 and summary["update_phases"] == 2  # synchronised
        assert summary["update_ms"] > 0
        # the timeline: the last iteration, its update phase placed inside its step, both lanes' spans recorded
        timeline = dos["iteration_timeline"]
        marks, update = timeline["marks_ms"], timeline["update"]
        assert timeline["iteration"] == 4
        assert 0 < marks["backward_start"] <= marks["backward_end"] <= marks["step_start"] <= marks["end"]
        assert marks["step_start"] <= update["start_ms"] <= update["start_ms"] + update["total_ms"] <= marks["end"]
        assert update["lanes"] == dos["dos"]["lanes"][-1] and update["events"]
        assert {e["lane"] for e in update["events"]} == {lane for letter, lane in (("H", "host"), ("D", "device"))
                                                         if letter in update["lanes"]}
    assert by_label["dos(device)"]["dos"]["device_fraction"] == 1.0
    assert by_label["dos(host)"]["dos"]["device_fraction"] == 0.0
    assert base["speedup_vs_zero3_offload"]["iteration"] == pytest.approx(1.0)
    assert base["speedup_vs_zero3_offload"]["e2e_iteration"] == pytest.approx(1.0)
    assert base["iteration_timeline"]["update"] is None and base["iteration_timeline"]["iteration"] == 4
    assert "claims" not in doc  # a report states what was measured; the project's targets are not in it
    assert next(c for c in check_claims(doc["results"]) if c["claim"] == E2E_CLAIM)["value"] > 0

    report = (out / "report.md").read_text()
    for text in ("## Hardware", "## Versions", "## Configuration", "end to end (what a user sees): iteration 2 ",
                 "phase by phase (synchronised): iterations 3-4", "## Speedup vs zero3_offload", "## Loss agreement",
                 "dos(auto)", "failed", "chart.png", "## Host threads", "| peak GPU memory |",
                 "](iteration_timeline.png)"):
        assert text in report, text
    assert "claim" not in report.lower() and " met" not in report
    # what a user sees comes first, then the synchronised phases
    assert report.index("## What a user sees: end-to-end time per iteration") < report.index(
        "## Phase by phase (synchronised)") < report.index("## Speedup vs zero3_offload")
    assert (out / f"debug_cpu_{doc['date'][:10]}.md").read_text() == report
    timeline_png = out / "iteration_timeline.png"
    assert timeline_png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(timeline_png)  # a panel per completed configuration: 4, the DOS ones taller
    assert image.shape[0] > 900 and image.shape[1] > 1000

    png = out / "chart.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400


def _workers_of(out: Path) -> list[Any]:
    """Processes still running a worker of the bench in ``out`` (none once the bench has returned)."""
    import psutil

    left = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "lightning_dos.bench.worker" in cmdline and str(out) in cmdline:
            left.append(proc)
    return left


def test_bench_data_parallel_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--devices 1 2`` on two gloo CPU ranks: every configuration at one and two devices, in one invocation;
    rank 0 reports every rank's own figures, vanilla is compared at the same device count, a single-device kind is
    skipped at two, a kind that cannot run on a CPU (fsdp_offload, the multi-GPU peer) gets a failed row with its
    reason at both, and the scaling section, the data-parallel claims, the report and every rank's timeline follow."""
    out = tmp_path / "dp"
    code = main([*TINY, "--accelerator", "cpu", "--devices", "1", "2", "--strategies", "zero3_offload",
                 "deep_optimizer_states", "plain", "fsdp_offload", "--plans", "auto", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "plain@dp2: SKIPPED: single-GPU only" in printed
    assert not _workers_of(out)  # rank 0 waited for its ranks: none is left running

    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["devices"] == [1, 2]
    by_label = {r["label"]: r for r in doc["results"]}
    assert list(by_label) == ["zero3_offload", "dos(auto)", "plain", "fsdp_offload", "zero3_offload@dp2",
                              "dos(auto)@dp2", "plain@dp2", "fsdp_offload@dp2"]
    assert [r["devices"] for r in doc["results"]] == [1, 1, 1, 1, 2, 2, 2, 2]
    skipped = by_label["plain@dp2"]
    assert skipped["status"] == "skipped" and "single-GPU only" in skipped["reason"]
    for label, devices in (("fsdp_offload", 1), ("fsdp_offload@dp2", 2)):  # run, and refused by the strategy itself
        fsdp = by_label[label]
        assert (fsdp["status"], fsdp["strategy"], fsdp["devices"], fsdp["iteration_ms"]) == (
            "failed", "fsdp_offload", devices, None)
        assert fsdp["reason"].startswith(
            "MisconfigurationException: accelerator: fsdp_offload needs a CUDA GPU, got device cpu")
    for label in ("zero3_offload", "dos(auto)", "plain", "zero3_offload@dp2", "dos(auto)@dp2"):
        result = by_label[label]
        assert result["status"] == "ok", (label, result["reason"])
        devices = result["devices"]
        assert result["tokens_per_iteration"] == 64 * devices  # micro-batch 2 x seq 32, every rank's
        assert result["e2e_tokens_per_s"] == pytest.approx(64 * devices / (result["e2e_iteration_ms"] / 1e3))
        assert result["tokens_per_s"] == pytest.approx(64 * devices / (result["iteration_ms"] / 1e3))
        ranks = result["per_rank"]
        assert [rank["rank"] for rank in ranks] == list(range(devices))
        for rank in ranks:
            assert rank["iteration_ms"] > 0 and rank["e2e_iteration_ms"] > 0, (label, rank)
            assert len(rank["iteration_ms_samples"]) == 2 and all(math.isfinite(v) for v in
                                                                  rank["iteration_ms_samples"])
            assert len(rank["e2e_samples"]) == 1 and rank["e2e_samples"][0] > 0
            assert len(rank["end_s"]) == 4 and rank["end_s"] == sorted(rank["end_s"])
            assert 0.05 < rank["peak_host_gib"] < 24 and rank["peak_gpu_gib"] is None  # no GPU here
            assert len(rank["losses"]) == 4 and all(math.isfinite(v) for v in rank["losses"])
            timeline = rank["iteration_timeline"]
            assert timeline["iteration"] == 4 and timeline["started_s"] > 0
        # the host holds every rank: its peak is their sum; the row's times are rank 0's
        assert result["peak_host_gib"] == pytest.approx(sum(rank["peak_host_gib"] for rank in ranks))
        assert result["peak_host_gib_per_rank"] == [rank["peak_host_gib"] for rank in ranks]
        assert result["iteration_ms"] == ranks[0]["iteration_ms"]
    dp_dos, dp_vanilla = by_label["dos(auto)@dp2"], by_label["zero3_offload@dp2"]
    assert {rank["rank"] for rank in dp_dos["per_rank"]} == {0, 1}
    for rank in dp_dos["per_rank"]:  # each rank planned and timed its own partition's update phases
        assert rank["dos"]["active"] and len(rank["dos"]["update_ms_per_step"]) == 2
        assert all(v > 0 for v in rank["dos"]["update_ms_per_step"]) and 0 <= rank["dos"]["device_fraction"] <= 1
        assert rank["iteration_timeline"]["update"]["events"]
    # fp32 on the CPU: DOS at two ranks trains exactly like vanilla at two ranks, rank by rank
    for dos_rank, vanilla_rank in zip(dp_dos["per_rank"], dp_vanilla["per_rank"]):
        assert max(abs(a - b) for a, b in zip(dos_rank["losses"], vanilla_rank["losses"])) < 1e-4
    assert dp_dos["loss_vs_zero3_offload"]["max_abs_diff"] < 1e-4
    assert dp_dos["per_rank"][0]["losses"] != dp_dos["per_rank"][1]["losses"]  # each rank its own batches
    # compared with vanilla at the same device count
    assert dp_vanilla["speedup_vs_zero3_offload"]["iteration"] == pytest.approx(1.0)
    assert dp_dos["speedup_vs_zero3_offload"]["e2e_iteration"] == pytest.approx(
        dp_vanilla["e2e_iteration_ms"] / dp_dos["e2e_iteration_ms"])
    raw = json.loads((out / dp_dos["runs"][0]["log"]).with_name("result.json").read_text())
    assert raw["rank"] == 0 and len(raw["per_rank"]) == 2
    assert not list((out / dp_dos["runs"][0]["log"]).parent.glob("rank*.failure.json"))

    scaling = doc["scaling"]
    assert scaling["device_counts"] == [1, 2] and scaling["reference_devices"] == 1
    rows = {row["label"]: row for row in scaling["rows"]}
    assert set(rows) == {"zero3_offload", "dos(auto)"} and {row["devices"] for row in rows.values()} == {2}
    auto = rows["dos(auto)"]
    assert auto["speedup_e2e"]["ratio"] == pytest.approx(auto["speedup_e2e"]["at_n"] / auto["speedup_e2e"]["reference"])
    assert auto["e2e_tokens_per_s"]["ratio"] == pytest.approx(
        dp_dos["e2e_tokens_per_s"] / by_label["dos(auto)"]["e2e_tokens_per_s"])
    claims = {c["claim"]: c for c in check_claims(doc["results"])}
    kept = claims["DOS/zero3_offload ratio at DP=2 vs DP=1"]
    assert kept["status"] in ("met", "missed") and kept["value"] == pytest.approx(auto["speedup_e2e"]["ratio"])
    assert claims["dos(auto) vs static_split 0.5 at DP=2 at lower peak GPU memory"]["status"] == "not measured"

    report = (out / "report.md").read_text()
    for text in ("## Data parallel", "| devices |", "| dos(auto)@dp2 | ok |", "](rank_timelines.png)",
                 "single-GPU only",
                 by_label["fsdp_offload@dp2"]["reason"][:60], "except that fsdp_offload builds the model on the host"):
        assert text in report, text
    assert report.index("## Speedup vs zero3_offload") < report.index("## Data parallel") < report.index(
        "## DOS update phase")
    png = out / "rank_timelines.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)  # two panels, one per rank, each with the update phase's lane rows
    assert image.shape[0] > 700 and image.shape[1] > 1000


def test_phase_timer_charges_other_threads_cpu_to_the_phase_they_ran_in() -> None:
    """A thread that burns CPU during the forward shows up as that phase's other-thread CPU time, not the backward's."""
    import threading

    import torch

    from lightning_dos.bench.timing import PhaseTimer

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    timer = PhaseTimer(synchronize=lambda: None)
    for _ in range(2):
        timer.on_train_batch_start(None, None, None, 0)
        worker = threading.Thread(target=spin, args=(0.15,))
        worker.start()
        worker.join()  # the training thread waits: the CPU time is the worker's
        timer.on_before_backward(None, None, torch.tensor(0.0))
        timer.on_after_backward(None, None)
        timer.on_before_optimizer_step(None, None, None)
        timer.on_train_batch_end(None, None, {"loss": torch.tensor(1.0)}, None, 0)
    assert all(v >= 100 for v in timer.host["fwd_other_cpu_ms"]), timer.host
    assert all(v < 50 for v in timer.host["bwd_other_cpu_ms"] + timer.host["step_other_cpu_ms"]), timer.host
    assert all(v >= 0 for v in timer.host["fwd_preempted"])
    assert len(timer.samples["fwd_ms"]) == 2 and min(timer.samples["fwd_ms"]) >= 100


def _drive(timer: Any, loss: Any, during_step: Any = None) -> None:
    """One iteration through the timer's hooks, calling ``during_step`` between the step's start and its end."""
    timer.on_train_batch_start(None, None, None, 0)
    timer.on_before_backward(None, None, loss)
    timer.on_after_backward(None, None)
    timer.on_before_optimizer_step(None, None, None)
    if during_step is not None:
        during_step()
    timer.on_train_batch_end(None, None, {"loss": loss}, None, 0)


def test_phase_timer_leaves_e2e_iterations_unsynchronised() -> None:
    """An end-to-end iteration gets no synchronisation and no phase marks, only its end time; its loss stays a tensor
    until the losses are read. The update phase that began in the last synchronised iteration is placed in it."""
    from types import SimpleNamespace

    import torch

    from lightning_dos.bench.timing import PhaseTimer

    syncs: list[int] = []
    manager = SimpleNamespace(records=[])

    def update_phase() -> None:  # what the executor records: when the update phase began
        manager.records.append(SimpleNamespace(timings=SimpleNamespace(started_s=time.perf_counter())))
        time.sleep(0.002)

    timer = PhaseTimer(synchronize=lambda: syncs.append(len(timer.ends)), e2e_iterations={1, 2})
    timer.on_train_start(SimpleNamespace(strategy=SimpleNamespace(manager=manager)), None)
    timer.on_train_start(SimpleNamespace(strategy=SimpleNamespace(manager=manager)), None)
    assert syncs == [0, 0]
    for k in range(4):
        _drive(timer, torch.tensor(float(k)), during_step=update_phase)
    # synchronised iterations 0 and 3: five marks each; the e2e iterations 1 and 2: none
    assert syncs == [0, 0] + [0] * 5 + [3] * 5
    assert [math.isnan(v) for v in timer.samples["fwd_ms"]] == [False, True, True, False]
    assert all(math.isnan(v) for v in timer.host["bwd_other_cpu_ms"][1:3])
    assert timer.ends == sorted(timer.ends) and len(timer.ends) == 4 and timer.ends[0] > 0
    assert isinstance(timer._losses[1], torch.Tensor)  # not converted (a sync on a GPU) during training
    assert timer.losses == [0.0, 1.0, 2.0, 3.0]
    assert len(timer.update_starts) == 4  # one per update phase, e2e iterations included
    last = timer.last_iteration()
    assert last is not None and (last["iteration"], last["update_index"]) == (4, 3)
    marks = last["marks_ms"]
    assert marks["step_start"] <= last["update_start_ms"] <= marks["end"] and marks["end"] >= 2.0


class _FakeAllocator:
    """A caching allocator's counters, as ``GpuPeakMeter`` reads them: bytes in use, and the peak since a reset."""

    def __init__(self) -> None:
        self.in_use = self.peak = 0

    def alloc(self, gib: float) -> None:
        self.in_use += int(gib * 1024**3)
        self.peak = max(self.peak, self.in_use)

    def read(self) -> tuple[int, int]:
        return self.peak, self.peak + 1024**3  # reserved: 1 GiB above

    def reset(self) -> None:
        self.peak = self.in_use


def test_phase_timer_gives_each_phase_of_a_synchronised_iteration_its_own_peak_gpu_memory() -> None:
    """Each phase gets the allocator's peak within it (the step's from the end of the backward), an end-to-end
    iteration none; the process's peak still covers everything, the end-to-end iteration's too; the result's
    per-phase peaks are the largest over the synchronised iterations, and the report names the highest phase."""
    import torch

    from lightning_dos.bench.report import _phase_peak_lines
    from lightning_dos.bench.timing import PhaseTimer
    from lightning_dos.telemetry.peak_memory import GpuPeakMeter

    gpu = _FakeAllocator()
    gpu.alloc(4.0)  # parameters, before training
    meter = GpuPeakMeter(gpu.read, gpu.reset)
    timer = PhaseTimer(synchronize=lambda: None, e2e_iterations={1}, memory=meter)

    def iteration(fwd: float, bwd: float, between: float, step: float) -> None:
        timer.on_train_batch_start(None, None, None, 0)
        gpu.alloc(fwd)  # activations
        timer.on_before_backward(None, None, torch.tensor(0.0))
        gpu.alloc(bwd)
        gpu.alloc(-(fwd + bwd))  # activations and the backward's buffers go
        timer.on_after_backward(None, None)
        gpu.alloc(between)  # e.g. clipping's buffers, before the step hook
        gpu.alloc(-between)
        timer.on_before_optimizer_step(None, None, None)
        gpu.alloc(step)  # the update's buffers
        gpu.alloc(-step)
        timer.on_train_batch_end(None, None, {"loss": torch.tensor(1.0)}, None, 0)

    iteration(1.0, 2.0, 0.5, 3.0)
    iteration(8.0, 0.0, 0.0, 0.0)  # end to end: no phase marks, no phase peaks
    iteration(1.0, 2.5, 4.0, 1.0)  # the step's peak came before its hook
    samples = timer.memory_samples
    assert samples["fwd_peak_gpu_gib"][0] == 5.0 and samples["bwd_peak_gpu_gib"][0] == 7.0
    assert samples["step_peak_gpu_gib"][0] == 7.0  # the backward's peak is not the step's: it was reset at its end
    assert [math.isnan(v) for v in samples["fwd_peak_gpu_gib"]] == [False, True, False]
    assert (samples["bwd_peak_gpu_gib"][2], samples["step_peak_gpu_gib"][2]) == (7.5, 8.0)
    assert meter.process_peaks() == {"peak_gpu_gib": 12.0, "peak_gpu_reserved_gib": 13.0}  # the e2e iteration's

    config = BenchConfig(steps=3, warmup=0, e2e_steps=1)  # iteration 0 end to end: synchronised are 1 and 2
    raw = _raw("dos(auto)", "deep_optimizer_states", [5.0, 6.0, 7.0], [1.0] * 3)
    raw["iterations"].update({key: [v[1], v[0], v[2]] for key, v in samples.items()})  # synchronised: 1 and 2
    result = aggregate(RunSpec("dos(auto)", "deep_optimizer_states", "auto"), [raw], config, {})
    assert result["peak_gpu_gib_by_phase"] == {"fwd": 5.0, "bwd": 7.5, "step": 8.0}
    lines = _phase_peak_lines([{**result, "peak_gpu_gib": 12.0}])
    assert "| dos(auto) | 5.00 | 7.50 | 8.00 | 12.00 | step |" in lines
    # off a GPU: nothing measured, no row and no section
    cpu = aggregate(RunSpec("dos(auto)", "deep_optimizer_states", "auto"),
                    [_raw("dos(auto)", "deep_optimizer_states", [5.0, 6.0, 7.0], [1.0] * 3)], config, {})
    assert cpu["peak_gpu_gib_by_phase"] is None and _phase_peak_lines([cpu]) == []
    inert = GpuPeakMeter()
    inert.bind(torch.device("cpu"))
    assert not inert.active and inert.take() is None


# --- command line and configurations ------------------------------------------------------------------------------


def test_e2e_steps_default_and_validation(capsys: pytest.CaptureFixture[str]) -> None:
    """By default half the measured iterations (rounded down) run end to end, right after the warm-up; --steps must
    leave at least one synchronised iteration after them."""
    assert [BenchConfig(steps=n, warmup=3).e2e_count for n in (4, 5, 6, 10, 11)] == [0, 1, 1, 3, 4]
    config = BenchConfig(steps=10, warmup=3)
    assert (list(config.e2e_iterations), list(config.phase_iterations)) == ([3, 4, 5], [6, 7, 8, 9])
    zero = BenchConfig(steps=3, warmup=0, e2e_steps=2)
    assert (list(zero.e2e_iterations), list(zero.phase_iterations)) == ([0, 1], [2])
    with pytest.raises(ValueError, match=r"e2e_steps: 3 .* set --steps above --warmup \+ --e2e-steps \(6 or more\)"):
        BenchConfig(steps=5, warmup=2, e2e_steps=3).validate()
    with pytest.raises(ValueError, match="e2e_steps: -1 must be an integer >= 0"):
        BenchConfig(e2e_steps=-1).validate()
    BenchConfig(steps=6, warmup=2, e2e_steps=3).validate()
    assert parse_args([*TINY, "--e2e-steps", "2"]).config.e2e_steps == 2
    assert main([*TINY, "--e2e-steps", "3"]) == 2  # 4 steps, 1 of warm-up: none left to synchronise
    assert "--warmup + --e2e-steps (5 or more)" in capsys.readouterr().err




def test_defaults_target_a_gpu_host() -> None:
    """Without flags the bench runs its own recipe (gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, random tokens)
    under every strategy fragment as it is: no workload flag is set, and the settings resolve to the recipe's."""
    config = parse_args([]).config
    assert (config.model, config.seq_len, config.micro_batch, config.precision, config.sub_group_size) == (None,) * 5
    assert config.steps == 10 and config.warmup == 3 and config.overlap == ["auto"]
    assert BENCH_RECIPE["model"]["name"] == "gpt-2.7b" and BENCH_RECIPE["trainer"]["precision"] == "bf16-mixed"
    _, resolved, model = prepare(config)
    assert (resolved.model, resolved.seq_len, resolved.micro_batch, resolved.precision) == ("gpt-2.7b", 2048, 4,
                                                                                            "bf16-mixed")
    assert resolved.activation_checkpointing and resolved.data == "synthetic" and model["params"] == 2_780_451_840
    labels = [spec.label for spec in expand(config)]
    assert labels == ["zero3_offload", "static_split(0.25)", "static_split(0.5)", "static_split(0.75)", "dos(auto)",
                      "no_offload", "plain", "torchao_offload", "superoffload", "zenflow",
                      "fsdp_offload"]  # every peer, one bench


def test_flags_override_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"model": "gpt-1b", "steps": 6, "plans": ["host"]}))
    config = parse_args(["--config", str(path), "--steps", "8", "--sub-group-size", "5e7", "--text",
                         "--no-activation-checkpointing", "--plans", "auto", "0.5", "stride:3"]).config
    assert (config.model, config.steps, config.sub_group_size, config.data) == ("gpt-1b", 8, 50_000_000, "text")
    assert not config.activation_checkpointing
    specs = expand(BenchConfig(strategies=["deep_optimizer_states"], plans=config.plans))
    assert [spec.plan for spec in specs] == ["auto", "0.5", "stride:3"]
    assert plan_argument("0.5") == 0.5 and plan_argument("host,device") == ["host", "device"]


def test_a_recipe_is_what_every_configuration_starts_from_and_flags_override_it(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "seed_everything: 7\n"
        "trainer:\n"
        "  precision: 32-true\n"
        "  max_steps: 50\n"
        "  strategy:\n"
        "    class_path: lightning_dos.DeepOptimizerStatesStrategy\n"
        "    init_args: {plan: 0.5, sub_group_size: 20000000, pin_memory: false}\n"
        "model:\n"
        "  name: gpt-1b\n"
        "  n_layer: 4\n"
        "  activation_checkpointing: false\n"
        "  learning_rate: 1.0e-3\n"
        "data:\n"
        "  class_path: lightning_dos.data.TextDataModule\n"
        "  init_args: {bpe_vocab_size: 512, seq_len: 64, batch_size: 8}\n"
    )
    config = parse_args(["--recipe", str(recipe), "--micro-batch", "2", "--synthetic", "--vocab-size", "96"]).config
    assert config.recipe == str(recipe) and (config.model, config.n_layer, config.micro_batch) == (None, None, 2)
    _, resolved, model = prepare(config)
    assert (resolved.model, resolved.seq_len, resolved.micro_batch, resolved.precision, resolved.seed) == (
        "gpt-1b", 64, 2, "32-true", 7)
    assert resolved.data == "synthetic" and not resolved.activation_checkpointing and resolved.learning_rate == 1e-3
    assert (model["n_layer"], model["vocab_size"], model["block_size"]) == (4, 96, 64)  # the data's vocabulary
    assert resolved.steps == 10  # the bench decides how long to run, not the recipe
    # each configuration: the recipe, its fragment, the flags given, the bench's own settings
    spec = RunSpec("zero3_offload", "zero3_offload", 1.0)
    fit = payload(config, spec, tmp_path / "run", write=False)["fit"]
    assert fit["args"][:4] == ["--config", str(recipe.resolve()), "--config", fit["args"][3]]
    assert fit["args"][3].endswith("configs/strategy/zero3_offload.yaml")
    assert fit["command"].startswith(
        f"lightning-dos fit --config {recipe.resolve()} --config configs/strategy/zero3_offload.yaml --data "
        "lightning_dos.data.SyntheticDataModule --data.batch_size 2 --data.vocab_size 96 --trainer.max_steps 10")


def test_committed_reports_still_load_and_render(tmp_path: Path) -> None:
    """Every committed results.json (benchmarks/) is still a ``--config`` file that parses, and its report and
    chart still render, though they were written before the bench composed lightning-dos fit runs."""
    from lightning_dos.bench import report

    committed = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*/results.json"))
    assert len(committed) >= 20
    for path in committed:
        assert parse_args(["--config", str(path), "--dry-run"]).config.steps >= 1, path
        doc = json.loads(path.read_text())
        text = report.render(doc, next((r for r in doc["results"] if r["label"] == "zero3_offload"), None))
        assert text.startswith("# lightning-dos bench: ") and "## Configuration" in text, path
    assert chart.render(json.loads(committed[-1].read_text()), tmp_path / "chart.png").is_file()


@pytest.mark.parametrize("argv", [["--plans", "sideways"], ["--steps", "3", "--warmup", "3"],
                                  ["--strategies", "zero2"], ["--ratios", "1.5"]])
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_dry_run_lists_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--plans", "stride:2", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "dos(stride:2)" in printed and "static_split(0.5)" in printed and "no_offload" in printed
    assert "1 warm-up, then 1 end to end (unsynchronised), then 2 phase by phase (synchronised)" in printed


def test_overlap_adds_dos_rows_and_reaches_the_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    invocation = parse_args([*TINY, "--strategies", "deep_optimizer_states", "--plans", "host", "--overlap", "off",
                             "on", "auto"])
    specs = expand(invocation.config)
    assert [(s.label, s.plan, s.args.get("overlap")) for s in specs] == [
        ("dos(auto,serial)", "auto", False), ("dos(auto,overlap)", "auto", True), ("dos(auto)", "auto", None),
        ("dos(host,serial)", "host", False), ("dos(host,overlap)", "host", True), ("dos(host)", "host", None)]
    assert RunSpec(**specs[3].to_dict()) == specs[3]  # what a worker rebuilds from its payload
    assert [s.label for s in expand(parse_args([*TINY, "--strategies", "deep_optimizer_states"]).config)] == [
        "dos(auto)"]  # the strategy's own default (auto) unless asked
    for bad in (["--overlap", "maybe"], ["--overlap", "on", "--sweep"], ["--overlap", "on", "--activations", "keep"]):
        with pytest.raises(SystemExit):
            parse_args([*TINY, *bad])
        assert "--overlap" in capsys.readouterr().err
    with pytest.raises(ValueError, match="overlap"):
        BenchConfig(overlap=[]).validate()


def test_resident_gib_adds_dos_rows_reaches_the_strategy_and_shows_in_the_report(
        capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_dos.bench.report import _dos_lines

    invocation = parse_args([*TINY, "--strategies", "deep_optimizer_states", "--overlap", "off", "on",
                             "--resident-gib", "auto", "0", "3.85"])
    specs = expand(invocation.config)
    assert [(s.label, s.args["overlap"], s.args.get("resident_gib")) for s in specs] == [
        ("dos(auto,serial)", False, None), ("dos(auto,serial,resident=0GiB)", False, 0.0),
        ("dos(auto,serial,resident=3.85GiB)", False, 3.85), ("dos(auto,overlap)", True, None),
        ("dos(auto,overlap,resident=0GiB)", True, 0.0), ("dos(auto,overlap,resident=3.85GiB)", True, 3.85)]
    assert parse_args(TINY).config.resident_gib == ["auto"]  # the strategy's default unless asked
    assert RunSpec(**specs[2].to_dict()) == specs[2]
    for bad in (["--resident-gib", "x"], ["--resident-gib", "1", "--sweep"]):
        with pytest.raises(SystemExit):
            parse_args([*TINY, *bad])
        assert "--resident-gib" in capsys.readouterr().err
    with pytest.raises(ValueError, match="resident_gib"):
        BenchConfig(resident_gib=[-1.0]).validate()
    dos = {"plan": "plan auto", "active": True, "subgroups": 27, "resident_subgroups": [0, 1, 2],
           "device_fraction": 0.4, "update_ms": 1.0, "host_busy_ms": 1.0, "device_busy_ms": 1.0, "h2d_gb": 1.0,
           "d2h_gb": 1.0, "demoted_subgroups_max": 0, "resident_params": 343_702_528, "device_buffer_gib": 0.9375}
    table = "\n".join(_dos_lines([{"label": "dos(auto,resident=3.85GiB)", "dos": dos}]))
    assert "| 27 (3 resident) |" in table
    assert table.count("| 0 | 0.94 | 3.84 |") == 1  # demoted, the executor's buffers and the resident state (GiB)
    earlier = {k: v for k, v in dos.items() if k not in ("resident_params", "device_buffer_gib")}  # older reports
    assert "| 0 | – | 0.00 |" in "\n".join(_dos_lines([{"label": "dos(auto)", "dos": earlier}]))


def test_leaf_blocks_adds_dos_rows_and_reaches_the_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    invocation = parse_args([*TINY, "--strategies", "deep_optimizer_states", "--overlap", "off", "on",
                             "--leaf-blocks", "on", "off"])
    specs = expand(invocation.config)
    assert [(s.label, s.args["overlap"], s.args.get("leaf_blocks")) for s in specs] == [
        ("dos(auto,serial)", False, None), ("dos(auto,serial,layer-hooks)", False, False),
        ("dos(auto,overlap)", True, None), ("dos(auto,overlap,layer-hooks)", True, False)]
    assert RunSpec(**specs[2].to_dict()) == specs[2]
    for bad in (["--leaf-blocks", "maybe"], ["--leaf-blocks", "off", "--sweep"],
                ["--leaf-blocks", "off", "--activations", "keep"]):
        with pytest.raises(SystemExit):
            parse_args([*TINY, *bad])
        assert "--leaf-blocks" in capsys.readouterr().err
    with pytest.raises(ValueError, match="leaf_blocks"):
        BenchConfig(leaf_blocks=[]).validate()


def test_repeats_are_interleaved() -> None:
    specs = expand(BenchConfig(strategies=["zero3_offload", "no_offload"]))
    assert [(s.label, s.repeat) for s in schedule(specs, 2)] == [
        ("zero3_offload", 0), ("no_offload", 0), ("zero3_offload", 1), ("no_offload", 1)]


def test_no_offload_is_skipped_only_when_it_cannot_fit() -> None:
    config = BenchConfig(accelerator="auto")
    model = {"no_offload_state_gib_lower_bound": 41.7, "params": 2_600_000_000}
    assert no_offload_skip_reason(config, model, {"gpu_count": 1, "gpu_memory_gib": 139.8}) is None
    reason = no_offload_skip_reason(config, model, {"gpu_count": 1, "gpu_memory_gib": 22.0})
    assert reason is not None and "does not fit" in reason
    assert no_offload_skip_reason(config, model, {"gpu_count": 0, "gpu_memory_gib": None}) is None
    config.force_no_offload = True
    assert no_offload_skip_reason(config, model, {"gpu_count": 1, "gpu_memory_gib": 22.0}) is None


def test_hardware_slug() -> None:
    assert hardware_slug({"gpu_name": "NVIDIA H200"}) == "H200"
    assert hardware_slug({"gpu_name": "NVIDIA H100 80GB HBM3"}) == "H100-80GB-HBM3"
    assert hardware_slug({"gpu_name": None}) == "cpu"


# --- statistics and comparisons -----------------------------------------------------------------------------------


def test_spread_uses_interpolated_percentiles() -> None:
    s = spread([4.0, 1.0, 3.0, 2.0, float("nan")])
    assert (s.n, s.min, s.p25, s.median, s.p75, s.max) == (4, 1.0, 1.75, 2.5, 3.25, 4.0)
    assert spread([]) is None


def _raw(label: str, strategy: str, iteration: list[float], losses: list[float], repeat: int = 0,
         end_s: list[float] | None = None) -> dict[str, Any]:
    raw = {"status": "ok", "reason": None, "label": label, "strategy": strategy, "plan": None, "repeat": repeat,
           "iterations": {"fwd_ms": [1.0] * len(iteration), "bwd_ms": [2.0] * len(iteration),
                          "step_ms": [x - 3.0 for x in iteration], "iteration_ms": iteration, "loss": losses},
           "peak_gpu_gib": None, "peak_host_gib": 1.0 + repeat, "dos": None, "device": {"type": "cpu"}}
    if end_s is not None:
        raw["iterations"]["end_s"] = end_s
    return raw


def test_aggregate_pools_repeats_and_compares_with_vanilla() -> None:
    config = BenchConfig(steps=3, warmup=1, e2e_steps=0, micro_batch=2, seq_len=8)
    model = {"flops_per_token": 1e9}
    base_spec, dos_spec = RunSpec("zero3_offload", "zero3_offload", 1.0), RunSpec("dos(auto)", "deep_optimizer_states",
                                                                                  "auto")
    base = aggregate(base_spec, [_raw("zero3_offload", "zero3_offload", [99.0, 10.0, 12.0], [5.0, 4.0, 3.0]),
                                 _raw("zero3_offload", "zero3_offload", [99.0, 14.0, 16.0], [5.0, 4.0, 3.0], 1)],
                     config, model)
    dos = aggregate(dos_spec, [_raw("dos(auto)", "deep_optimizer_states", [50.0, 5.0, 7.0], [5.0, 4.0, 3.5])],
                    config, model)
    assert base["iteration_ms"] == 13.0 and base["spread"]["iteration_ms"]["n"] == 4  # warm-up 99s excluded
    assert base["peak_host_gib"] == 2.0 and base["repeats_ok"] == 2
    assert dos["tokens_per_s"] == pytest.approx(16 / 6e-3)
    assert dos["tflops_per_s"] == pytest.approx(16 / 6e-3 * 1e9 / 1e12)
    assert compare_to_baseline([base, dos]) is base
    assert dos["speedup_vs_zero3_offload"]["iteration"] == pytest.approx(13.0 / 6.0)
    assert dos["loss_vs_zero3_offload"]["final_abs_diff"] == pytest.approx(0.5)
    assert dos["loss_vs_zero3_offload"]["max_abs_diff"] == pytest.approx(0.5)


def test_e2e_headline_from_raw_end_times() -> None:
    """The e2e figures of a hand-made raw result: iterations 2-3 (after one of warm-up) end to end, each
    end_k - end_(k-1), pooled over the repeats; the phases from iterations 4-6 only; the speedup and the claim."""
    config = BenchConfig(steps=6, warmup=1, e2e_steps=2, micro_batch=2, seq_len=8)
    nan = float("nan")
    phases = [99.0, nan, nan, 10.0, 12.0, 14.0]  # the worker writes NaN (null) for the e2e iterations' phases
    spec = RunSpec("zero3_offload", "zero3_offload", 1.0)
    # end times in seconds since training started: e2e samples 31.25 and 93.75 ms, then 62.5 and 62.5 ms
    base = aggregate(spec, [
        _raw("zero3_offload", "zero3_offload", phases, [1.0] * 6, end_s=[1.0, 1.03125, 1.125, 2.0, 3.0, 4.0]),
        _raw("zero3_offload", "zero3_offload", phases, [1.0] * 6, 1, end_s=[0.5, 0.5625, 0.625, 9.0, 9.5, 9.75]),
    ], config, {"flops_per_token": 1.0})
    assert base["e2e_iteration_ms"] == 62.5 and base["e2e_measured_iterations"] == 4
    assert base["spread"]["e2e_iteration_ms"] == {"n": 4, "min": 31.25, "p25": 54.6875, "median": 62.5,
                                                  "p75": 70.3125, "max": 93.75}
    assert base["e2e_tokens_per_s"] == 16 / 0.0625 == 256.0
    assert [run["e2e_iteration_ms"] for run in base["runs"]] == [62.5, 62.5]
    # synchronised: iterations 4-6 of both repeats (warm-up and the e2e window left out)
    assert base["iteration_ms"] == 12.0 and base["measured_iterations"] == 6 and base["tokens_per_s"] == 16 / 0.012

    dos_spec = RunSpec("dos(auto)", "deep_optimizer_states", "auto")
    dos = aggregate(dos_spec, [_raw("dos(auto)", "deep_optimizer_states", phases, [1.0] * 6,
                                    end_s=[1.0, 1.015625, 1.046875, 2.0, 3.0, 4.0])], config, {"flops_per_token": 1.0})
    assert dos["e2e_iteration_ms"] == (15.625 + 31.25) / 2
    compare_to_baseline([base, dos])
    assert dos["speedup_vs_zero3_offload"]["e2e_iteration"] == 62.5 / 23.4375
    claim = next(c for c in check_claims([base, dos]) if c["claim"] == E2E_CLAIM)
    assert claim["value"] == 62.5 / 23.4375 and claim["status"] == "missed"  # 2.67x, under the 3.5x target
    assert claim["detail"] == "dos(auto) 23.4 ms vs zero3_offload 62.5 ms, end to end"
    faster = dict(dos, e2e_iteration_ms=62.5 / 3.5)
    assert next(c for c in check_claims([base, faster]) if c["claim"] == E2E_CLAIM)["status"] == "met"

    # no warm-up: the first end-to-end sample runs from the training start
    first = BenchConfig(steps=2, warmup=0, e2e_steps=1)
    assert e2e_samples({"end_s": [0.125, 0.25]}, first) == [125.0]
    # no end times (a result from before they were recorded), or --e2e-steps 0: no headline, and no claim value
    old = aggregate(spec, [_raw("zero3_offload", "zero3_offload", phases, [1.0] * 6)], config, {})
    assert (old["e2e_iteration_ms"], old["e2e_tokens_per_s"], old["spread"]["e2e_iteration_ms"]) == (None, None, None)
    assert next(c for c in check_claims([old, dos]) if c["claim"] == E2E_CLAIM)["status"] == "not measured"


def test_iteration_timeline_places_the_update_lanes(tmp_path: Path) -> None:
    """The update phase's lane spans (ms since it began) are shifted to where it began in the iteration; a
    configuration without a DOS update phase gets fwd / bwd / step only; no timelines, no figure."""
    from lightning_dos.telemetry.records import ROWS, lane_bars

    events = [{"subgroup": 0, "lane": "host", "adam": [0.0, 3.0], "upload": [3.0, 4.0]},
              {"subgroup": 1, "lane": "device", "prefetch": [-1.0, 1.0], "adam": [1.0, 2.0], "flush": [2.0, 5.0]}]
    bars = dict(zip([(lane, stage) for lane, stage, *_ in ROWS], lane_bars(events, scale=1.0, offset=40.0)))
    assert bars[("host", "adam")] == [(40.0, 3.0)] and bars[("host", "upload")] == [(43.0, 1.0)]
    assert bars[("device", "prefetch")] == [(39.0, 2.0)] and bars[("device", "flush")] == [(42.0, 3.0)]
    assert lane_bars([{"subgroup": 0, "lane": "host", "adam": (0.001, 0.002)}])[0] == [(1.0, 1.0)]

    marks = {"backward_start": 10.0, "backward_end": 30.0, "step_start": 32.0, "end": 50.0}
    dos = {"label": "dos(auto)", "status": "ok", "iteration_timeline": {
        "iteration": 6, "marks_ms": marks, "update": {"start_ms": 40.0, "total_ms": 5.0, "lanes": "HD",
                                                      "device_fraction": 0.5, "events": events}}}
    vanilla = {"label": "zero3_offload", "status": "ok",
               "iteration_timeline": {"iteration": 6, "marks_ms": marks, "update": None}}
    failed = {"label": "dos(device)", "status": "oom", "iteration_timeline": None}
    assert [chart.timeline_rows(r) for r in (dos, vanilla)] == [3 + len(ROWS), 3]
    doc = {"config": {"model": "debug", "seq_len": 8, "micro_batch": 1, "precision": "32-true"},
           "hardware": {}, "date": "2026-01-01T00:00:00", "results": [vanilla, dos, failed]}
    path = chart.render_timeline(doc, tmp_path / "timeline.png")
    assert path is not None and path.read_bytes()[:8] == PNG_SIGNATURE
    assert chart.render_timeline({**doc, "results": [failed]}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_failed_repeat_marks_the_configuration() -> None:
    config = BenchConfig(steps=3, warmup=1, e2e_steps=0)
    spec = RunSpec("dos(auto)", "deep_optimizer_states", "auto")
    runs = [_raw("dos(auto)", "deep_optimizer_states", [9.0, 5.0, 7.0], [1.0, 1.0, 1.0]),
            {**spec.to_dict(), "repeat": 1, "status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}]
    result = aggregate(spec, runs, config, {"flops_per_token": 1.0})
    assert result["status"] == "oom" and result["reason"].startswith("repeat 2/2: OutOfMemoryError")
    assert result["iteration_ms"] == 6.0 and result["repeats_ok"] == 1


# --- failures -----------------------------------------------------------------------------------------------------


def test_exit_classification(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("loading\nRuntimeError: CUDA error: out of memory\n")
    assert classify_exit(1, False, 60, log)["status"] == "oom"
    assert classify_exit(-signal.SIGKILL, False, 60, log)["status"] == "oom"
    timeout = classify_exit(None, True, 60, log)
    assert timeout == {"status": "timeout", "reason": "no result within 60 s (raise --timeout)"}
    log.write_text("Traceback\nSegmentation fault\n")
    failed = classify_exit(-11, False, 60, log)
    assert failed["status"] == "failed" and "code -11" in failed["reason"]


def test_a_worker_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    spec = RunSpec("zero3_offload", "zero3_offload", 1.0)
    started = time.perf_counter()
    result = launch(BenchConfig(model="debug"), spec, tmp_path / "run", timeout_s=0.5)
    assert result["status"] == "timeout" and result["label"] == "zero3_offload"
    assert time.perf_counter() - started < 15  # the 0.5 s limit, then SIGTERM and its grace: not a hang
    assert (tmp_path / "run" / "config.json").is_file() and not (tmp_path / "run" / "result.json").exists()


def test_a_relative_run_directory_reaches_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker runs inside its run directory, so a relative --out must not be passed through as is."""
    monkeypatch.chdir(tmp_path)
    spec = RunSpec("zero3_offload", "zero3_offload", 1.0)
    result = launch(BenchConfig(model="no-such-preset"), spec, Path("runs") / "rel", timeout_s=120)
    # the worker read its config (else: "exited ... without a result") and reported the bad preset itself
    assert result["status"] == "failed" and "without a result" not in result["reason"], result["reason"]
    assert (tmp_path / "runs" / "rel" / "result.json").is_file()


def test_harness_reports_a_failed_configuration_and_runs_the_rest(tmp_path: Path) -> None:
    config = BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8, micro_batch=1, steps=3,
                         warmup=1, strategies=["zero3_offload", "deep_optimizer_states", "no_offload"],
                         plans=["host"])
    calls: list[str] = []

    def fake_launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        calls.append(spec.label)
        if spec.label == "dos(host)":
            return {**spec.to_dict(), "status": "failed", "reason": "RuntimeError: injected", "log": None}
        return {**_raw(spec.label, spec.strategy, [9.0, 5.0, 7.0], [2.0, 1.5, 1.0]), "plan": spec.plan}

    doc = run_bench(config, tmp_path, launcher=fake_launcher, progress=False)
    assert calls == ["zero3_offload", "dos(auto)", "dos(host)", "no_offload"]
    statuses = {r["label"]: r["status"] for r in doc["results"]}
    assert statuses == {"zero3_offload": "ok", "dos(auto)": "ok", "dos(host)": "failed", "no_offload": "ok"}
    report = (tmp_path / "report.md").read_text()
    assert "**dos(host)**: failed: RuntimeError: injected" in report
    assert (tmp_path / "chart.png").read_bytes()[:8] == PNG_SIGNATURE
    # no worker recorded a timeline (nor end times): no figure, no link, and the headline is not measured
    assert not (tmp_path / "iteration_timeline.png").exists() and "iteration_timeline" not in report
    assert "| zero3_offload | ok | – | – |" in report


def test_an_interrupted_bench_reports_what_ran(tmp_path: Path) -> None:
    config = BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8, micro_batch=1, steps=3,
                         warmup=1, strategies=["zero3_offload", "deep_optimizer_states"], plans=["host"])

    def interrupted_launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        if spec.label == "dos(auto)":
            raise KeyboardInterrupt
        return {**_raw(spec.label, spec.strategy, [9.0, 5.0, 7.0], [2.0, 1.5, 1.0]), "plan": spec.plan}

    doc = run_bench(config, tmp_path, launcher=interrupted_launcher, progress=False)
    assert doc["interrupted"]
    assert [(r["label"], r["status"]) for r in doc["results"]] == [
        ("zero3_offload", "ok"), ("dos(auto)", "skipped"), ("dos(host)", "skipped")]
    assert "The bench was interrupted" in (tmp_path / "report.md").read_text()


def test_sigterm_ends_the_bench_like_ctrl_c_and_the_report_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's time limit sends SIGTERM: the running configuration is reported as interrupted and the rest as not
    run, results.json and report.md are written, the exit status is 130, and the previous handler is restored."""
    import os

    import lightning_dos.bench.harness as harness

    real_run_bench = harness.run_bench

    def terminated_launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        if spec.label == "dos(auto)":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises in this frame long before
            raise AssertionError("SIGTERM was not turned into an interrupt")
        return {**_raw(spec.label, spec.strategy, [9.0, 5.0, 7.0], [2.0, 1.5, 1.0]), "plan": spec.plan}

    monkeypatch.setattr(harness, "run_bench", lambda config, out_dir, now=None, resume=False: real_run_bench(
        config, out_dir, launcher=terminated_launcher, progress=False, now=now, resume=resume))
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "bench"
    code = main([*TINY, "--strategies", "zero3_offload", "deep_optimizer_states", "--plans", "host",
                 "--out", str(out)])
    assert code == 130
    assert signal.getsignal(signal.SIGTERM) is before
    doc = json.loads((out / "results.json").read_text())
    assert doc["interrupted"]
    assert [(r["label"], r["status"]) for r in doc["results"]] == [
        ("zero3_offload", "ok"), ("dos(auto)", "skipped"), ("dos(host)", "skipped")]
    assert "The bench was interrupted" in (out / "report.md").read_text()
    assert "1/3 configurations completed" in capsys.readouterr().out


def test_resume_reuses_finished_configurations_with_the_same_settings(tmp_path: Path) -> None:
    """An interrupted bench is continued with --resume: what finished is reused (and said to be), the rest runs;
    a configuration measured under other settings (here: more steps) is run again."""
    config = BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8, micro_batch=1, steps=3,
                         warmup=1, strategies=["zero3_offload", "deep_optimizer_states"], plans=["host"])
    calls: list[str] = []

    def writing_launcher(stop_at: str | None):
        def launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
            calls.append(spec.label)
            if spec.label == stop_at:
                raise KeyboardInterrupt
            run_dir.mkdir(parents=True, exist_ok=True)  # what the real launcher and worker leave behind
            (run_dir / "config.json").write_text(json.dumps(payload(cfg, spec, run_dir)))
            result = {**_raw(spec.label, spec.strategy, [9.0, 5.0, 7.0], [2.0, 1.5, 1.0], end_s=[0.5, 0.75, 1.0]),
                      "plan": spec.plan}
            (run_dir / "result.json").write_text(json.dumps(result))
            return result
        return launcher

    first = run_bench(config, tmp_path, launcher=writing_launcher("dos(host)"), progress=False)
    assert first["interrupted"] and calls == ["zero3_offload", "dos(auto)", "dos(host)"]

    calls.clear()
    second = run_bench(config, tmp_path, launcher=writing_launcher(None), progress=False, resume=True)
    assert calls == ["dos(host)"]  # only what did not finish
    assert [(r["label"], r["status"]) for r in second["results"]] == [
        ("zero3_offload", "ok"), ("dos(auto)", "ok"), ("dos(host)", "ok")]
    assert second["reused"] == ["dos(auto)", "zero3_offload"] and not second["interrupted"]
    assert second["results"][0]["e2e_iteration_ms"] == 250.0  # iteration 2: 0.75 s - 0.5 s
    # a result measured before end times were recorded has no headline: it is run again
    run_dir = tmp_path / "runs" / "zero3_offload_r0"
    assert reusable(config, RunSpec("zero3_offload", "zero3_offload", 1.0), run_dir) is not None
    older = json.loads((run_dir / "result.json").read_text())
    del older["iterations"]["end_s"]
    (run_dir / "result.json").write_text(json.dumps(older))
    assert reusable(config, RunSpec("zero3_offload", "zero3_offload", 1.0), run_dir) is None
    (run_dir / "result.json").write_text(json.dumps({**older, "iterations": {**older["iterations"],
                                                                             "end_s": [0.5, 0.75, 1.0]}}))
    assert "**Resumed** (`--resume`)" in (tmp_path / "report.md").read_text()

    # interrupted again, in the middle: what finished after the interrupted configuration is still reused
    calls.clear()
    (tmp_path / "runs" / "dos_auto_r0" / "result.json").unlink()
    fourth = run_bench(config, tmp_path, launcher=writing_launcher("dos(auto)"), progress=False, resume=True)
    assert calls == ["dos(auto)"] and fourth["interrupted"]
    assert [(r["label"], r["status"]) for r in fourth["results"]] == [
        ("zero3_offload", "ok"), ("dos(auto)", "skipped"), ("dos(host)", "ok")]
    assert fourth["reused"] == ["dos(host)", "zero3_offload"]

    calls.clear()
    longer = BenchConfig(**{**config.to_dict(), "steps": 4})
    third = run_bench(longer, tmp_path, launcher=writing_launcher(None), progress=False, resume=True)
    assert calls == ["zero3_offload", "dos(auto)", "dos(host)"] and third["reused"] == []


def test_resume_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--resume"]) == 2
    assert "--resume: set --out" in capsys.readouterr().err


# --- data parallel ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["--devices", "0"], "devices: [0] must be integers >= 1"),
    (["--devices", "1", "2", "1"], "devices: [1] given more than once"),
    (["--devices", "two"], "argument --devices: invalid int value"),
    (["--sweep", "--devices", "1", "2"], "the plan sweep runs at one device count: give --devices N once"),
])
def test_bad_devices_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, *argv]) == 2
    assert message in capsys.readouterr().err


def test_devices_default_to_one_and_come_from_flags_or_a_config_file(tmp_path: Path) -> None:
    assert parse_args(TINY).config.devices == [1]
    assert parse_args([*TINY, "--devices", "1", "2"]).config.devices == [1, 2]
    assert parse_args([*TINY, "--sweep", "--devices", "1"]).sweep is not None  # one device: the sweep's own
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"devices": [2, 4]}))
    assert parse_args(["--config", str(path)]).config.devices == [2, 4]
    path.write_text(json.dumps({"devices": 2}))
    with pytest.raises(ValueError, match=r"devices: 2; give one or more device counts, e.g. --devices 1 2"):
        BenchConfig(devices=2).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"devices: \[True\] must be integers >= 1"):
        BenchConfig(devices=[True]).validate()


def test_every_configuration_runs_at_each_device_count_with_its_label() -> None:
    config = BenchConfig(strategies=["zero3_offload", "deep_optimizer_states", "plain", "torchao_offload",
                                     "fsdp_offload"], plans=["host"], devices=[1, 2])
    specs = expand(config)
    assert [(s.label, s.devices) for s in specs] == [
        ("zero3_offload", 1), ("dos(auto)", 1), ("dos(host)", 1), ("plain", 1), ("torchao_offload", 1),
        ("fsdp_offload", 1), ("zero3_offload@dp2", 2), ("dos(auto)@dp2", 2), ("dos(host)@dp2", 2), ("plain@dp2", 2),
        ("torchao_offload@dp2", 2), ("fsdp_offload@dp2", 2)]
    assert [s.label for s in expand(BenchConfig(strategies=["zero3_offload"]))] == ["zero3_offload"]  # as before
    assert RunSpec("dos(auto)", "deep_optimizer_states", "auto").devices == 1
    assert [base_label(s.label) for s in specs[6:8]] == ["zero3_offload", "dos(auto)"]
    assert base_label("dos(host,device)") == "dos(host,device)" and specs[7].slug == "dos_auto__dp2"
    # the single-GPU peers are skipped at two devices; fsdp_offload, the multi-GPU peer, runs there
    assert [single_device_reason(s) is not None for s in specs] == [False] * 9 + [True] * 2 + [False]
    assert at_devices(specs[0], 1) == specs[0]


def test_single_gpu_kinds_get_a_skipped_row_at_several_devices(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8, micro_batch=1, steps=3,
                         warmup=1, strategies=["zero3_offload", "plain", "torchao_offload"], devices=[1, 2])
    calls: list[str] = []

    def fake_launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        calls.append(spec.label)
        return {**_raw(spec.label, spec.strategy, [9.0, 5.0, 7.0], [2.0, 1.5, 1.0]), "plan": spec.plan,
                "devices": spec.devices}

    doc = run_bench(config, tmp_path, launcher=fake_launcher, progress=False)
    assert calls == ["zero3_offload", "plain", "torchao_offload", "zero3_offload@dp2"]
    skipped = {r["label"]: r for r in doc["results"] if r["status"] == "skipped"}
    assert set(skipped) == {"plain@dp2", "torchao_offload@dp2"}
    assert all(r["reason"].startswith("single-GPU only") and r["devices"] == 2 for r in skipped.values())
    assert "- **plain@dp2**: skipped: single-GPU only" in (tmp_path / "report.md").read_text()
    # --dry-run names them too
    assert main([*TINY, "--devices", "1", "2", "--strategies", "zero3_offload", "plain", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "4 configurations x 1 repeat(s), device counts 1, 2:" in printed
    assert "plain@dp2" in printed and "devices=2  (skipped: single-GPU only" in printed
    # on a GPU host, a count above its GPUs is skipped with the reason
    gpu = BenchConfig(accelerator="gpu", devices=[1, 4])  # resolved: the accelerator is known
    four = RunSpec("zero3_offload@dp4", "zero3_offload", 1.0, devices=4)
    assert devices_skip_reason(four, gpu, {"gpu_count": 2}) == "needs 4 GPUs; this host has 2 (set --devices to at " \
                                                              "most 2)"
    assert devices_skip_reason(four, gpu, {"gpu_count": 8}) is None
    assert no_offload_skip_reason(BenchConfig(accelerator="auto"), {"no_offload_state_gib_lower_bound": 41.7,
                                                                    "params": 1}, {"gpu_count": 2,
                                                                                   "gpu_memory_gib": 22.0},
                                  devices=2) is None  # sharded: 20.9 each


def _rank(rank: int, iteration: list[float], losses: list[float], host: float, gpu: float | None,
          end_s: list[float]) -> dict[str, Any]:
    """One rank's raw measurements, as a worker's ``per_rank`` entry."""
    return {"rank": rank, "iterations": {"iteration_ms": iteration, "loss": losses, "end_s": end_s},
            "peak_host_gib": host, "peak_gpu_gib": gpu, "peak_gpu_reserved_gib": None if gpu is None else gpu + 1,
            "dos": None, "iteration_timeline": None}


def _dp_raw(label: str, strategy: str, plan: Any, devices: int, iteration: list[float], end_s: list[float],
            gpu: float | None = None) -> dict[str, Any]:
    """A raw result at ``devices`` with hand-made ranks: rank r's iterations ``iteration`` + r, its host peak 1 + r."""
    raw = _raw(label, strategy, iteration, [3.0, 2.0, 1.0], end_s=end_s)
    ranks = [_rank(r, [x + r for x in iteration], [3.0 + r, 2.0, 1.0], 1.0 + r, None if gpu is None else gpu + r,
                   end_s) for r in range(devices)]
    return {**raw, "plan": plan, "devices": devices, "per_rank": ranks, "peak_host_gib": 1.0,
            "peak_gpu_gib": gpu}


def test_results_compare_at_the_same_device_count_and_scale() -> None:
    """Hand-made results at 1 and 2 devices: tokens count every rank, host peaks add up, GPU peaks take the largest
    rank, each row is compared with vanilla at its own device count; the scaling section and the claims."""
    config = BenchConfig(steps=3, warmup=1, e2e_steps=1, micro_batch=2, seq_len=8, devices=[1, 2])
    model = {"flops_per_token": 1.0}
    nan = float("nan")
    specs = {(label, devices): at_devices(RunSpec(label, strategy, plan), devices)
             for label, strategy, plan in (("zero3_offload", "zero3_offload", 1.0),
                                           ("dos(auto)", "deep_optimizer_states", "auto"),
                                           ("static_split(0.5)", "static_split", 0.5)) for devices in (1, 2)}
    # (label, devices): synchronised iteration (ms, iteration 3) and end-to-end iteration (s, iteration 2)
    figures = {("zero3_offload", 1): (40.0, 0.040), ("dos(auto)", 1): (20.0, 0.020),
               ("static_split(0.5)", 1): (30.0, 0.030), ("zero3_offload", 2): (60.0, 0.060),
               ("dos(auto)", 2): (32.0, 0.032), ("static_split(0.5)", 2): (40.0, 0.040)}
    gpu = {"zero3_offload": 4.0, "dos(auto)": 6.0, "static_split(0.5)": 9.0}
    results = []
    for (label, devices), spec in specs.items():
        sync, e2e = figures[(label, devices)]
        raw = _dp_raw(spec.label, spec.strategy, spec.plan, devices, [99.0, nan, sync], [1.0, 1.0 + e2e, 2.0],
                      gpu=gpu[label])
        results.append(aggregate(spec, [raw], config, model))
    results.sort(key=lambda r: r["devices"])
    base = compare_to_baseline(results)
    assert base is not None and base["label"] == "zero3_offload"
    by_label = {r["label"]: r for r in results}
    dos1, dos2 = by_label["dos(auto)"], by_label["dos(auto)@dp2"]
    assert (dos1["tokens_per_iteration"], dos2["tokens_per_iteration"]) == (16, 32)
    assert dos2["e2e_tokens_per_s"] == pytest.approx(32 / 0.032) and dos2["tokens_per_s"] == pytest.approx(32 / 0.032)
    assert dos2["iteration_ms"] == 32.0  # rank 0's
    assert [rank["iteration_ms"] for rank in dos2["per_rank"]] == [32.0, 33.0]
    assert dos2["per_rank"][1]["e2e_samples"] == pytest.approx([32.0])
    assert (dos2["peak_host_gib"], dos2["peak_host_gib_per_rank"]) == (3.0, [1.0, 2.0])  # summed over the ranks
    assert (dos2["peak_gpu_gib"], dos2["peak_gpu_reserved_gib"]) == (7.0, 8.0)  # the largest rank's
    assert (dos1["peak_host_gib"], dos1["peak_gpu_gib"]) == (1.0, 6.0)
    # each against vanilla at its own device count
    assert dos1["speedup_vs_zero3_offload"]["e2e_iteration"] == pytest.approx(2.0)
    assert dos2["speedup_vs_zero3_offload"]["e2e_iteration"] == pytest.approx(60 / 32)
    assert dos2["speedup_vs_zero3_offload"]["iteration"] == pytest.approx(60 / 32)
    assert by_label["zero3_offload@dp2"]["speedup_vs_zero3_offload"]["iteration"] == 1.0

    section = scaling(results)
    assert section is not None and section["reference_devices"] == 1 and section["device_counts"] == [1, 2]
    rows = {row["label"]: row for row in section["rows"]}
    assert list(rows) == ["zero3_offload", "dos(auto)", "static_split(0.5)"]
    assert rows["dos(auto)"]["speedup_e2e"] == pytest.approx({"reference": 2.0, "at_n": 60 / 32,
                                                              "ratio": 60 / 32 / 2.0})
    assert rows["dos(auto)"]["e2e_tokens_per_s"] == pytest.approx({"reference": 16 / 0.020, "at_n": 32 / 0.032,
                                                                   "ratio": (32 / 0.032) / (16 / 0.020)})
    assert scaling([dos1, by_label["zero3_offload"]]) is None  # one device count: no section

    claims = {c["claim"]: c for c in check_claims(results)}
    kept = claims["DOS/zero3_offload ratio at DP=2 vs DP=1"]
    assert kept["value"] == pytest.approx(0.9375) and kept["status"] == "met"
    assert kept["threshold"] == ">= 0.9 x the DP=1 ratio"
    assert kept["detail"] == "dos(auto) 1.88x zero3_offload at DP=2, 2.00x at DP=1 (end to end)"
    split = claims["dos(auto) vs static_split 0.5 at DP=2 at lower peak GPU memory"]
    assert split["value"] == pytest.approx(40 / 32) and split["status"] == "met"  # 7 GiB against the split's 10
    # the single-device claims still come from the single-device rows
    assert claims[E2E_CLAIM]["value"] == pytest.approx(2.0)
    # a DOS at two devices that kept too little of its advantage misses; without vanilla at 1 it is not measured
    slow = {**dos2, "e2e_iteration_ms": 40.0}
    missed = {c["claim"]: c for c in check_claims([*(r for r in results if r is not dos2), slow])}
    assert missed["DOS/zero3_offload ratio at DP=2 vs DP=1"]["status"] == "missed"
    partial = {c["claim"]: c for c in check_claims([r for r in results if r["label"] != "zero3_offload"])}
    assert partial["DOS/zero3_offload ratio at DP=2 vs DP=1"]["status"] == "not measured"
    # results of one device count have no data-parallel claim at all (reports from before --devices unchanged)
    assert not [c for c in check_claims([r for r in results if r["devices"] == 1]) if "DP=" in c["claim"]]


def test_the_report_and_the_rank_timelines_of_a_data_parallel_bench(tmp_path: Path) -> None:
    config = BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8, micro_batch=1, steps=3,
                         warmup=1, e2e_steps=1, strategies=["zero3_offload", "deep_optimizer_states"], devices=[1, 2])
    marks = {"backward_start": 10.0, "backward_end": 30.0, "step_start": 32.0, "end": 50.0}
    events = [{"subgroup": 0, "lane": "host", "adam": [0.0, 3.0]},
              {"subgroup": 1, "lane": "device", "adam": [0.0, 2.0]}]

    def fake_launcher(cfg: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        raw = _dp_raw(spec.label, spec.strategy, spec.plan, spec.devices, [9.0, float("nan"), 7.0], [1.0, 1.1, 2.0])
        for rank in raw["per_rank"]:
            rank["iteration_timeline"] = {"iteration": 3, "started_s": 100.0 + rank["rank"] * 0.002, "marks_ms": marks,
                                          "update": {"start_ms": 40.0, "total_ms": 3.0, "lanes": "HD",
                                                     "device_fraction": 0.5, "events": events}}
        return raw

    doc = run_bench(config, tmp_path, launcher=fake_launcher, progress=False)
    assert [r["label"] for r in doc["scaling"]["rows"]] == ["zero3_offload", "dos(auto)"]
    assert chart.rank_timeline_row(doc)["label"] == "dos(auto)@dp2"
    png = tmp_path / "rank_timelines.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    report = (tmp_path / "report.md").read_text()
    assert "## Data parallel" in report and "](rank_timelines.png)" in report
    assert "| dos(auto) | 2 | 1.00x | 1.00x | 1.00x |" in report  # the scaling table: at 1, at N, kept
    assert "| dos(auto)@dp2 | 1 | 100.0 | 8.0 | 2.00 |" in report  # rank 1's own figures
    from lightning_dos.bench.markdown import hardware_lines

    gpus = "\n".join(hardware_lines({"gpu_count": 2, "gpu_name": "H200"}, [1, 2]))
    assert "2 x H200; each configuration uses 1 and 2 (--devices)" in gpus
    # one device count: no section, no figure, no link
    single = BenchConfig(**{**config.to_dict(), "devices": [1], "out": str(tmp_path / "one")})
    doc = run_bench(single, tmp_path / "one", launcher=fake_launcher, progress=False)
    assert "scaling" not in doc and not (tmp_path / "one" / "rank_timelines.png").exists()
    assert "## Data parallel" not in (tmp_path / "one" / "report.md").read_text()


def test_a_failing_rank_is_reported_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails before training (injected at its start-up): Lightning stops rank 0, and the configuration is
    reported with rank 1's first error line, at once, with no process left behind."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('LOCAL_RANK') == '1':\n"
        "    import lightning_dos.bench.compose as compose\n\n"
        "    def build(args, callbacks=(), instantiate_trainer=True):\n"
        "        raise RuntimeError('injected: rank 1 cannot build its model\\nsecond line')\n\n"
        "    compose.build = build\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]))
    config = parse_args([*TINY, "--accelerator", "cpu"]).config
    spec = at_devices(RunSpec("dos(auto)", "deep_optimizer_states", "auto"), 2)
    result = launch(config, spec, tmp_path / "run", timeout_s=300)
    assert result["status"] == "failed", result
    assert result["reason"] == "rank 1: RuntimeError: injected: rank 1 cannot build its model"
    assert not (tmp_path / "run" / "result.json").exists()
    assert not _workers_of(tmp_path / "run")
    assert rank_failure([{"rank": 2, "status": "oom", "reason": "OutOfMemoryError: x"}, {"rank": 3, "reason": "y"}]) \
        == {"status": "oom", "reason": "rank 2: OutOfMemoryError: x (also failed: rank 3)"}
    assert rank_failure([]) is None
