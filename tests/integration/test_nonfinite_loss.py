"""A NaN training loss under bf16 (or fp32) stops the run at once with one error naming the step; under fp16 the
step is counted (DeepSpeed's loss scaling skips its update)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_dos.telemetry.callbacks import NonFiniteLossGuard
from tests.support.parity import TinyLM, train

NAN_AT = 2  # the batch whose loss is NaN


class _NaNAt(TinyLM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx == NAN_AT else loss


def test_a_nan_loss_under_bf16_stops_the_run_naming_the_step() -> None:
    guard = NonFiniteLossGuard()
    with pytest.raises(FloatingPointError) as info:
        train(0.5, steps=5, precision="bf16-mixed", clip=0.05, model=_NaNAt(), every_step=guard)
    message = str(info.value)
    assert message.startswith(f"train/loss is nan at step {NAN_AT} (batch {NAN_AT} of epoch 0); under bf16-mixed")
    assert "--ckpt_path last" in message


def test_fp16_counts_instead_of_stopping_and_finite_losses_pass() -> None:
    guard = NonFiniteLossGuard()
    fp16 = SimpleNamespace(precision="16-mixed", global_step=3, current_epoch=0)
    guard.on_train_batch_end(fp16, None, {"loss": torch.tensor(float("inf"))}, None, 2)
    guard.on_train_batch_end(fp16, None, {"loss": torch.tensor(1.0)}, None, 3)
    assert guard.skipped == 1
    bf16 = SimpleNamespace(precision="bf16-mixed", global_step=3, current_epoch=1)
    guard.on_train_batch_end(bf16, None, torch.tensor(2.5), None, 2)  # a bare loss tensor as the output
    guard.on_train_batch_end(bf16, None, None, None, 2)  # no loss (a step skipped by the module)
    with pytest.raises(FloatingPointError, match="train/loss is inf at step 2 .batch 7 of epoch 1."):
        guard.on_train_batch_end(bf16, None, {"loss": torch.tensor(float("inf"))}, None, 7)


