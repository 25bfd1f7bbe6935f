"""Probes of what the step does before and after the update phase: the subgroups' gradient norms ours and vanilla's
way, with the all-reduces each made, and the parameters released and gathered around the update. Shared by
``tests/integration/test_step_preamble.py`` and ``tests/gpu/test_cuda_parity.py``."""

from __future__ import annotations

from typing import Any

import deepspeed.comm
import lightning.pytorch as pl
import pytest
import torch
from deepspeed.runtime.zero import partition_parameters
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from lightning_dos.zero.optimizer import _VanillaStage3


class NormProbe(pl.Callback):
    """After each backward, before the step: both norm computations on the same gradients, and how many all-reduces
    each made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pairs: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        self.reduces: list[tuple[int, int]] = []
        self.calls = 0
        all_reduce = deepspeed.comm.all_reduce

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return all_reduce(*args, **kwargs)

        monkeypatch.setattr(deepspeed.comm, "all_reduce", counted)

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
        optimizer = trainer.strategy.model.optimizer
        start = self.calls
        ours = optimizer._get_norm_groups()
        middle = self.calls
        vanilla = _VanillaStage3._get_norm_groups(optimizer)
        self.reduces.append((middle - start, self.calls - middle))
        self.pairs.append((ours, vanilla))


class ReleaseProbe(pl.Callback):
    """Parameters freed between the start of the step and the end of the iteration, and whether every parameter is
    whole, and the very tensor it was at the first iteration's end, when each iteration ends."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.freed: list[int] = []
        self.whole: list[bool] = []
        self.same_storage: list[bool] = []
        self.own_partition: list[bool] = []
        self._pointers: dict[int, int] | None = None
        self._in_step = False
        free_param = partition_parameters.free_param

        def counted(param: Any) -> None:
            if self._in_step:
                self.freed[-1] += 1
            free_param(param)

        monkeypatch.setattr(partition_parameters, "free_param", counted)

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
        self.freed.append(0)
        self._in_step = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._in_step = False
        params = list(pl_module.parameters())
        self.whole.append(all(p.ds_status == ZeroParamStatus.AVAILABLE and p.numel() == p.ds_numel for p in params))
        self.own_partition.append(all(p.data_ptr() == p.ds_tensor.data_ptr() for p in params))
        pointers = {p.ds_id: p.data_ptr() for p in params}
        if self._pointers is None:
            self._pointers = pointers
        self.same_storage.append(pointers == self._pointers)
