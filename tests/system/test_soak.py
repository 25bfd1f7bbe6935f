"""The soak script (scripts/soak.py): its mechanics on the CPU, in 30 steps; the 2,000-step run is for a GPU host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"
soak = load_script("soak")


def test_slope_is_per_1000_steps_past_the_warmup() -> None:
    values = [100.0] * 5 + [2.0 + 0.003 * step for step in range(5, 50)]  # a jump in the warm-up, then a leak
    assert soak.slope_per_1000(values, warmup=5) == pytest.approx(3.0)
    assert soak.slope_per_1000([1.0] * 20, warmup=0) == pytest.approx(0.0)
    assert soak.slope_per_1000([None, None, 1.0], warmup=0) is None  # one point: no slope


def test_soak_runs_both_strategies_and_reports_slopes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's parent here, its three runs each in a fresh process as it starts them."""
    out = tmp_path / "soak"
    arguments = ["--steps", "30", "--warmup", "5", "--model", "debug", "--seq-len", "32", "--micro-batch", "2",
                 "--vocab-size", "512", "--sub-group-size", "20000", "--precision", "32-true", "--accelerator", "cpu",
                 "--lr", "0.01", "--out", str(out)]
    assert soak.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "| dos-random-plan | 30 |" in printed and "| dos-random-plan-overlap | 30 |" in printed
    assert "loss, dos-random-plan-overlap vs vanilla over 30 steps" in printed
    summary = json.loads((out / "soak.json").read_text())
    dos, overlapped, vanilla = (summary["runs"][label] for label in ("dos-random-plan", "dos-random-plan-overlap",
                                                                      "vanilla"))
    assert dos["steps"] == overlapped["steps"] == vanilla["steps"] == 30
    for run in (dos, overlapped):  # the plan really changed nearly every step
        assert run["distinct_plans"] >= 10 and run["plan_changes"] >= 20
    for run in (dos, overlapped, vanilla):
        assert run["rss_gib"]["slope_per_1000_steps"] is not None and run["rss_gib"]["first"] > 0
        assert run["os_threads"]["last"] <= run["os_threads"]["first"]  # no thread left behind (others come and go)
        assert run["python_threads"]["first"] == run["python_threads"]["last"]
        assert run["gpu_reserved_gib"]["slope_per_1000_steps"] is None  # no GPU here: not measured, not zero
    # fp32 on the CPU: the random plans train exactly like vanilla
    for label in ("dos-random-plan", "dos-random-plan-overlap"):
        loss = summary["loss"][label]
        assert loss["steps_compared"] == 30 and loss["max_rel_diff"] <= 1e-4
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the analysis alone redraws from the runs already there
    (out / "soak.json").unlink()
    assert soak.main([*arguments, "--analyse-only"]) == 0 and json.loads((out / "soak.json").read_text()) == summary
