"""GPU tier (``pytest -m gpu`` on a GPU host): the faults the CPU tier can only stand in for.

- fp16 overflow with dynamic loss scaling: an infinite gradient in one step skips its update on both lanes, leaves
  every subgroup's state bit for bit unchanged, lowers the loss scale, and training goes on as vanilla's does.
- GPU memory pressure: a ballast allocation that leaves less than the device lane needs, taken after backward and
  before the update phase, demotes the device lane to the host for that step (no OOM), the event is in
  ``dos/demoted_subgroups``, and the plan comes back once the ballast is freed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lightning_dos.update.manager import SAFETY_MARGIN_BYTES  # noqa: E402
from tests.support.overflow import INF_AT, InfGradAt, StateAround  # noqa: E402
from tests.support.parity import make_strategy, train  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]


class _LossScale(pl.Callback):
    """The ZeRO optimizer's loss scale after every step, and which steps it skipped."""

    def __init__(self) -> None:
        self.scales: list[float] = []
        self.skipped: list[bool] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        opt = trainer.strategy.model.optimizer
        self.scales.append(float(opt.loss_scale))
        self.skipped.append(bool(opt.overflow))


def _fp16(plan: Any, every_step: Any) -> Any:
    # hysteresis 1: the first overflow lowers the scale (Lightning's default, 2, lowers it at the second in a row)
    return train(plan, steps=6, precision="16-mixed", clip=1.0, model=InfGradAt(), accelerator="cuda",
                 strategy=make_strategy(plan, hysteresis=1), every_step=every_step)


def test_fp16_overflow_skips_both_lanes_and_lowers_the_scale() -> None:
    around, scale, ref_scale = StateAround(), _LossScale(), _LossScale()
    run = _fp16(0.5, [around, scale])
    ref = _fp16(None, ref_scale)
    assert scale.skipped[INF_AT] and scale.skipped == ref_scale.skipped
    assert scale.scales[INF_AT] < scale.scales[INF_AT - 1] and scale.scales == ref_scale.scales
    for b, a in zip(around.before[INF_AT], around.after[INF_AT]):
        assert all(torch.equal(x, y) for x, y in zip(b, a))
    assert {"H", "D"} <= set(around.lanes[-1])
    assert len(run.losses) == 6 and all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(run.losses, ref.losses))


class _Ballast(pl.Callback):
    """After the backward of update phase ``at``, takes all the device memory the manager would count as free but
    ``leave`` bytes above its safety margin; frees it after that step."""

    def __init__(self, at: int, leave: int) -> None:
        self.at, self.leave = at, leave
        self.ballast: torch.Tensor | None = None
        self.metrics: list[dict[str, float]] = []

    def on_after_backward(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.global_step != self.at:
            return
        manager = trainer.strategy.manager
        free = manager.free_device_bytes()
        self.ballast = torch.empty(max(0, free - SAFETY_MARGIN_BYTES - self.leave), dtype=torch.uint8,
                                   device=trainer.strategy.root_device)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.ballast = None
        self.metrics.append(trainer.strategy.manager.metrics())


def test_a_ballast_before_the_update_demotes_the_device_lane_and_the_plan_recovers() -> None:
    ballast = _Ballast(at=2, leave=1024)  # far less than one subgroup's buffer slot
    run = train(0.5, steps=5, clip=0.05, accelerator="cuda", every_step=ballast)
    ref = train(None, steps=5, clip=0.05, accelerator="cuda")
    records = run.strategy.manager.records
    planned = set(records[0].plan.device_subgroups())
    assert planned and set(records[2].demoted) == planned and not records[2].plan.device_subgroups()
    assert [m["dos/demoted_subgroups"] for m in ballast.metrics] == [
        float(len(planned)) if k == 2 else 0.0 for k in range(5)]
    assert set(records[3].plan.device_subgroups()) == planned  # the ballast is gone: the plan is back
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(run.losses, ref.losses))
