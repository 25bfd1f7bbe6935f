"""scripts/converging.py: the distances between the loss curves of its three runs, on hand-made logs (the script end
to end: tests/system/test_converging_script.py; the committed GPU runs: tests/unit/test_committed_reports.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.support.script_loader import load_script

converging = load_script("converging")


def _write_run(out: Path, label: str, train: dict[int, float], val: dict[int, float]) -> None:
    folder = out / label / "version_0"
    folder.mkdir(parents=True)
    with open(folder / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train/loss", "val/loss"])
        writer.writeheader()
        for step in sorted(set(train) | set(val)):
            writer.writerow({"step": step, "train/loss": train.get(step, ""), "val/loss": val.get(step, "")})


def test_distances_between_runs_and_the_control(tmp_path: Path) -> None:
    steps = range(8)
    _write_run(tmp_path, "vanilla", {s: 10.0 - s for s in steps}, {3: 7.5, 7: 3.5})
    _write_run(tmp_path, "vanilla-control", {s: 10.0 - s + 0.01 for s in steps}, {3: 7.5, 7: 3.52})
    _write_run(tmp_path, "dos-auto", {s: 10.0 - s + 0.001 * s for s in steps}, {3: 7.49, 7: 3.5})
    summary = converging.analyse(tmp_path)
    train = summary["train/loss"]
    assert train["dos_vs_vanilla"]["max"] == pytest.approx(0.007)
    assert train["dos_vs_vanilla"]["mean"] == pytest.approx(0.0035)
    assert train["vanilla_vs_vanilla"]["max"] == pytest.approx(0.01)
    assert [w["steps"] for w in train["dos_vs_vanilla"]["windows"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert summary["val/loss"]["vanilla_vs_vanilla"]["max"] == pytest.approx(0.02)
    assert summary["final"]["dos-auto"]["train/loss"] == pytest.approx(3.007)
    assert (tmp_path / "converging.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "converging.json").read_text())["train/loss"]["dos_vs_vanilla"]["steps"] == 8
    assert "| train/loss | DOS vs vanilla | 8 | 7.00e-03 |" in converging.table(summary)


def test_a_missing_run_is_named(tmp_path: Path) -> None:
    _write_run(tmp_path, "vanilla", {0: 1.0}, {})
    with pytest.raises(FileNotFoundError, match="no run 'dos-auto'"):
        converging.analyse(tmp_path)


