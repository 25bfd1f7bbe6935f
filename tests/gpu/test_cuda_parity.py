"""GPU tier (``pytest -m gpu`` on a GPU host): the same parity as the CPU tier, with real CUDA streams.

The device lane here is the real one: pinned host state, prefetch/adam/flush streams ordered by events,
fused AdamW on the GPU, 16-bit params written on the GPU. The control run is DeepSpeed's own ZeRO-3
optimizer offload in the same process.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parity import rel, train  # noqa: E402

from lightning_dos.planning.plan import Lane, Plan  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

CLIP = 0.05
RANDOM_LIST = ["device", "host", "host", "device", "device"]


@pytest.fixture(scope="module")
def vanilla() -> dict[str, object]:
    return {
        "fp32": train(None, steps=8, clip=CLIP, accelerator="cuda"),
        "acc2": train(None, steps=6, accumulate=2, clip=CLIP, accelerator="cuda"),
    }


@pytest.mark.parametrize("plan", ["host", "device", 0.5, "stride:2", "stride:3", RANDOM_LIST], ids=str)
def test_cuda_fp32_parity(plan: object, vanilla: dict[str, object]) -> None:
    ref = vanilla["fp32"]
    run = train(plan, steps=8, clip=CLIP, accelerator="cuda")
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert rel(run.masters, ref.masters) <= 1e-5
    opt = run.strategy.model.optimizer
    # state lives in pinned host memory; 16-bit params on the GPU
    assert opt.fp32_partitioned_groups_flat[0].is_pinned()
    assert opt.optimizer.state[opt.fp32_partitioned_groups_flat[0]]["exp_avg"].is_pinned()
    assert opt.fp16_partitioned_groups_flat[0].is_cuda


def test_cuda_accumulation_parity(vanilla: dict[str, object]) -> None:
    ref = vanilla["acc2"]
    run = train(0.5, steps=6, accumulate=2, clip=CLIP, accelerator="cuda")
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert rel(run.masters, ref.masters) <= 1e-5


class RandomPlanEveryStep(pl.Callback):
    def __init__(self, seed: int = 11) -> None:
        self.rng = random.Random(seed)
        self.plans: set[str] = set()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, idx: int) -> None:
        manager = trainer.strategy.manager
        lanes = tuple(self.rng.choice([Lane.HOST, Lane.DEVICE]) for _ in manager.sizes)
        manager.set_plan(Plan(lanes=lanes, buffers=self.rng.choice([1, 2, 3]), source="random"))
        self.plans.add("".join(lane.letter for lane in lanes))


def test_200_steps_random_plan_every_step_bf16() -> None:
    ref = train(None, steps=200, precision="bf16-mixed", clip=CLIP, accelerator="cuda")
    cb = RandomPlanEveryStep()
    run = train("host", steps=200, precision="bf16-mixed", clip=CLIP, accelerator="cuda", every_step=cb)
    assert len(cb.plans) > 20
    diffs = [abs(a - b) for a, b in zip(run.losses, ref.losses)]
    assert len(diffs) == 200
    assert max(diffs) <= 1e-2, f"max loss difference {max(diffs)} at step {diffs.index(max(diffs))}"
    # it trains: on uniformly random tokens the floor is ln(vocab) = ln(97) = 4.575
    assert run.losses[-1] < run.losses[0] - 0.2 and run.losses[-1] < 4.7
    assert rel(run.masters, ref.masters) <= 1e-2


def test_200_steps_random_plan_every_step_fp32() -> None:
    ref = train(None, steps=200, clip=CLIP, accelerator="cuda")
    cb = RandomPlanEveryStep(seed=3)
    run = train("host", steps=200, clip=CLIP, accelerator="cuda", every_step=cb)
    rels = [abs(a - b) / abs(b) for a, b in zip(run.losses, ref.losses)]
    assert max(rels) <= 1e-4, f"max relative loss difference {max(rels)}"
    assert rel(run.masters, ref.masters) <= 1e-4
