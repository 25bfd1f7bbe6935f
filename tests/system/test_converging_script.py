"""scripts/converging.py end to end: its three fits of the debug recipe, each ``lightning-dos fit`` in a fresh process,
and the distances between their loss curves (the analysis alone: tests/unit/test_converging.py; the committed GPU
runs' figures against docs/converging.md: tests/unit/test_committed_reports.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.script_loader import load_script

converging = load_script("converging")


def test_three_runs_of_the_debug_recipe_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe's relative log folders land here
    recipe = Path(converging.ROOT) / "recipes" / "debug.yaml"
    assert converging.main(["--recipe", str(recipe), "--out", str(tmp_path / "conv"), "--trainer.max_steps", "3"]) == 0
    summary = json.loads((tmp_path / "conv" / "converging.json").read_text())
    # fp32 on the CPU: vanilla is reproducible, and DOS (plan auto) follows it to rounding
    assert summary["train/loss"]["vanilla_vs_vanilla"]["max"] == 0.0
    assert summary["train/loss"]["dos_vs_vanilla"]["steps"] == 3
    assert summary["train/loss"]["dos_vs_vanilla"]["max"] < 1e-4
