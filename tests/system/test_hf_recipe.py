"""recipes/hf-debug.yaml as a user launches it: ``lightning-dos fit`` in a fresh process trains a Hugging Face
``transformers`` model under DOS (the module in-process: tests/integration/test_hf_model.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.recipe_run import ROOT, finite, metrics, recipe_copy, series
from tests.support.recipe_run import fit as fit_recipe

RECIPE = ROOT / "recipes" / "hf-debug.yaml"


def test_the_hf_recipe_trains_through_lightning_dos_fit(tmp_path: Path) -> None:
    """The CPU tier's run of recipes/hf-debug.yaml as a user launches it (a fresh process, the recipe as written but
    for where its logs go): torch's AdamW taken, both lanes, the decoder layers hooked as leaves, validation."""
    config = recipe_copy(RECIPE, tmp_path, max_steps=yaml.safe_load(RECIPE.read_text())["trainer"]["max_steps"])
    result = fit_recipe(config, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    output = result.stdout + result.stderr
    assert "ZeRO-3 hooks 2 blocks as leaves" in output
    assert "plan fraction:0.5" in output and "on device" in output
    rows = metrics(tmp_path, "hf-debug")
    assert len(series(rows, "train/loss")) == 4 and finite(series(rows, "train/loss"))
    assert finite(series(rows, "val/loss")) and finite(series(rows, "dos/update_ms"))
    lrs = series(rows, "train/lr")
    assert len(set(lrs.values())) == len(lrs) > 1  # the user's warm-up + cosine schedule drives the engine's optimizer
