"""Activation offload under Lightning: a tiny GPT fitted under any strategy, with every step's losses, gradients and
(under DeepSpeed) fp32 masters; the DOS strategy the offload tests run; and the offload callback a trainer holds.
Shared by ``tests/integration/test_activation_offload.py`` and ``tests/gpu/test_activation_offload_gpu.py``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.activations import ActivationOffloadCallback
from lightning_dos.models import GPTModule
from tests.support.parity import LossRecorder, masters_of

VOCAB, SEQ, BATCH, LAYERS = 64, 16, 4, 4


class GradRecorder(pl.Callback):
    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.grads.append([p.grad.clone() for p in pl_module.parameters() if p.grad is not None])


def fit(strategy: Any, checkpointing: bool, callbacks: list[pl.Callback] = (), steps: int = 3,
        accelerator: str = "cpu", accumulate: int = 1) -> dict[str, Any]:
    torch.manual_seed(0)
    module = GPTModule("debug", vocab_size=VOCAB, block_size=SEQ, n_layer=LAYERS, n_embd=32, n_head=4, n_kv_head=2,
                       activation_checkpointing=checkpointing, warmup_steps=0, max_steps=steps)
    losses, grads = LossRecorder(), GradRecorder()
    trainer = pl.Trainer(accelerator=accelerator, devices=1, strategy=strategy, max_steps=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accumulate_grad_batches=accumulate, callbacks=[losses, grads, *callbacks])
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, VOCAB, (steps * accumulate * BATCH, SEQ + 1), generator=g)
    trainer.fit(module, DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=BATCH))
    out: dict[str, Any] = {"losses": losses.losses, "grads": grads.grads, "trainer": trainer}
    if hasattr(trainer.strategy, "config"):
        out["masters"] = masters_of(trainer.strategy)
    return out


def offload_callback(trainer: pl.Trainer) -> ActivationOffloadCallback:
    return next(cb for cb in trainer.callbacks if isinstance(cb, ActivationOffloadCallback))


def dos_strategy(**kwargs: Any) -> DeepOptimizerStatesStrategy:
    # every parameter gathered and released around its use: ZeRO-3's real path, not whole persistent params
    return DeepOptimizerStatesStrategy(plan="stride:2", sub_group_size=4000, param_persistence=0, **kwargs)
