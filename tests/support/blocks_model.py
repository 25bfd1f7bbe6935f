"""A tiny LM of repeated residual blocks (a ``ModuleList``, each block under activation checkpointing), and whether
ZeRO-3 hooked each block's inner layers: what ``leaf_blocks`` changes. Shared by
``tests/integration/test_leaf_blocks.py`` and ``tests/gpu/test_leaf_blocks_gpu.py``."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lightning_dos.optim import adamw, weight_decay_groups
from tests.support.parity import VOCAB, TinyLM

BLOCKS = 3


class ResidualBlock(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 2 * hidden)
        self.down = torch.nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class BlockLM(TinyLM):
    """Embedding -> a ``ModuleList`` of residual blocks, each under activation checkpointing (non-reentrant, or the
    reentrant kind many model libraries default to) -> head."""

    def __init__(self, freeze_embedding: bool = False, reentrant: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.freeze_embedding, self.reentrant = freeze_embedding, reentrant

    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(0)
        h = self.hidden
        self.net = torch.nn.ModuleDict({
            "embed": torch.nn.Embedding(VOCAB, h),
            "blocks": torch.nn.ModuleList(ResidualBlock(h) for _ in range(BLOCKS)),
            "head": torch.nn.Linear(h, VOCAB),
        })
        self.net["embed"].weight.requires_grad_(not self.freeze_embedding)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.net["embed"](x)
        for block in self.net["blocks"]:
            h = checkpoint(block, h, use_reentrant=self.reentrant)
        logits = self.net["head"](h)
        return torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))

    def configure_optimizers(self) -> Any:
        params = [p for p in self.net.parameters() if p.requires_grad]
        return adamw(self.trainer, weight_decay_groups(params, 0.1), lr=self.lr, betas=(0.9, 0.95), eps=1e-8,
                     weight_decay=0.1)


def block_layers_hooked(module: BlockLM) -> list[bool]:
    """Whether ZeRO-3 registered its hooks on each block's inner layers (it gives every module it hooks a ds_id)."""
    return [hasattr(block.up, "ds_id") for block in module.net["blocks"]]
