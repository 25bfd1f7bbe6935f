"""recipes/hf-debug.yaml through ``lightning-dos fit``: the command line trains a Hugging Face ``transformers`` model
under DOS (in this process: tests/system/test_cli.py runs the CLI in a fresh one; the module alone:
tests/integration/test_hf_model.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dos.strategies import torch_optimizers
from tests.support.recipe_run import ROOT, finite, fit_here, metrics, recipe_copy, series

RECIPE = ROOT / "recipes" / "hf-debug.yaml"

# the run passes its arguments while pytest's own sit in sys.argv
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_the_hf_recipe_trains_through_lightning_dos_fit(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU tier's run of recipes/hf-debug.yaml (the recipe as written but for where its logs go): torch's AdamW
    taken, both lanes, the decoder layers hooked as leaves, validation."""
    config = recipe_copy(RECIPE, tmp_path, max_steps=yaml.safe_load(RECIPE.read_text())["trainer"]["max_steps"])
    taken: list[type] = []
    adopt = torch_optimizers.adopt_optimizer

    def watched(optimizer: torch.optim.Optimizer, *args: object, **kwargs: object) -> object:
        taken.append(type(optimizer))
        return adopt(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch_optimizers, "adopt_optimizer", watched)
    with caplog.at_level(logging.INFO):
        fit_here(config)
    assert taken == [torch.optim.AdamW]  # the module's own optimizer, taken by the strategy once
    assert "ZeRO-3 hooks 2 blocks as leaves" in caplog.text
    assert "plan fraction:0.5" in caplog.text and "on device" in caplog.text
    rows = metrics(tmp_path, "hf-debug")
    assert len(series(rows, "train/loss")) == 4 and finite(series(rows, "train/loss"))
    assert finite(series(rows, "val/loss")) and finite(series(rows, "dos/update_ms"))
    lrs = series(rows, "train/lr")
    assert len(set(lrs.values())) == len(lrs) > 1  # the user's warm-up + cosine schedule drives the engine's optimizer
