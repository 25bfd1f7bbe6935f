"""``scripts/profile_phase.py`` end to end on the CPU: a tiny GPT, windows of the last iteration profiled.

The script runs in its own process, as on a GPU host, with the same tiny model settings as the bench's CPU tests:
once under DOS profiling the forward, the backward and the step together (each window's tests read that run), once
under ``plain``.
It must write the summary, the operator table and the gzipped Chrome trace, and report a positive time for the
phase; under DOS the backward shows the per-parameter gradient work (the norms taken on the way from backward to the
optimizer). ``plain`` (no ZeRO) runs too, with no ZeRO-3 settings to report. The analysis of CUDA events, which a
CPU run cannot produce, is checked on a fake profile.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_dos.zero.cpu_adam_nogil import PROFILE_NAME
from tests.support.parity import subprocess_env
from tests.support.script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "profile_phase.py"
TINY = ["--model", "debug", "--n-layer", "2", "--n-embd", "64", "--vocab-size", "512", "--seq-len", "32",
        "--micro-batch", "2", "--steps", "3", "--precision", "32-true", "--accelerator", "cpu",
        "--sub-group-size", "40000"]


def _run(out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The script on the tiny model with ``flags``, writing under ``out``."""
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, *flags, "--out", str(out)], env=subprocess_env(),
                          cwd=out.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _phase(out: Path) -> dict[str, Any]:
    """What one profiled window left in ``out``: the summary (returned), the operator table, the gzipped trace."""
    for name in ("summary.json", "ops_by_self_cpu.txt", "trace.json.gz"):
        assert (out / name).is_file(), name
    assert not (out / "ops_by_self_device.txt").exists()  # no CUDA here
    trace = json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
    assert trace["traceEvents"]
    assert "Self CPU" in (out / "ops_by_self_cpu.txt").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["files"] == ["summary.json", "ops_by_self_cpu.txt", "trace.json.gz"]
    assert summary["phase_ms"] > 0
    assert len(summary["phase_ms_unprofiled"]) == 2 and all(ms > 0 for ms in summary["phase_ms_unprofiled"])
    analysis = summary["analysis"]
    assert set(analysis["sync_calls"]) == {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                           "cudaMemcpy", "cudaStreamWaitEvent"}
    assert analysis["kernel_launches"] == 0 and analysis["device_busy_ms"] == 0.0  # CPU only
    assert analysis["device_idle_ms"] is None  # no device events at all
    return summary


def _printed_ms(printed: str, row: str) -> float:
    line = next(line for line in printed.splitlines() if row in line)
    return float(line.split()[-2])


@pytest.fixture(scope="module")
def dos_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One run under DOS, plan 0.5 (both lanes), profiling three windows of the last iteration, each into its own
    folder, with ``--dos`` reaching the strategy: what it printed, and its output directory."""
    out = tmp_path_factory.mktemp("dos_profile") / "profile"
    proc = _run(out, "--strategy", "dos", "--plan", "0.5", "--phase", "forward", "backward", "step",
                "--dos", "leaf_blocks=false")
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["backward", "forward", "step"]
    assert (out / "config.yaml").is_file()  # what the run was built from
    return proc.stdout, out


def test_profile_backward_on_cpu(dos_profile: tuple[str, Path]) -> None:
    printed, out = dos_profile
    summary = _phase(out / "backward")
    assert summary["label"] == "dos(0.5)" and summary["plan"] == "0.5"
    assert summary["phase"] == "backward" and summary["window"] == "on_before_backward -> on_after_backward"
    assert summary["zero3_in_effect"]["max_param_reduce_events"] >= 1  # read back from DOS's ZeRO-3 optimizer
    # offloaded optimizer state: each parameter's gradient norm is taken during backward
    counts = summary["analysis"]["op_counts"]
    assert counts["aten::linalg_vector_norm"] + counts["aten::_foreach_norm"] >= 1

    assert "\nbackward profile: dos(0.5) on cpu" in "\n" + printed
    assert "backward (profiled)" in printed and "kernel launches" in printed
    assert _printed_ms(printed, "backward (profiled)") > 0


def test_profile_forward_on_cpu(dos_profile: tuple[str, Path]) -> None:
    """``--phase forward``: the window from the batch's start to ``on_before_backward`` (forward and loss); with
    other windows each gets its own folder, and ``--dos`` reaches the strategy."""
    printed, out = dos_profile
    summary, step = _phase(out / "forward"), _phase(out / "step")
    assert summary["dos_arguments"] == step["dos_arguments"] == {"leaf_blocks": False}
    assert summary["devices"] == 1 and summary["rank"] == 0
    assert summary["label"] == "dos(0.5)"
    assert summary["phase"] == "forward" and summary["window"] == "on_train_batch_start -> on_before_backward"
    assert "backward_ms" not in summary

    assert "\nforward profile: dos(0.5) on cpu" in "\n" + printed
    assert "forward (profiled)" in printed and "step (profiled)" in printed
    assert _printed_ms(printed, "forward (profiled)") > 0


def test_profile_plain_on_cpu(tmp_path: Path) -> None:
    """``--strategy plain``: no ZeRO, no DeepSpeed config, no ZeRO-3 optimizer to read back; ``--plan`` ignored; only
    the window asked for is profiled, into the output directory itself."""
    proc = _run(tmp_path / "profile", "--strategy", "plain", "--phase", "backward", "--plan", "host")
    summary = _phase(tmp_path / "profile")
    assert summary["label"] == "plain" and summary["strategy"] == "plain" and summary["plan"] is None
    assert summary["config"]["args"] == {} and summary["config"]["fragment"] == "plain"
    assert summary["phase"] == "backward"
    assert summary["zero3_in_effect"] is None and summary["zero_optimization"] is None
    assert _printed_ms(proc.stdout, "backward (profiled)") > 0
    assert "forward (profiled)" not in proc.stdout and "step (profiled)" not in proc.stdout


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-reduce-events", "4"], "--max-reduce-events: plain has no ZeRO-3 optimizer"),
    (["--zero", "reduce_bucket_size=5e8"], "--zero: plain has no DeepSpeed config"),
])
def test_plain_refuses_zero3_flags(tmp_path: Path, flags: list[str], message: str) -> None:
    """The ZeRO-3 knobs are refused under plain before anything is built."""
    script = load_script("profile_phase")
    with pytest.raises(SystemExit, match=message):
        script.main([*TINY, "--strategy", "plain", *flags, "--out", str(tmp_path / "profile")])
    assert not (tmp_path / "profile").exists()


def test_bench_run_plan_for_dos_only() -> None:
    """``--plan`` reaches the bench's run (its label, its plan, its strategy arguments) under dos only."""
    script = load_script("profile_phase")
    parser = script.build_parser()
    expected = {"dos": ("dos(0.5)", "0.5", 0.5), "plain": ("plain", None, None),
                "no_offload": ("no_offload", None, None), "zero3_offload": ("zero3_offload", 1.0, None)}
    assert set(expected) == set(script.STRATEGY_KINDS)
    for strategy, (label, plan, argument) in expected.items():
        args = parser.parse_args([*TINY, "--strategy", strategy, "--plan", "0.5", "--out", "unused"])
        spec = script.bench_run(args)
        assert (spec.label, spec.plan, spec.args.get("plan")) == (label, plan, argument), strategy
        assert spec.strategy == script.STRATEGY_KINDS[strategy] and spec.sets["model.name"] == "debug"
    assert parser.parse_args([*TINY, "--out", "unused"]).phase == ["backward"]
    with pytest.raises(SystemExit, match="--dos: only the dos strategy"):
        script.main([*TINY, "--strategy", "plain", "--dos", "resident_gib=0", "--out", "unused"])


