"""An infinite gradient in one step of a run: the tiny LM whose backward makes it, and a callback that snapshots every
subgroup's optimizer state around each step. Shared by ``tests/integration/test_overflow_skip.py`` (fp32 on the CPU)
and ``tests/gpu/test_cuda_faults.py`` (fp16 with dynamic loss scaling)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from tests.support.parity import TinyLM

INF_AT = 2  # the step whose gradient is infinite


class _InfGrad(torch.autograd.Function):
    """Identity forward; an infinite gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class InfGradAt(TinyLM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.net[0](x)
        if self.trainer.global_step == INF_AT:
            h = _InfGrad.apply(h)  # every gradient of the layers below the embedding's output stays finite
        logits = self.net[5](self.net[4](self.net[3](self.net[2](self.net[1](h)))))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


class StateAround(pl.Callback):
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
