"""Train a small GPT a few steps on CUDA under ``fsdp_offload`` or, as the reference, ``plain`` (torch AdamW, no FSDP,
one device); each rank writes its losses and what it saw of the strategy, rank 0 the whole trained weights.

Usage: python tests/support/scripts/fsdp_offload_run.py STRATEGY DEVICES PRECISION CHECKPOINTING OUT_DIR
(STRATEGY ``fsdp_offload`` or ``plain``; CHECKPOINTING 1: the model's own activation checkpointing, 0: none).
Lightning re-runs this script for every rank above 0. The global batch is the same at every device count: each of
DEVICES ranks trains on ``BATCH // DEVICES`` of its sequences, so the mean of the ranks' losses is the loss ``plain``
computes over the whole batch on one device, and their averaged gradients its gradients.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_dos import FSDPOffloadStrategy, PlainStrategy
from lightning_dos.models import GPTModule
from lightning_dos.models.gpt import Block
from lightning_dos.optim import FULL_SHAPE

STEPS = 6
BATCH = 8  # sequences per step, over all ranks
SEQ = 32
VOCAB = 256
LR = 1e-2  # high enough that the weights, and the weight decay's share of them, move measurably in STEPS steps


class TinyGPT(GPTModule):
    """Three llama-style blocks (grouped-query attention, rotary tables passed through the checkpoint), seeded and
    built on the CPU under every strategy: Lightning builds a single-device model on its GPU, whose random numbers
    differ from the CPU's, where FSDP builds it, so the runs would start from different weights."""

    def __init__(self, checkpointing: bool) -> None:
        super().__init__(name="debug", vocab_size=VOCAB, block_size=SEQ, n_layer=3, n_embd=64, n_head=4, n_kv_head=2,
                         activation_checkpointing=checkpointing, learning_rate=LR, warmup_steps=0, max_steps=STEPS)

    def configure_model(self) -> None:
        if self.model is None:
            torch.manual_seed(0)
            with torch.device("cpu"):
                super().configure_model()


class Batches(pl.LightningDataModule):
    """The same ``STEPS`` global batches, in order, at every device count: runs of consecutive token ids from random
    starts, which the model learns to continue within a few steps. Each rank takes every ``world_size``-th sequence
    of a global batch through its own unshuffled sampler (the Trainer's ``use_distributed_sampler`` is off: Lightning's
    own shuffles a training set, so the runs would see other batches than ``plain``)."""

    def train_dataloader(self) -> DataLoader:
        starts = torch.randint(0, VOCAB, (STEPS * BATCH, 1), generator=torch.Generator().manual_seed(1234))
        data = (starts + torch.arange(SEQ + 1)) % VOCAB
        dataset = TensorDataset(data[:, :-1], data[:, 1:])
        ranks, rank = self.trainer.world_size, self.trainer.global_rank
        sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, shuffle=False) if ranks > 1 else None
        return DataLoader(dataset, batch_size=BATCH // ranks, sampler=sampler)


class Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def train(strategy: str, devices: int, precision: str, checkpointing: bool) -> tuple[pl.Trainer, TinyGPT, Losses]:
    losses = Losses()
    trainer = pl.Trainer(
        accelerator="cuda", devices=devices,
        strategy=FSDPOffloadStrategy() if strategy == "fsdp_offload" else PlainStrategy(),
        precision=precision, max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[losses], use_distributed_sampler=False,
    )
    module = TinyGPT(checkpointing)
    trainer.fit(module, datamodule=Batches())
    return trainer, module, losses


def full_weights(trainer: pl.Trainer, module: TinyGPT) -> dict[str, torch.Tensor]:
    """The whole trained weights by name, fp32 on the CPU (under FSDP a collective: rank 0 gets them, the others
    an empty dict)."""
    if isinstance(trainer.strategy, FSDPOffloadStrategy):
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(trainer.model, StateDictType.FULL_STATE_DICT, config):
            state = trainer.model.state_dict()
    else:
        state = module.state_dict()
    return {name: value.detach().float().cpu() for name, value in state.items() if name.startswith("model.")}


def facts(trainer: pl.Trainer, module: TinyGPT) -> dict[str, Any]:
    """What one rank saw of the strategy: FSDP units, offload, the sharding in effect, where the parameters and the
    optimizer state live, and the weight-decay groups by parameter name."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    optimizer = trainer.optimizers[0]
    names = {id(p): name for name, p in module.named_parameters()}
    units = [m for m in trainer.model.modules() if isinstance(m, FSDP)]
    sharding = getattr(trainer.model, "sharding_strategy", None)
    return {
        "optimizer": type(optimizer).__name__,
        "fused": optimizer.defaults.get("fused"),
        "units": len(units),
        "block_units": sum(isinstance(m.module, Block) for m in units),
        "offload_params": bool(trainer.model.cpu_offload.offload_params),
        "sharding": getattr(sharding, "name", str(sharding)),
        "param_devices": sorted({p.device.type for p in module.parameters()}),
        "param_dims": sorted({p.dim() for p in module.parameters()}),
        "state_devices": sorted({v.device.type for state in optimizer.state.values() for v in state.values()
                                 if isinstance(v, torch.Tensor)}),
        "groups": [{"weight_decay": group["weight_decay"], "params": sorted(names[id(p)] for p in group["params"])}
                   for group in optimizer.param_groups],
        "matrices": sorted(name for name, p in module.named_parameters() if len(getattr(p, FULL_SHAPE)) >= 2),
    }


def main() -> None:
    strategy, devices, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    checkpointing, out = sys.argv[4] == "1", Path(sys.argv[5])
    trainer, module, losses = train(strategy, devices, precision, checkpointing)
    rank = trainer.global_rank
    weights = full_weights(trainer, module)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        torch.save(weights, out / "weights.pt")
    info = {"rank": rank, "world_size": trainer.world_size, "losses": losses.losses,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 1024**3,
            **(facts(trainer, module) if strategy == "fsdp_offload" else {})}
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()  # an exception here exits non-zero as usual
    # every rank has written its results; the barrier keeps rank 0 (whose exit ends the test's wait) from leaving
    # before the others have, and the process group is left to the exit (os._exit skips a teardown that can hang)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
