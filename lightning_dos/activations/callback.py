"""Owns activation offload under Lightning: a callback that turns it on for every training step, under any strategy.

The saved-tensor hooks go on at ``on_train_batch_start`` and come off at ``on_train_batch_end``, so they cover the
step's forward and backward (a micro-batch's, under gradient accumulation) and nothing else: validation and
prediction save nothing for backward anyway. The blocks are found in the LightningModule when fit starts. The
activation files of ``"nvme"`` are removed at the end of fit and when fit stops on an exception; files left by a run
that crashed are removed when the next run's store opens on the same directory.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dos.activations.offload import ActivationOffload
from lightning_dos.activations.options import (
    DEFAULT_KEEP_LAST_LAYERS,
    DEFAULT_KEYS,
    DEFAULT_MIN_TENSOR_BYTES,
    DEFAULT_PREFETCH_LAYERS,
    OptionKeys,
    validate_options,
)
from lightning_dos.blocks import BlockNames, BlockTypes, block_override_problems, named_blocks

__all__ = ["ActivationOffloadCallback"]


class ActivationOffloadCallback(Callback):
    """Offloads the activations saved for backward in every training step (see :class:`ActivationOffload`).

    Works under any strategy (plain Lightning, ``deep_optimizer_states``, ``zero3_offload``, DDP); the
    ``deep_optimizer_states`` strategy adds one itself when its ``activation_offload`` is set. Every argument is
    checked here, so a bad one fails before training starts.

    Args:
        placement: ``"host"`` (pinned host memory), ``"nvme"`` (files under ``nvme_path``) or ``"keep"`` (measure
            only).
        nvme_path: an existing, writable directory on a local disk, for ``"nvme"``.
        min_tensor_bytes: saved storages smaller than this stay on the device.
        keep_last_layers: the last this-many blocks keep their activations on the device.
        prefetch_layers: blocks restored ahead of the one backward is in.
        layers: the name of the module of the LightningModule holding its blocks (``"model.layers"``), or the blocks'
            names; default: found (:mod:`lightning_dos.blocks`).
        layer_types: the block classes (or class names) to find in the LightningModule instead; default: the children
            of its largest ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` of one block class.
        log_metrics: log the ``act/*`` counters of every step (``on_step``) to the trainer's loggers.
        keys: the option names errors cite (the strategy passes its own).
    """

    def __init__(
        self,
        placement: str = "host",
        nvme_path: Optional[Union[str, os.PathLike]] = None,
        min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES,
        keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS,
        prefetch_layers: int = DEFAULT_PREFETCH_LAYERS,
        layer_types: BlockTypes = None,
        log_metrics: bool = True,
        keys: OptionKeys = DEFAULT_KEYS,
        layers: BlockNames = None,
    ) -> None:
        validate_options(placement, nvme_path, min_tensor_bytes, keep_last_layers, prefetch_layers, keys=keys)
        problems = block_override_problems(layers, layer_types)
        if problems:
            raise ValueError("activation offload: " + "; ".join(problems))
        self.layers = layers
        self.placement = placement
        self.nvme_path = nvme_path
        self.min_tensor_bytes = min_tensor_bytes
        self.keep_last_layers = keep_last_layers
        self.prefetch_layers = prefetch_layers
        self.layer_types = layer_types
        self.log_metrics = log_metrics
        self.keys = keys
        self.offload: Optional[ActivationOffload] = None
        self._in_step = False

    @property
    @override
    def state_key(self) -> str:
        return "activation_offload"

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        offload = ActivationOffload(
            self.placement, self.nvme_path, self.min_tensor_bytes, self.keep_last_layers,
            prefetch_layers=self.prefetch_layers, layer_types=self.layer_types,
            device=trainer.strategy.root_device, keys=self.keys)
        if self.layers:  # the named blocks, in the module's registration order as given
            offload.attach([block for _, block in named_blocks(pl_module, self.layers)], root=pl_module)
        else:
            offload.attach(pl_module)
        self.offload = offload.open()  # the NVMe store opens now: stale files of a crashed run go before step 1

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.offload is not None:
            self.offload.begin_step()
            self._in_step = True

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.offload is None or not self._in_step:
            return
        self._in_step = False
        self.offload.end_step()
        if self.log_metrics:
            metrics = self.offload.metrics()
            if metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        offload = self.offload
        if offload is None:
            return
        if self._in_step:
            self._in_step = False
            offload.end_step()
        offload.close()  # the last metrics stay readable on ``self.offload``
