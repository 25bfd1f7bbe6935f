"""What the one-home-per-subgroup tests share: how many subgroups their runs keep resident, a callback that reads and
writes the optimizer state through DeepSpeed's ``safe_get_*``/``safe_set_*`` mid-run, and one that saves a checkpoint
after a given step. Shared by ``tests/integration/test_homes.py`` and ``tests/gpu/test_homes_gpu.py``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

RESIDENT = 3  # subgroups kept resident in these runs (the tiny model has more than that)


class ReadAndWrite(pl.Callback):
    """At step 2: read every parameter's fp32 master and exp_avg through DeepSpeed's ``safe_get_*``, then scale
    the first parameter's master through ``safe_set_full_fp32_param``."""

    def __init__(self) -> None:
        self.read: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state, safe_set_full_fp32_param

        if trainer.global_step != 2:
            return
        params = [p for p in pl_module.parameters() if p.requires_grad]
        self.read = [safe_get_full_fp32_param(p).clone() for p in params]
        self.read += [safe_get_full_optimizer_state(p, "exp_avg").clone() for p in params]
        safe_set_full_fp32_param(params[0], safe_get_full_fp32_param(params[0]) * 0.5)


class SaveAfter(pl.Callback):
    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
