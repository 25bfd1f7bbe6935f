"""GPU tier: ZeRO-3 hooking each block once (``leaf_blocks``, DOS's default on one device) on real CUDA streams.

The control is DeepSpeed's own ZeRO-3 offload with its hooks on every layer, in the same process; DOS runs the same
blocks as leaves, with and without the overlapped update, under activation checkpointing, clipping and an lr that
changes every step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.blocks_model import BLOCKS, BlockLM, block_layers_hooked  # noqa: E402
from tests.support.parity import make_strategy, rel, train  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

CLIP = 0.05
STEPS = 30


@pytest.fixture(scope="module")
def vanilla() -> object:
    return train(None, steps=STEPS, clip=CLIP, accelerator="cuda", model=BlockLM())


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_cuda_leaf_blocks_track_vanilla(overlap: bool, vanilla: object) -> None:
    run = train(0.5, steps=STEPS, clip=CLIP, accelerator="cuda", model=BlockLM(),
                strategy=make_strategy(0.5, overlap=overlap))
    assert block_layers_hooked(vanilla.strategy.lightning_module) == [True] * BLOCKS
    assert block_layers_hooked(run.strategy.lightning_module) == [False] * BLOCKS
    for step, (a, b) in enumerate(zip(run.losses, vanilla.losses)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: loss {a} vs vanilla {b}"
    assert rel(run.masters, vanilla.masters) <= 1e-5
