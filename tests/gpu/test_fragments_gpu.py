"""GPU tier: every strategy fragment trains on a GPU as its header tells a user to launch it.

Each ``configs/strategy/*.yaml`` names, in its header, the ``lightning-dos fit`` command that tries it on a recipe.
That command runs here in a fresh process for a few steps (the recipe copied with tiny overrides, as the recipes tier
does), with the recipe's own settings otherwise: its precision on a GPU and its ``gradient_clip_val``, which is where
a peer's optimizer meets Lightning's checks (``plain``'s fused AdamW under ``bf16-mixed`` clipping was refused there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.recipe_run import ON_A_GPU, ROOT, finite, fit, fragment_recipe, metrics, recipe_copy, series  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

FRAGMENTS = sorted((ROOT / "configs" / "strategy").glob("*.yaml"))
STEPS = 3


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_fragment_trains_on_a_gpu(fragment: Path, tmp_path: Path) -> None:
    recipe = fragment_recipe(fragment)
    assert recipe is not None, f"{fragment.name} names no command"  # tests/unit/test_recipes.py checks it too
    config = recipe_copy(recipe, tmp_path / fragment.stem, max_steps=STEPS, checkpoints=False, log_every_n_steps=1,
                         limit_val_batches=0)
    result = fit(config, "--config", str(fragment), *ON_A_GPU.get(recipe.stem, ()), timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    name = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]["name"]
    losses = series(metrics(config.parent, name), "train/loss")
    assert finite(losses) and len(losses) == STEPS
