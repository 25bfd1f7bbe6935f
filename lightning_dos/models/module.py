"""Owns decoder-only pretraining of a :class:`~lightning_dos.models.gpt.GPT` as a LightningModule.

Next-token cross-entropy, AdamW with warm-up + cosine learning rate, and the FLOPs per token that
:class:`~lightning_dos.telemetry.callbacks.PerfMetrics` turns into TFLOP/s and MFU (the callback logs throughput under
every strategy, so the module does not). The network is built in ``configure_model`` so that a sharding
strategy (DeepSpeed ZeRO-3) can construct it already partitioned; the optimizer comes from
:func:`lightning_dos.optim.adamw`, which picks DeepSpeed's CPU Adam when the strategy offloads optimizer state.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import MeanMetric

from lightning_dos.models.gpt import GPT, GPTConfig
from lightning_dos.models.gpt import activation_bytes as _activation_bytes
from lightning_dos.models.gpt import flops_per_token as _flops_per_token
from lightning_dos.optim import adamw, weight_decay_groups

__all__ = ["CausalLMModule", "GPTModule", "check_training_args", "lr_factor"]


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step``.

    Linear warm-up from 0 at step 0 to 1 at ``warmup_steps``, then cosine decay to ``min_lr_ratio``
    at ``max_steps``, held there afterwards.
    """
    if step < warmup_steps:
        return step / warmup_steps
    if step >= max_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_training_args(learning_rate: float, warmup_steps: int, min_lr_ratio: float, max_steps: int | None) -> None:
    """Raise ``ValueError`` for the first training argument out of range (the modules' constructors call it)."""
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if max_steps is not None and max_steps <= 0:
        raise ValueError(f"max_steps must be > 0 or None, got {max_steps}")


class CausalLMModule(pl.LightningModule):
    """What the pretraining modules share: next-token cross-entropy on ``(x, y)`` batches (``forward`` gives the
    logits), ``train/*`` and ``val/*`` logging, and the warm-up + cosine schedule of ``hparams`` (``learning_rate``,
    ``warmup_steps``, ``max_steps``, ``min_lr_ratio``). A subclass builds ``self.model`` and the optimizer."""

    val_loss: MeanMetric

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        # cross-entropy over a large vocabulary is not accurate enough in bf16
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=batch[1].numel())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        # the metric has already reduced across ranks; sync_dist only keeps Lightning from warning
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), sync_dist=True)

    def with_schedule(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``configure_optimizers``' answer: ``optimizer`` with the warm-up + cosine ``LambdaLR``, stepped per step."""
        max_steps = self.hparams.max_steps
        if max_steps is None:
            estimated = self.trainer.estimated_stepping_batches
            if not math.isfinite(estimated):
                raise ValueError("cannot infer the cosine horizon from an unbounded trainer; set max_steps")
            max_steps = int(estimated)
        if self.hparams.warmup_steps >= max_steps:
            rank_zero_warn(
                f"warmup_steps ({self.hparams.warmup_steps}) >= max_steps ({max_steps}): "
                "the learning rate never reaches its peak"
            )
        schedule = functools.partial(
            lr_factor,
            warmup_steps=self.hparams.warmup_steps,
            max_steps=max_steps,
            min_lr_ratio=self.hparams.min_lr_ratio,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class GPTModule(CausalLMModule):
    """Pretrains a GPT on batches ``(x, y)`` of token ids ``[B, T]``, where ``y`` is ``x`` shifted by one.

    Args:
        name: Model preset (``"debug"``, ``"gpt-10m"``, ``"gpt-1b"``, ``"gpt-2.7b"``, ``"gpt-4b"``); the model
            arguments below override its fields when not None.
        vocab_size: Number of token ids; must cover the tokenizer's vocabulary.
        block_size: Maximum sequence length.
        n_layer: Number of transformer blocks.
        n_head: Number of query heads.
        n_kv_head: Number of key/value heads (grouped-query attention).
        n_embd: Hidden size.
        intermediate_size: MLP hidden size.
        style: ``"llama"`` or ``"gpt2"``.
        activation_checkpointing: Recompute block activations in the backward pass to save memory.
        learning_rate: Peak learning rate, reached at the end of warm-up.
        min_lr_ratio: Final learning rate as a fraction of ``learning_rate``.
        warmup_steps: Optimizer steps of linear warm-up from 0.
        max_steps: Optimizer step at which the cosine decay ends; None uses ``trainer.estimated_stepping_batches``.
        weight_decay: Decoupled weight decay for matrices and embeddings; norms and biases get none.
        betas: AdamW moment coefficients.
        eps: AdamW denominator epsilon.
        peak_flops: Peak FLOP/s of one device, for the model FLOPs utilisation (``perf/mfu``) that
            :class:`~lightning_dos.telemetry.callbacks.PerfMetrics` logs; None lets the callback look it up from the
            device and precision (MFU is not logged when it is unknown, e.g. on a CPU).
    """

    def __init__(
        self,
        name: str = "gpt-10m",
        vocab_size: int | None = None,
        block_size: int | None = None,
        n_layer: int | None = None,
        n_head: int | None = None,
        n_kv_head: int | None = None,
        n_embd: int | None = None,
        intermediate_size: int | None = None,
        style: str | None = None,
        activation_checkpointing: bool = False,
        learning_rate: float = 3e-4,
        min_lr_ratio: float = 0.1,
        warmup_steps: int = 100,
        max_steps: int | None = None,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        peak_flops: float | None = None,
    ) -> None:
        super().__init__()
        check_training_args(learning_rate, warmup_steps, min_lr_ratio, max_steps)
        self.save_hyperparameters()
        overrides = dict(
            vocab_size=vocab_size,
            block_size=block_size,
            n_layer=n_layer,
            n_head=n_head,
            n_kv_head=n_kv_head,
            n_embd=n_embd,
            intermediate_size=intermediate_size,
            style=style,
        )
        self.config = GPTConfig.from_name(
            name,
            activation_checkpointing=activation_checkpointing,
            **{key: value for key, value in overrides.items() if value is not None},
        )
        self.model: GPT | None = None
        self.val_loss = MeanMetric()
        self.peak_flops: float | None = peak_flops

    def configure_model(self) -> None:
        # called inside the strategy's sharded-construction context, and possibly more than once
        if self.model is None:
            self.model = GPT(self.config)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token at sequence length ``seq_len`` (read by ``PerfMetrics`` for TFLOP/s and MFU)."""
        return _flops_per_token(self.config, seq_len)

    def activation_bytes(self, micro_batch: int, seq_len: int) -> int:
        """An upper estimate of one step's activation memory on one device (``lightning-dos plan`` reads it)."""
        return _activation_bytes(self.config, micro_batch, seq_len)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.model is None:
            raise RuntimeError("configure_model() must run before configure_optimizers()")
        optimizer = adamw(
            self.trainer,
            weight_decay_groups(self.model.parameters(), self.hparams.weight_decay),
            lr=self.hparams.learning_rate,
            betas=tuple(self.hparams.betas),
            eps=self.hparams.eps,
            weight_decay=self.hparams.weight_decay,
        )
        return self.with_schedule(optimizer)
