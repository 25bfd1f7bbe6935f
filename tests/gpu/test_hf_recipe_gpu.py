"""GPU tier: the Hugging Face Llama 1B recipe under DOS and under vanilla ZeRO-3 offload, as a user launches both.

``recipes/hf-llama-1b.yaml`` (a ``transformers`` LlamaForCausalLM of llama-1b's shape whose module returns
``torch.optim.AdamW``) runs twice in fresh ``lightning-dos fit --config`` processes, ``STEPS`` steps each with one
validation at the end and no checkpoint: as written (DOS, ``plan: auto``) and with
``--config configs/strategy/zero3_offload.yaml`` (DeepSpeed's own ZeRO-3 offload of the same torch AdamW). Each run's
figures (median iteration time and tokens/s after 3 warm-up steps, DOS's update phase, peak GPU and host memory, the
losses) are printed and, with ``DOS_RECIPE_RESULTS=file.jsonl``, appended there: they are the figures
docs/recipes.md reports. ``DOS_HF_STEPS`` changes the number of steps (default 20).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.recipe_run import ROOT, finite, fit, metrics, recipe_copy, series, summary  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

RECIPE = ROOT / "recipes" / "hf-llama-1b.yaml"
STEPS = int(os.environ.get("DOS_HF_STEPS", "20"))
VANILLA = ROOT / "configs" / "strategy" / "zero3_offload.yaml"


def _run(out: Path, *extra: str) -> tuple[dict, list[dict[str, str]], str]:
    config = recipe_copy(RECIPE, out, max_steps=STEPS, checkpoints=False, val_check_interval=STEPS,
                         limit_val_batches=2, num_sanity_val_steps=0, log_every_n_steps=1)
    result = fit(config, *extra, timeout=1800)
    assert result.returncode == 0, result.stderr[-6000:]
    rows = metrics(out, "hf-llama-1b")
    return summary(rows), rows, result.stdout + result.stderr


def test_hf_llama_1b_dos_against_vanilla_zero3_offload(tmp_path: Path) -> None:
    dos, dos_rows, dos_output = _run(tmp_path / "dos")
    vanilla, vanilla_rows, _ = _run(tmp_path / "vanilla", "--config", str(VANILLA))
    for name, figures in (("deep_optimizer_states", dos), ("zero3_offload", vanilla)):
        print(f"hf-llama-1b {name}: {json.dumps(figures)}")
        if os.environ.get("DOS_RECIPE_RESULTS"):
            with open(os.environ["DOS_RECIPE_RESULTS"], "a") as handle:
                handle.write(json.dumps({"recipe": "hf-llama-1b", "strategy": name, "steps": STEPS, **figures}) + "\n")
    # both trained the same model on the same batches from the same weights
    for rows in (dos_rows, vanilla_rows):
        assert len(series(rows, "train/loss")) == STEPS and finite(series(rows, "train/loss"))
        assert finite(series(rows, "val/loss"))
    first_dos, first_vanilla = (series(rows, "train/loss")[0] for rows in (dos_rows, vanilla_rows))
    assert abs(first_dos - first_vanilla) <= 1e-3 * first_vanilla
    assert abs(dos["train_loss_last"] - vanilla["train_loss_last"]) <= 0.05 * vanilla["train_loss_last"]
    # DOS took torch's AdamW into its interleaved update, found the decoder layers, and ran faster than vanilla
    assert "ZeRO-3 hooks 22 blocks as leaves" in dos_output
    assert finite(series(dos_rows, "dos/update_ms"))
    assert dos["iteration_ms"] < vanilla["iteration_ms"], f"DOS {dos['iteration_ms']} ms vs {vanilla['iteration_ms']}"
