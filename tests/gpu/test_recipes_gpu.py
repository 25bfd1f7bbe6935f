"""GPU tier: every recipe trains on a GPU for a few steps with validation, as a user launches it.

Each recipe runs in a fresh ``lightning-dos fit --config`` process from a copy of its YAML with tiny overrides (a
few steps, each logged, validation every 2 steps on 2 batches, logs and checkpoints in a temporary folder); everything
else is the recipe's own: its model, data module, tokenizer, strategy, precision and callbacks. The 124M recipe also
saves sharded checkpoints and resumes from ``--ckpt_path last``.

``DOS_RECIPE_STEPS=full`` runs each recipe at its own length, validation and checkpoint intervals instead (what its
header's Measured line reports), and ``DOS_RECIPE_RESULTS=file.jsonl`` appends each run's figures there
(:func:`recipe_run.summary`). A checkpoint is saved only where the disk holds two of them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lightning_dos.models.gpt import GPTConfig, num_params  # noqa: E402
from lightning_dos.models.hf import hf_num_params  # noqa: E402
from tests.support.recipe_run import ON_A_GPU, ROOT, finite, fit, metrics, recipe_copy, series, summary  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
#: Bytes a sharded DOS checkpoint takes per parameter (fp32 master, Adam m and v, bf16 weights).
CHECKPOINT_BYTES_PER_PARAM = 14
STEPS = 3
FULL = os.environ.get("DOS_RECIPE_STEPS") == "full"


def _overrides(recipe: Path, out: Path) -> Path:
    config = yaml.safe_load(recipe.read_text())
    trainer = config["trainer"]
    steps = trainer["max_steps"] if FULL else STEPS
    validates = trainer.get("limit_val_batches", 1.0) != 0
    extra = dict(val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=1) if validates and not FULL else {}
    # checkpoints where the disk holds two of them (the largest recipes' do not fit a 64 GB disk)
    room = shutil.disk_usage(out.parent).free > 2.5 * CHECKPOINT_BYTES_PER_PARAM * _num_params(config)
    return recipe_copy(recipe, out, max_steps=steps, every_n_train_steps=None if FULL else 2, checkpoints=room,
                       log_every_n_steps=1, **extra)


def _num_params(config: dict) -> int:
    """Parameters of a recipe's model: a GPT preset's, or a Hugging Face model's (``model.class_path``)."""
    model = config["model"]
    if "class_path" in model:
        args, data = model["init_args"], config["data"]["init_args"]
        return hf_num_params(args.get("model_type", "llama"), args["config"], data["bpe_vocab_size"], data["seq_len"])
    return num_params(GPTConfig.from_name(model["name"]))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_on_a_gpu(recipe: Path, tmp_path: Path) -> None:
    config = _overrides(recipe, tmp_path / recipe.stem)
    start = time.perf_counter()
    result = fit(config, *ON_A_GPU.get(recipe.stem, ()), timeout=900)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-6000:]
    name = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]["name"]
    rows = metrics(config.parent, name)
    if os.environ.get("DOS_RECIPE_RESULTS"):
        with open(os.environ["DOS_RECIPE_RESULTS"], "a") as handle:
            report = [line for line in result.stdout.splitlines() if line.startswith("validation loss:")]
            handle.write(json.dumps({"recipe": recipe.stem, "wall_s": round(seconds, 1), **summary(rows),
                                     "report": report[-1] if report else None}) + "\n")
    assert finite(series(rows, "train/loss"))
    if yaml.safe_load(recipe.read_text())["trainer"].get("limit_val_batches", 1.0) != 0:
        assert finite(series(rows, "val/loss")), "validation did not run on the GPU"
    assert finite(series(rows, "dos/update_ms"))
    assert finite(series(rows, "dos/free_device_gib"))  # logged only when the device lane runs on CUDA
    # overlap's default on one GPU: said at start-up, and every phase logged (the last one joined at the end)
    assert "each update phase overlaps the next forward" in result.stdout + result.stderr
    if not FULL:
        assert len(series(rows, "dos/update_ms")) == STEPS
    # a copy that kept the recipe's ModelCheckpoint saved through it; removed so the next recipe finds the disk free
    callbacks = yaml.safe_load(config.read_text())["trainer"].get("callbacks") or []
    if any(c["class_path"].endswith("ModelCheckpoint") for c in callbacks):
        assert (config.parent / "checkpoints" / "last.ckpt").exists()
    shutil.rmtree(config.parent / "checkpoints", ignore_errors=True)


def test_gpt2_124m_resumes_from_last_on_a_gpu(tmp_path: Path) -> None:
    recipe = ROOT / "recipes" / "gpt2-124m.yaml"
    config = recipe_copy(recipe, tmp_path, max_steps=4, every_n_train_steps=2, val_check_interval=2,
                         limit_val_batches=2, num_sanity_val_steps=0, log_every_n_steps=1)
    result = fit(config, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").resolve().name == "step=4.ckpt"
    config = recipe_copy(recipe, tmp_path, max_steps=6, every_n_train_steps=2, val_check_interval=2,
                         limit_val_batches=2, num_sanity_val_steps=0, log_every_n_steps=1)
    result = fit(config, "--ckpt_path", "last", timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "resumed the plan state" in result.stdout + result.stderr
    assert sorted(series(metrics(tmp_path, "gpt2-124m"), "train/loss")) == [4, 5]
    assert (tmp_path / "checkpoints" / "last.ckpt").resolve().name == "step=6.ckpt"
