"""An inf gradient skips the whole update on both lanes, as vanilla ZeRO-3 offload skips it, and training goes on.

DeepSpeed decides before any update: a global gradient norm that is not finite marks the step as an overflow and
no subgroup is updated. Under fp16 the dynamic loss scaler also lowers the scale; DeepSpeed's CPU accelerator has no
fp16 here, so this runs in fp32, where the same check skips the step at a fixed scale of 1. The gradient is made
infinite in the backward only (the loss stays finite), in one step of six, with half of the subgroups on each lane.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from tests.support.parity import TinyLM, train

INF_AT = 2  # the step whose gradient is infinite


class _InfGrad(torch.autograd.Function):
    """Identity forward; an infinite gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class _InfGradAt(TinyLM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.net[0](x)
        if self.trainer.global_step == INF_AT:
            h = _InfGrad.apply(h)  # every gradient of the layers below the embedding's output stays finite
        logits = self.net[5](self.net[4](self.net[3](self.net[2](self.net[1](h)))))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


class _StateAround(pl.Callback):
    """Every subgroup's master, exp_avg, exp_avg_sq and step before and after each optimizer step."""

    def __init__(self) -> None:
        self.before: list[list[tuple[torch.Tensor, ...]]] = []
        self.after: list[list[tuple[torch.Tensor, ...]]] = []
        self.lanes: list[str] = []

    @staticmethod
    def _snapshot(trainer: pl.Trainer) -> list[tuple[torch.Tensor, ...]]:
        opt = trainer.strategy.model.optimizer
        out = []
        for master in opt.fp32_partitioned_groups_flat:
            state = opt.optimizer.state.get(master, {})
            moments = [state[k].detach().clone() for k in ("exp_avg", "exp_avg_sq") if k in state]
            out.append((master.detach().clone(), *moments, torch.tensor(float(state.get("step", 0)))))
        return out

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.before.append(self._snapshot(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.after.append(self._snapshot(trainer))
        manager = getattr(trainer.strategy, "manager", None)
        if manager is not None and manager.records:
            self.lanes.append(manager.records[-1].plan.lane_letters())


def _run(plan: Any) -> tuple[Any, _StateAround]:
    around = _StateAround()
    return train(plan, steps=6, clip=1.0, model=_InfGradAt(), every_step=around), around


def test_an_inf_gradient_skips_the_update_on_both_lanes_like_vanilla() -> None:
    dos, around = _run(0.5)
    vanilla, _ = _run(None)
    assert len(dos.losses) == 6 and all(torch.isfinite(torch.tensor(dos.losses)))
    # the skipped step changed nothing: every subgroup's master, moments and step, bit for bit
    before, after = around.before[INF_AT], around.after[INF_AT]
    assert len(before) == len(after) >= 4
    for b, a in zip(before, after):
        assert len(b) == len(a) == 4 and all(torch.equal(x, y) for x, y in zip(b, a))
    # the steps around it did update, on both lanes (the plan puts half of the subgroups on the device lane)
    for k in (INF_AT - 1, INF_AT + 1):
        assert all(not torch.equal(b[0], a[0]) for b, a in zip(around.before[k], around.after[k]))
    assert {"H", "D"} <= set(around.lanes[-1])
    # and training went on exactly as vanilla's, which skips the same step
    assert [abs(a - b) <= 1e-5 * abs(b) for a, b in zip(dos.losses, vanilla.losses)] == [True] * 6
    assert (dos.masters - vanilla.masters).abs().max() <= 1e-5 * vanilla.masters.abs().max()