def _event(name: str, start: float, end: float, device: bool = False, stream: int = 0,
           parent: Any = None) -> SimpleNamespace:
    from torch.autograd import DeviceType

    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_parent=parent, stack=[],
                           device_type=DeviceType.CUDA if device else DeviceType.CPU, device_resource_id=stream)


def test_analysis_of_cuda_events() -> None:
    """A faked GPU profile: sync calls and their issuers, launches, copies, busy and idle time per stream."""
    script = load_script("profile_phase")
    op = _event("aten::_local_scalar_dense", 0, 50)
    events = [
        op,
        _event("cudaStreamSynchronize", 10, 40, parent=op),
        _event("cudaEventSynchronize_v3020", 60, 160),
        _event("cudaMemcpy", 170, 180),
        _event("cudaMemcpyAsync", 180, 181),
        *[_event("cudaLaunchKernel", 200 + i, 201 + i) for i in range(5)],
        _event("aten::linalg_vector_norm", 300, 310),
        _event("gemm_kernel", 0, 1000, device=True, stream=7),  # us
        _event("gemm_kernel", 3000, 4000, device=True, stream=7),
        _event("norm_kernel", 500, 1500, device=True, stream=13),
        _event("Memcpy DtoH (Device -> Pinned)", 1500, 2500, device=True, stream=13),
    ]
    result = script.analyse(events, window_ms=5.0)
    sync = result["sync_calls"]
    assert sync["cudaStreamSynchronize"]["count"] == 1
    assert sync["cudaStreamSynchronize"]["total_ms"] == pytest.approx(0.03)
    assert list(sync["cudaStreamSynchronize"]["issuers"]) == ["aten::_local_scalar_dense"]
    assert sync["cudaEventSynchronize"]["count"] == 1  # CUPTI's version suffix is dropped
    assert sync["cudaMemcpy"]["count"] == 1 and result["other_runtime_calls"]["cudaMemcpyAsync"]["count"] == 1
    assert result["kernel_launches"] == 5
    assert result["op_counts"]["aten::linalg_vector_norm"] == 1
    assert result["device_work"]["kernel"]["count"] == 3
    assert result["device_work"]["memcpy Device -> Pinned"]["count"] == 1
    assert result["device_busy_ms"] == pytest.approx(3.5)  # [0, 2.5] and [3, 4] ms
    assert result["device_idle_ms"] == pytest.approx(1.5)
    streams = result["streams"]
    assert list(streams) == ["7", "13"]  # busiest first
    assert streams["7"] == {"kernels": 2, "busy_ms": pytest.approx(2.0), "gaps_over_0.5ms": 1,
                            "gap_ms_total": pytest.approx(2.0)}


def test_profile_step_on_cpu(dos_profile: tuple[str, Path]) -> None:
    """``--phase step``: the window from ``on_before_optimizer_step`` to the batch's end, the update phase."""
    printed, out = dos_profile
    summary = _phase(out / "step")
    assert summary["phase"] == "step" and summary["window"] == "on_before_optimizer_step -> on_train_batch_end"
    assert _printed_ms(printed, "step (profiled)") > 0
    # the update ran inside the window: the host lane's CPU Adam is among the profiled operators
    assert PROFILE_NAME in (out / "step" / "ops_by_self_cpu.txt").read_text()
