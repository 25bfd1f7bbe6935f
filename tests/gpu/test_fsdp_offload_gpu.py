"""GPU tier (``pytest -m gpu`` on a GPU host): the peer ``fsdp_offload`` trains a small GPT on one and on two GPUs.

Each run is ``tests/support/scripts/fsdp_offload_run.py`` in its own process (Lightning starts the second rank by
running it again), with the model's own activation checkpointing on; the reference is the same model trained with torch
AdamW and no FSDP (``plain``) on one GPU over the same global batches, in this process. At ``32-true`` the two are the
same
arithmetic up to rounding: the gradients summed across ranks in another order, AdamW fused on the host instead of on
the GPU, and the block's forward recomputed in the backward; after 6 steps at a learning rate of 1e-2 that leaves the
losses and the weights within ``FP32_TOL`` (relative) of the reference, while a missing weight decay (6 steps of
``lr x 0.1`` shrinkage of every matrix, about 4e-3 of its norm) or a step lost would be 10x that and more. Both runs
build the model on the CPU from the same seed (``fsdp_offload_run.TinyGPT``), so they start from the same weights.
The two-GPU run needs a host with at least two GPUs and fails, saying so, on a host with one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.parity import rel, subprocess_env  # noqa: E402
from tests.support.script_loader import SUPPORT_SCRIPTS, load_script  # noqa: E402

run_script = load_script("fsdp_offload_run", SUPPORT_SCRIPTS)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

SCRIPT = Path(run_script.__file__)
#: fp32 against torch AdamW without FSDP: rounding only (see the module's docstring)
FP32_TOL = 1e-4
#: bf16-mixed against plain's bf16-mixed, losses only: FSDP computes with bf16 copies of every parameter (norms too)
#: and reduces the gradients in bf16, where autocast keeps norms and reductions in fp32: the same training, not the
#: same rounding (AdamW turns the rounding of a near-zero gradient into a whole step of either sign, so the weights
#: are not compared element for element)
BF16_TOL = 5e-2


def _fsdp_offload(tmp_path: Path, devices: int, precision: str = "32-true") -> tuple[list[dict[str, Any]], dict]:
    """Every rank's facts and rank 0's whole weights of one ``fsdp_offload`` run, checkpointing on."""
    out = tmp_path / f"fsdp_offload_{devices}_{precision}"
    proc = subprocess.run([sys.executable, str(SCRIPT), "fsdp_offload", str(devices), precision, "1", str(out)],
                          env=subprocess_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    return ranks, torch.load(out / "weights.pt")


def _plain(precision: str) -> tuple[list[float], dict]:
    """The reference: torch AdamW, no FSDP, one GPU, no checkpointing, over the same global batches."""
    trainer, module, losses = run_script.train("plain", 1, precision, checkpointing=False)
    assert type(trainer.optimizers[0]) is torch.optim.AdamW
    return losses.losses, run_script.full_weights(trainer, module)


@pytest.fixture(scope="module")
def plain_fp32() -> tuple[list[float], dict]:
    return _plain("32-true")


def _assert_offloaded(ranks: list[dict[str, Any]], devices: int) -> None:
    """Every rank ran FSDP as configured: a unit per block plus the root, parameters and AdamW state on the host,
    fused torch AdamW, weight decay on exactly the matrices."""
    assert [r["rank"] for r in ranks] == list(range(devices))
    for r in ranks:
        assert r["world_size"] == devices
        assert (r["optimizer"], r["fused"]) == ("AdamW", True)
        assert (r["units"], r["block_units"]) == (4, 3) and r["offload_params"] is True
        # torch runs FULL_SHARD as NO_SHARD at one rank
        assert r["sharding"] == ("FULL_SHARD" if devices > 1 else "NO_SHARD")
        assert r["param_devices"] == ["cpu"] and r["state_devices"] == ["cpu"]
        decay, no_decay = r["groups"]
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
        assert decay["params"] == r["matrices"] and len(decay["params"]) == 3 * 4 + 2  # 4 per block, wte, lm_head
        assert not set(decay["params"]) & set(no_decay["params"]) and no_decay["params"]
        assert len(r["losses"]) == run_script.STEPS and all(torch.isfinite(torch.tensor(r["losses"])))


def _assert_tracks(ranks: list[dict[str, Any]], weights: dict, reference: tuple[list[float], dict], tol: float,
                   compare_weights: bool = True) -> None:
    losses, expected = reference
    mean = [sum(step) / len(step) for step in zip(*(r["losses"] for r in ranks))]  # the global batch's loss
    rels = [abs(a - b) / abs(b) for a, b in zip(mean, losses)]
    assert set(weights) == set(expected)
    worst = max((rel(weights[name], expected[name]), name) for name in expected)
    print(f"largest relative differences from plain: loss {max(rels):.2e}, weights {worst[0]:.2e} ({worst[1]})")
    assert len(mean) == len(losses) and max(rels) <= tol, f"relative loss differences {rels}"
    if compare_weights:
        assert worst[0] <= tol, f"weights differ by {worst[0]:.2e} (relative) in {worst[1]}"
    assert mean[-1] < mean[0] and losses[-1] < losses[0]  # both trained


def test_fsdp_offload_on_one_gpu_trains_like_torch_adamw(tmp_path: Path, plain_fp32: tuple) -> None:
    ranks, weights = _fsdp_offload(tmp_path, 1)
    _assert_offloaded(ranks, 1)
    _assert_tracks(ranks, weights, plain_fp32, FP32_TOL)


@pytest.mark.gpus2
def test_fsdp_offload_on_two_gpus_trains_like_torch_adamw(tmp_path: Path, plain_fp32: tuple) -> None:
    count = torch.cuda.device_count()
    assert count >= 2, f"fsdp_offload at two ranks needs 2 CUDA GPUs, this host has {count}: run on a multi-GPU host"
    ranks, weights = _fsdp_offload(tmp_path, 2)
    _assert_offloaded(ranks, 2)
    for r in ranks:  # sharded: each parameter a 1-D view of this rank's shard, yet the matrices still decay
        assert r["param_dims"] == [1]
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank its own half of the batch
    _assert_tracks(ranks, weights, plain_fp32, FP32_TOL)


@pytest.mark.gpus2
def test_fsdp_offload_bf16_mixed_on_two_gpus(tmp_path: Path) -> None:
    count = torch.cuda.device_count()
    assert count >= 2, f"fsdp_offload at two ranks needs 2 CUDA GPUs, this host has {count}: run on a multi-GPU host"
    ranks, weights = _fsdp_offload(tmp_path, 2, "bf16-mixed")
    _assert_offloaded(ranks, 2)
    assert all(v.dtype == torch.float32 for v in weights.values())  # fp32 weights on the host
    _assert_tracks(ranks, weights, _plain("bf16-mixed"), BF16_TOL, compare_weights=False)
