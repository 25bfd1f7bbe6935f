"""Owns the base of every DeepSpeed strategy here: CPU-only machines, module state, atomic checkpoints.

DeepSpeed itself runs on CPUs (its CPU accelerator, gloo); Lightning 2.6's strategy refuses them in three
places: ``setup_environment`` (CUDA only), ``setup_distributed`` (device indices must be 0..n-1, a CPU's is
None) and ``deepspeed.initialize(args.device_rank=root_device.index)`` (None crashes DeepSpeed). The base
answers all three, gives subclasses one hook around ``deepspeed.initialize``, moves the module's state that ZeRO-3
does not place (metrics, buffers) to the device, which no code path of Lightning or DeepSpeed does, and saves
checkpoints atomically (:mod:`lightning_dos.strategies.checkpoint`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy
from typing_extensions import override

from lightning_dos.optim import offloads_optimizer
from lightning_dos.strategies.checkpoint import describe, partial_path, publish, remove_partials, validate_resume_path
from lightning_dos.strategies.module_device import move_module_state


@contextlib.contextmanager
def state_left_in_place(strategy: Any) -> Iterator[None]:
    """Lightning's ``Strategy.teardown`` without its move of every optimizer's state to the CPU: state that lives on
    the device would take host memory it was never given (tens of GiB at the end of a large run), only to be freed."""
    optimizers, strategy._optimizers = strategy._optimizers, []
    try:
        yield
    finally:
        strategy._optimizers = optimizers


@contextlib.contextmanager
def module_left_in_place(module: torch.nn.Module | None) -> Iterator[None]:
    """Lightning's ``Strategy.teardown`` without its move of the module to the CPU: ZeRO-3's parameters are DeepSpeed's
    partitions, freed with the engine. Where DOS keeps the 16-bit parameters whole on the device, the move would copy
    the whole model to the host while the optimizer state still holds it (18.8 GiB at 10.1B, the host's last room).
    The single-device peers use it too (:mod:`lightning_dos.strategies.peers`)."""
    if module is None:
        yield
        return
    module.cpu = lambda: module  # shadows nn.Module.cpu on this instance only
    try:
        yield
    finally:
        del module.cpu


class DeepSpeedBase(DeepSpeedStrategy):
    """The base of every DeepSpeed strategy here: it runs on CPUs as well (on GPUs exactly like Lightning's
    ``DeepSpeedStrategy``), with one hook around ``deepspeed.initialize`` and atomic checkpoints."""

    @override
    def setup_environment(self) -> None:
        if isinstance(self.accelerator, CPUAccelerator):
            super(DeepSpeedStrategy, self).setup_environment()  # skip the CUDA-only check
            return
        super().setup_environment()

    @override
    def setup_distributed(self) -> None:
        if isinstance(self.accelerator, CPUAccelerator):
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()
            return
        super().setup_distributed()

    @property
    def device_rank(self) -> int:
        """What DeepSpeed calls the device rank: the device index, or the local rank on CPUs."""
        index = self.root_device.index
        return self.local_rank if index is None else index

    def initialize_context(self) -> contextlib.AbstractContextManager:
        """Context around ``deepspeed.initialize`` (subclasses swap the ZeRO optimizer in here)."""
        return contextlib.nullcontext()

    def after_initialize(self, engine: Any, optimizer: Any) -> None:
        """Called once the engine exists."""

    def prepare_config(self, model: torch.nn.Module) -> None:
        """Last chance to complete the DeepSpeed config, with the (sharded) model built."""

    #: Whether torch's Adam/AdamW from ``configure_optimizers`` are taken as they are when the optimizer state is
    #: offloaded (:mod:`lightning_dos.strategies.torch_optimizers`); strategies whose engine steps
    #: ``DeepSpeedCPUAdam`` set it.
    takes_torch_adam: bool = False

    @override
    def _init_optimizers(self) -> tuple[torch.optim.Optimizer, Any]:
        if not (self.takes_torch_adam and offloads_optimizer(self.lightning_module.trainer)):
            return super()._init_optimizers()
        from lightning_dos.strategies.torch_optimizers import adopt_optimizer, configured_optimizers

        name = getattr(self, "strategy_name", type(self).__name__)
        optimizer, scheduler = configured_optimizers(self.lightning_module, name)
        force = bool(self.config.get("zero_force_ds_cpu_optimizer", True))
        optimizer = adopt_optimizer(optimizer, [scheduler] if scheduler else [], name, force_ds_cpu_optimizer=force)
        return optimizer, scheduler

    @override
    def _setup_model_and_optimizer(
        self,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        lr_scheduler: Any = None,
    ) -> tuple[Any, Any]:
        import deepspeed

        self.prepare_config(model)
        model_parameters = filter(lambda p: p.requires_grad, model.parameters())
        with self.initialize_context():
            engine, ds_optimizer, _, _ = deepspeed.initialize(
                args=argparse.Namespace(device_rank=self.device_rank),
                config=self.config,
                model=model,
                model_parameters=model_parameters,
                optimizer=optimizer,
                lr_scheduler=lr_scheduler,
                dist_init_required=False,
            )
        # ZeRO-3 placed the parameters; the rest of the module (metrics, buffers) must follow them
        move_module_state(model, self.root_device)
        self.after_initialize(engine, ds_optimizer)
        return engine, ds_optimizer

    @override
    def teardown(self) -> None:
        module, engine = self.lightning_module, self.model
        with state_left_in_place(self), module_left_in_place(module):  # the engine's release below frees both
            super().teardown()
        if module is not None and engine is not None and engine is not module:
            from lightning_dos.zero.engine_release import release_engine

            release_engine(engine, module)  # else DeepSpeed keeps the engine, and all it holds, until the process ends

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        """DeepSpeed's sharded save, into ``<filepath>.partial`` and then published at ``filepath`` in one rename, with
        every file fsynced first (:mod:`lightning_dos.strategies.checkpoint`): a crash never leaves a checkpoint that
        looks complete and is not."""
        filepath = self.broadcast(os.fspath(filepath))
        partial = partial_path(filepath)
        if self.is_global_zero:
            remove_partials(Path(filepath).parent)  # what an earlier crash left; nothing else writes here now
        self.barrier("dos_checkpoint_begin")
        super().save_checkpoint(checkpoint, partial, storage_options)
        self.barrier("dos_checkpoint_written")  # every rank's shard is on disk
        if self.is_global_zero:
            publish(partial, filepath, {"global_step": checkpoint.get("global_step"), "epoch": checkpoint.get("epoch")})
        self.barrier("dos_checkpoint_published")

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        if self.load_full_weights and self.zero_stage_3:
            return super().load_checkpoint(checkpoint_path, weights_only)
        validate_resume_path(checkpoint_path)  # one clear error, before DeepSpeed reads anything
        if describe(checkpoint_path) != "universal":
            return super().load_checkpoint(checkpoint_path, weights_only)
        from lightning_dos.zero.universal import loading_universal

        with loading_universal(self.deepspeed_engine):  # written at another world size: DeepSpeed re-shards it
            return super().load_checkpoint(checkpoint_path, weights_only)

    @override
    def _initialize_deepspeed_inference(self, model: torch.nn.Module) -> None:
        # Lightning's own, with a device rank that exists on CPUs
        import deepspeed
        from lightning.pytorch.strategies.deepspeed import remove_module_hooks

        assert isinstance(self.config, dict)
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}
        for key in ("fp16", "bf16"):
            if key in self.config:
                inference_config[key] = self.config[key]
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        remove_module_hooks(model)
        move_module_state(model, self.root_device)
        engine, _, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.device_rank),
            config=inference_config,
            model=model,
            optimizer=None,
            lr_scheduler=None,
            model_parameters=[],
            dist_init_required=False,
        )
        self.model = engine


def offload_config_problems(config: Optional[dict[str, Any]], stage: int) -> list[str]:
    """Every way ``config`` is not ZeRO ``stage`` with the optimizer state offloaded to the CPU, one line each with
    its fix (empty: it is)."""
    zero = (config or {}).get("zero_optimization")
    if not isinstance(zero, dict):
        return [f"zero_optimization: missing; set zero_optimization.stage: {stage} with offload_optimizer.device: cpu"]
    problems = []
    if zero.get("stage") != stage:
        problems.append(f"zero_optimization.stage: is {zero.get('stage')!r}; set it to {stage}")
    offload = zero.get("offload_optimizer")
    if not isinstance(offload, dict) or offload.get("device") != "cpu":
        got = offload.get("device") if isinstance(offload, dict) else offload
        problems.append(f"zero_optimization.offload_optimizer.device: is {got!r}; set it to 'cpu'")
    return problems
