"""``lightning-dos bench compare`` with real worker processes on the CPU, a tiny GPT over the default recipe.

One comparison of vanilla ZeRO-3 offload and DOS under two fixed plans and a lane list of the wrong length (which must
fail in its worker and not stop the others), then the same command with ``--resume``: what completed is reused, the
failure is run again. One at one and two gloo ranks. Then the processes' edges: a worker past its time limit, a rank
that fails, SIGTERM during a run.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from lightning_dos.bench import main
from lightning_dos.bench.compose import payload
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.rows import Row, make_run
from tests.support.bench import PNG_SIGNATURE, TINY, WINDOWS, raw, rows_file
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
DOS = {"fragment": "dos_auto", "strategy": "deep_optimizer_states"}
RESULT_KEYS = {"label", "strategy", "plan", "status", "reason", "fwd_ms", "bwd_ms", "step_ms", "iteration_ms",
               "spread", "tokens_per_s", "tflops_per_s", "peak_gpu_gib", "peak_gpu_reserved_gib", "peak_host_gib",
               "host_in_use_gib", "final_loss", "losses", "dos", "runs", "speedup_vs_zero3_offload",
               "loss_vs_zero3_offload", "e2e_iteration_ms", "e2e_tokens_per_s", "e2e_measured_iterations",
               "iteration_timeline", "strategy_config", "strategy_args", "per_rank"}


def _workers_of(out: Path) -> list[Any]:
    """Processes still running a worker of the bench in ``out`` (none once the bench has returned)."""
    import psutil

    return [proc for proc in psutil.process_iter(["cmdline"])
            if "lightning_dos.bench.worker" in " ".join(proc.info.get("cmdline") or []) and str(out) in
            " ".join(proc.info.get("cmdline") or [])]


def test_compare_end_to_end_on_cpu_and_resumed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = rows_file(tmp_path / "rows.yaml", {
        "zero3_offload": {"fragment": "zero3_offload"},
        "dos(host)": {**DOS, "set": {"trainer.strategy.init_args.plan": "host"}},
        "dos(device)": {**DOS, "set": {"trainer.strategy.init_args.plan": "device"}},
        "dos(host,device)": {**DOS, "set": {"trainer.strategy.init_args.plan": ["host", "device"]}}})
    out = tmp_path / "bench"
    argv = ["compare", "--set", *TINY, *WINDOWS, "--rows", str(rows), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[1/4] zero3_offload: ok" in printed and "dos(host,device): FAILED" in printed
    assert "3/4 runs completed" in printed

    doc = json.loads((out / "results.json").read_text())
    assert doc["hardware"]["bench_device"]["type"] == "cpu" and doc["config"]["recipe"] == "recipes/gpt-2.7b.yaml"
    assert (doc["config"]["model"], doc["config"]["seq_len"], doc["config"]["micro_batch"]) == ("gpt-2.7b", 32, 2)
    assert (doc["measurement"]["e2e_iterations"], doc["measurement"]["phase_iterations"]) == ([2], [3, 4])
    by_label = {r["label"]: r for r in doc["results"]}
    assert list(by_label) == ["zero3_offload", "dos(host)", "dos(device)", "dos(host,device)"]
    failed = by_label.pop("dos(host,device)")
    assert failed["status"] == "failed" and "plan" in failed["reason"] and "subgroups" in failed["reason"]
    base = by_label["zero3_offload"]
    assert (base["plan"], base["strategy_args"], base["dos"]) == (1.0, {"sub_group_size": 40000}, None)
    for label, result in by_label.items():
        assert RESULT_KEYS <= set(result) and result["status"] == "ok", (label, result.get("reason"))
        run = json.loads((out / result["runs"][0]["log"]).with_name("result.json").read_text())
        # the headline: iteration 2, unsynchronised, from the end times; its phases were not timed
        assert [run["iterations"][phase][1] for phase in ("fwd_ms", "iteration_ms")] == [None, None]
        assert result["e2e_iteration_ms"] == pytest.approx((run["iterations"]["end_s"][1]
                                                            - run["iterations"]["end_s"][0]) * 1e3)
        assert result["e2e_tokens_per_s"] == pytest.approx(64 / (result["e2e_iteration_ms"] / 1e3))
        assert result["spread"]["iteration_ms"]["n"] == 2 and result["iteration_ms"] >= result["fwd_ms"] > 0
        assert 0.05 < result["peak_host_gib"] < 24 and result["peak_gpu_gib"] is None  # no GPU here
        assert result["host_in_use_gib"] is not None and run["host_in_use_before_gib"] > 0
        assert len(result["losses"]) == 4 and math.isfinite(result["final_loss"])
        assert result["iteration_timeline"]["iteration"] == 4
    for plan, fraction in (("host", 0.0), ("device", 1.0)):
        dos = by_label[f"dos({plan})"]
        assert (dos["strategy"], dos["plan"], dos["strategy_args"]) == (
            "deep_optimizer_states", plan, {"sub_group_size": 40000, "plan": plan})
        assert dos["dos"]["device_fraction"] == fraction and dos["dos"]["update_phases"] == 2
        assert dos["loss_vs_zero3_offload"]["max_abs_diff"] < 1e-4  # fp32 on the CPU: trains as vanilla
        update = dos["iteration_timeline"]["update"]
        assert update["lanes"] == ("H" if plan == "host" else "D") * dos["dos"]["subgroups"] and update["events"]
    assert "claims" not in doc and TARGETS.check_claims(doc["results"])[0]["value"] > 0
    report = (out / "report.md").read_text()
    for text in ("# lightning-dos bench compare: gpt-2.7b", "## End to end (what a user sees)",
                 "| dos(host,device) | failed |", "## DOS update phase", "](chart.png)"):
        assert text in report, text
    assert (out / "chart.png").read_bytes()[:8] == PNG_SIGNATURE

    # again, with --resume: the completed runs are reused, the failed one is run again
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "[1/4] zero3_offload (reused): ok" in printed and "[4/4] dos(host,device): FAILED" in printed
    again = json.loads((out / "results.json").read_text())
    assert again["reused"] == ["dos(device)", "dos(host)", "zero3_offload"]
    assert again["results"][0]["e2e_iteration_ms"] == base["e2e_iteration_ms"]


def test_compare_data_parallel_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--devices 1 2`` on gloo CPU ranks: every row at one and two devices; rank 0 reports every rank; vanilla is
    compared at the same device count; a single-device row is skipped at two; fsdp_offload fails with its reason."""
    out = tmp_path / "dp"
    assert main(["--set", *TINY, *WINDOWS, "--devices", "1", "2", "--only", "zero3_offload", "dos(auto)", "plain",
                 "fsdp_offload", "--out", str(out)]) == 0
    assert "plain@dp2: SKIPPED: single-GPU only" in capsys.readouterr().out
    assert not _workers_of(out)  # rank 0 waited for its ranks
    doc = json.loads((out / "results.json").read_text())
    by_label = {r["label"]: r for r in doc["results"]}
    assert list(by_label) == ["zero3_offload", "dos(auto)", "plain", "fsdp_offload", "zero3_offload@dp2",
                              "dos(auto)@dp2", "plain@dp2", "fsdp_offload@dp2"]
    assert by_label["fsdp_offload@dp2"]["reason"].startswith(
        "MisconfigurationException: accelerator: fsdp_offload needs a CUDA GPU, got device cpu")
    for label in ("zero3_offload@dp2", "dos(auto)@dp2"):
        result = by_label[label]
        assert result["status"] == "ok" and result["tokens_per_iteration"] == 128, result["reason"]
        ranks = result["per_rank"]
        assert [rank["rank"] for rank in ranks] == [0, 1] and result["iteration_ms"] == ranks[0]["iteration_ms"]
        assert result["peak_host_gib"] == pytest.approx(sum(rank["peak_host_gib"] for rank in ranks))
    dos, vanilla = by_label["dos(auto)@dp2"], by_label["zero3_offload@dp2"]
    for dos_rank, vanilla_rank in zip(dos["per_rank"], vanilla["per_rank"]):  # fp32: DOS trains as vanilla, per rank
        assert max(abs(a - b) for a, b in zip(dos_rank["losses"], vanilla_rank["losses"])) < 1e-4
        assert dos_rank["dos"]["active"] and len(dos_rank["dos"]["update_ms_per_step"]) == 2
    assert dos["per_rank"][0]["losses"] != dos["per_rank"][1]["losses"]  # each rank its own batches
    assert dos["speedup_vs_zero3_offload"]["e2e_iteration"] == pytest.approx(
        vanilla["e2e_iteration_ms"] / dos["e2e_iteration_ms"])
    rows = {row["label"]: row for row in doc["scaling"]["rows"]}
    assert set(rows) == {"zero3_offload", "dos(auto)"}
    assert "## Data parallel" in (out / "report.md").read_text()


def test_a_worker_past_its_timeout_is_stopped_and_reported(tmp_path: Path) -> None:
    run = make_run(Row("zero3_offload", "zero3_offload", "zero3_offload"), [], steps=4, warmup=1)
    result = launch(payload("recipes/gpt-2.7b.yaml", run, tmp_path / "run"), tmp_path / "run", timeout_s=0.5)
    assert result["status"] == "timeout" and result["reason"] == "no result within 0.5 s (raise --timeout)"
    assert (tmp_path / "run" / "config.json").is_file() and not (tmp_path / "run" / "result.json").exists()
    assert not _workers_of(tmp_path / "run")


def test_a_process_the_worker_leaves_behind_is_gone_when_the_run_returns(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process the worker started (a peer's optimizer process) outlives it: the run returns only once nothing of
    the worker's process group lives, so the next run's reading of the host's memory before it starts is clean."""
    import psutil

    inject, left = tmp_path / "inject", tmp_path / "left.pid"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, subprocess, sys\n"
        "if not os.environ.get('LEFT_BEHIND'):  # the worker only, not the process it starts\n"
        "    os.environ['LEFT_BEHIND'] = '1'\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"    open({str(left)!r}, 'w').write(str(child.pid))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]))
    sets = [tuple(text.split("=", 1)) for text in TINY]
    run = make_run(Row("zero3_offload", "zero3_offload", "zero3_offload"), sets, steps=2, warmup=1)
    result = launch(payload("recipes/gpt-2.7b.yaml", run, tmp_path / "run"), tmp_path / "run", timeout_s=300)
    assert result["status"] == "ok", result
    child = int(left.read_text())
    gone = not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    if not gone:
        psutil.Process(child).kill()  # not left sleeping on the machine after a failure
    assert gone


def test_a_failing_rank_is_reported_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails before training (injected at its start-up): Lightning stops rank 0, and the run is reported with
    rank 1's first error line, with no process left behind."""
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
    sets = [tuple(text.split("=", 1)) for text in TINY]
    run = make_run(Row("dos(auto)", "dos_auto", "deep_optimizer_states"), sets, devices=2, steps=4, warmup=1)
    result = launch(payload("recipes/gpt-2.7b.yaml", run, tmp_path / "run"), tmp_path / "run", timeout_s=300)
    assert result["status"] == "failed", result
    assert result["reason"] == "rank 1: RuntimeError: injected: rank 1 cannot build its model"
    assert not _workers_of(tmp_path / "run")


def test_sigterm_ends_the_study_like_ctrl_c_and_the_outputs_are_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A job's time limit sends SIGTERM: the running run is reported as interrupted and the rest as not run, the
    outputs are written, the exit status is 130, and the previous handler is restored."""
    import threading

    from lightning_dos.bench import runner

    def terminated(wanted: dict[str, Any], run_dir: Path, timeout_s: float) -> dict[str, Any]:
        spec = wanted["run"]
        if spec["label"] == "dos(auto)":
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait()  # the handler raises in this frame
        return raw(spec["label"], spec["strategy"], [9.0, 5.0, 7.0, 6.0], [2.0, 1.5, 1.0, 0.5])

    monkeypatch.setattr(runner, "launch", terminated)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "bench"
    assert main(["--set", *TINY, *WINDOWS, "--only", "zero3_offload", "dos(auto)", "plain", "--out", str(out)]) == 130
    assert signal.getsignal(signal.SIGTERM) is before
    doc = json.loads((out / "results.json").read_text())
    assert doc["interrupted"] and [(r["label"], r["status"]) for r in doc["results"]] == [
        ("zero3_offload", "ok"), ("dos(auto)", "skipped"), ("plain", "skipped")]
    assert "**Interrupted**" in (out / "report.md").read_text()
    assert "1/2 runs completed" in capsys.readouterr().out
    image = matplotlib.image.imread(out / "chart.png")
    assert image.shape[0] > 200
