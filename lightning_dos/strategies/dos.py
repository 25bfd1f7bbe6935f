"""Owns ``DeepOptimizerStatesStrategy``: DOS defaults for DeepSpeed ZeRO-3, registration, hooks.

The strategy is deliberately small. Its arguments are :class:`~lightning_dos.strategies.options.DOSOptions` (checked
there, all at once). It resolves a DeepSpeed config with the optimizer state offloaded to pinned host memory and
several subgroups, swaps the interleaved ZeRO-3 optimizer into the engine (``lightning_dos.zero``), and dispatches
each update phase from ``on_before_optimizer_step``. It also lets the real strategy run on a CPU-only machine
(DeepSpeed's CPU accelerator and gloo), so CI exercises the same code users run.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_dos.activations.options import DEFAULT_KEEP_LAST_LAYERS, DEFAULT_MIN_TENSOR_BYTES, STRATEGY_KEYS
from lightning_dos.strategies.deepspeed_base import DeepSpeedBase, offload_config_problems
from lightning_dos.strategies.options import AUTO_SUB_GROUP_MAX, DOSOptions, DOSOptionsError, document_options

log = logging.getLogger(__name__)

STRATEGY_NAME = "deep_optimizer_states"

#: ``sub_group_size="auto"`` aims for at least this many subgroups per rank, so the planner has choices (and never
#: above :data:`~lightning_dos.strategies.options.AUTO_SUB_GROUP_MAX` parameters each).
AUTO_SUB_GROUP_COUNT = 16
#: ``param_persistence="auto"`` on several ranks keeps the 16-bit parameters whole when a whole copy takes at most this
#: share of the device memory free when the engine is built (activations and the device lane need the rest).
AUTO_PERSISTENCE_SHARE = 0.25
#: A persistence threshold above any parameter's size: every parameter persists.
PERSIST_ALL = 10**15
_PERSISTENCE_KEYS = ("stage3_param_persistence_threshold", "param_persistence_threshold")


class DeepOptimizerStatesStrategy(DeepSpeedBase):
    """DeepSpeed ZeRO-3 with the optimizer state in pinned host memory, updated in two interleaved lanes.

    Every update phase, each subgroup of this rank's optimizer state is updated either on the host
    (DeepSpeed's CPU Adam) or streamed through the accelerator (prefetch, fused Adam, flush), as the
    ``plan`` says. Everything else (ZeRO-3 partitioning, loss scaling, clipping, checkpoints) is DeepSpeed's.

    The arguments before ``config`` are the fields of :class:`~lightning_dos.strategies.options.DOSOptions`, with
    the same names and defaults; their entries below come from its field docstrings. A bad argument (or several)
    is one :class:`~lightning_dos.strategies.options.DOSOptionsError` listing every problem, with the DeepSpeed
    config's, before anything is built.

    Args:
        config: a DeepSpeed config dict or JSON path; it must keep ZeRO stage 3 and ``offload_optimizer``
            on the CPU. ``sub_group_size`` and ``pin_memory`` from this strategy fill keys it leaves out.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``.
    """

    strategy_name = STRATEGY_NAME
    #: configure_optimizers may return torch's Adam/AdamW (lightning_dos.strategies.torch_optimizers)
    takes_torch_adam = True

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        plan: Union[str, float, Sequence[str]] = "auto",
        sub_group_size: Union[int, str] = "auto",
        memory_budget_gib: Optional[float] = None,
        resident_gib: Union[Literal["auto"], float] = "auto",
        buffers: Optional[int] = None,
        cost_overrides: Optional[dict[str, float]] = None,
        pin_memory: bool = True,
        param_persistence: Union[Literal["auto"], bool, int] = "auto",
        leaf_blocks: Union[Literal["auto"], bool] = "auto",
        layers: Optional[Union[str, list[str]]] = None,
        layer_types: Optional[list[str]] = None,
        bind_cores: bool = True,
        stage: int = 3,
        offload_optimizer: bool = True,
        offload_parameters: bool = False,
        config: Optional[Union[str, Path, dict[str, Any]]] = None,
        activation_offload: Optional[str] = None,
        activation_nvme_path: Optional[Union[str, Path]] = None,
        activation_min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES,
        activation_keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS,
        overlap: Union[Literal["auto"], bool] = "auto",
        **kwargs: Any,
    ) -> None:
        #: the DOS arguments as given (checked below); the attributes after the check are what the strategy reads
        self.options = options = DOSOptions(
            plan=plan, sub_group_size=sub_group_size, memory_budget_gib=memory_budget_gib, resident_gib=resident_gib,
            buffers=buffers, cost_overrides=cost_overrides, pin_memory=pin_memory,
            param_persistence=param_persistence, leaf_blocks=leaf_blocks, layers=layers, layer_types=layer_types,
            bind_cores=bind_cores, stage=stage, offload_optimizer=offload_optimizer,
            activation_offload=activation_offload, activation_nvme_path=activation_nvme_path,
            activation_min_tensor_bytes=activation_min_tensor_bytes,
            activation_keep_last_layers=activation_keep_last_layers, overlap=overlap)
        problems = options.problems()
        if isinstance(config, dict):
            config = copy.deepcopy(config)  # defaults are filled into a copy: the caller's dict stays as given
        super().__init__(
            accelerator=accelerator,
            stage=3,
            offload_optimizer=True,
            offload_parameters=offload_parameters,
            pin_memory=pin_memory,
            sub_group_size=options.initial_sub_group_size,
            config=config,
            **kwargs,
        )
        if config is not None:
            _complete_user_config(self.config, pin_memory=pin_memory, sub_group_size=options.initial_sub_group_size)
        problems += dos_config_problems(self.config)
        if problems:
            raise DOSOptionsError(problems)
        if overlap is True:
            _overlap_config_defaults(self.config)
        #: the ``overlap`` asked for; :attr:`overlapped` says what runs
        self.overlap: Union[Literal["auto"], bool] = overlap
        #: whether update phases run beside the next forward (decided in ``setup_environment``, confirmed when the
        #: engine is built)
        self.overlapped = overlap is True
        self.plan_spec = options.plan_spec
        #: GiB for resident subgroups, or ``"auto"``
        self.resident_gib: Union[Literal["auto"], float] = options.resident
        self.memory_budget_gib = memory_budget_gib
        self.buffers = buffers
        self.cost_overrides = dict(cost_overrides or {})
        self.param_persistence = param_persistence
        self.leaf_blocks = leaf_blocks
        #: the blocks' names or classes, where the strategy was told them (None: found)
        self.layers, self.layer_types = layers, layer_types
        self.bind_cores = bool(bind_cores)
        #: Names of the blocks ZeRO-3 hooks as leaves (empty: hooks on every layer).
        self.leaf_block_names: list[str] = []
        self.bound_cores: Optional[list[int]] = None  # this rank's cores, once bound
        self.persistence_threshold: Optional[int] = None  # what prepare_config decided (None: DeepSpeed's default)
        self.activation_offload_callback = _activation_offload_callback(options)
        self.manager: Any = None

    # ------------------------------------------------------------------ registration
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            STRATEGY_NAME,
            cls,
            description="DeepSpeed ZeRO-3 with interleaved CPU/GPU optimizer-state updates (Deep Optimizer States)",
        )

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self._install_activation_offload(trainer)
        callback = next((cb for cb in trainer.callbacks if isinstance(cb, _DispatchCallback)), None)
        if callback is None:
            trainer.callbacks.append(_DispatchCallback(self))
        else:
            callback.strategy = self
        super().setup(trainer)

    def _install_activation_offload(self, trainer: pl.Trainer) -> None:
        """Add the ``activation_offload`` callback to the trainer (once; a second one would hook every save twice)."""
        ours = self.activation_offload_callback
        if ours is None or any(cb is ours for cb in trainer.callbacks):
            return
        from lightning_dos.activations import ActivationOffloadCallback

        if any(isinstance(cb, ActivationOffloadCallback) for cb in trainer.callbacks):
            raise MisconfigurationException(
                "activation_offload: set on the strategy, and the trainer already has an ActivationOffloadCallback; "
                "keep one: remove activation_offload from the strategy or the callback from the trainer")
        trainer.callbacks.append(ours)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.overlap == "auto":
            self.overlapped = overlap_by_default(self.world_size, self.root_device.type)
            if self.overlapped:
                _overlap_config_defaults(self.config)
        if self.bind_cores:
            from lightning_dos.strategies.host_binding import bind_rank_cores

            self.bound_cores = bind_rank_cores(self.local_rank, self.num_processes)
            if self.bound_cores is not None:
                log.info("deep_optimizer_states: rank %d of %d on this host runs on cores %s", self.local_rank,
                         self.num_processes, self.bound_cores)

    # ------------------------------------------------------------------ engine construction
    @override
    def prepare_config(self, model: torch.nn.Module) -> None:
        """Settle the DeepSpeed config from the built, partitioned model: subgroup size, persistence, leaf blocks.
        Nothing of the optimizer state exists yet; ``deepspeed.initialize`` allocates it right after."""
        zero = self.config["zero_optimization"]
        if self.options.auto_sub_group_size:
            zero["sub_group_size"] = auto_sub_group_size(_partition_numel(model, self.world_size))
        user_persistence = next((zero[key] for key in _PERSISTENCE_KEYS if key in zero), None)
        if user_persistence is None:  # else the user's DeepSpeed config decides
            free = _free_device_bytes(self.root_device)
            model_bytes = _model_bytes(model, self.precision_plugin.precision)
            self.persistence_threshold = persistence_threshold(
                self.param_persistence, self.world_size, model_bytes, free)
            if self.persistence_threshold is not None:
                zero["stage3_param_persistence_threshold"] = self.persistence_threshold
        persist_all = (self.persistence_threshold if user_persistence is None else user_persistence) == PERSIST_ALL
        if "leaf_module" not in zero and leaf_blocks_on(self.leaf_blocks, self.world_size, persist_all):
            from lightning_dos.zero.leaf_blocks import mark_leaf_blocks

            self.leaf_block_names = mark_leaf_blocks(model, self.layers, self.layer_types)
        if user_persistence is None and persist_all and "memory_efficient_linear" not in zero:
            from lightning_dos.zero.linear import restore_torch_linear

            zero["memory_efficient_linear"] = False  # nothing is released: torch's linear (lightning_dos.zero.linear)
            restore_torch_linear()

    @override
    def initialize_context(self) -> contextlib.AbstractContextManager:
        from lightning_dos.zero import interleaved_zero3_optimizer

        return interleaved_zero3_optimizer()

    @override
    def after_initialize(self, engine: Any, optimizer: Any) -> None:
        from lightning_dos.zero.checkpoint_io import load_mapped
        from lightning_dos.zero.forward_trace import reset_once_per_forward

        reset_once_per_forward(optimizer)  # ZeRO-3 completes its module trace under Lightning
        load_mapped(engine)  # a resume reads the state from the file's pages into each home, not whole first
        self.manager = self._build_manager(optimizer)
        if self.overlap is True and not self.manager.active:
            raise MisconfigurationException(
                "overlap: needs the interleaved update, and this configuration runs DeepSpeed's own host-only update "
                "(see the line above: e.g. an optimizer other than DeepSpeedCPUAdam, NVMe offload or a partial "
                "offload ratio); set overlap: auto or false, or a configuration the interleaved update supports")

    def _build_manager(self, ds_optimizer: Any) -> Any:
        from lightning_dos.update.manager import OptimizerStateManager

        manager = OptimizerStateManager(
            ds_optimizer,
            plan=self.plan_spec,
            memory_budget_gib=self.memory_budget_gib,
            buffers=self.buffers,
            device=self.root_device,
            ranks_per_host=self.num_processes,
            cost_overrides=self.cost_overrides,
            # under gradient accumulation DeepSpeed's own gradient path runs: every gradient reaches the host
            device_gradients=int(self.config.get("gradient_accumulation_steps", 1)) == 1,
            overlap=self.overlapped,
            resident_gib=self.resident_gib,
        )
        persistent = self.persistence_threshold == PERSIST_ALL
        blocks = f"; ZeRO-3 hooks {len(self.leaf_block_names)} blocks as leaves" if self.leaf_block_names else ""
        self.overlapped = manager.overlap  # "auto" where the interleaved update does not run: serial
        rank_zero_info(manager.describe() + ("; 16-bit parameters kept whole on the device" if persistent else "")
                       + blocks)
        for plan in manager.memory_plans:
            rank_zero_info("deep_optimizer_states: " + plan.describe())
        return manager

    # ------------------------------------------------------------------ overlap: joins
    def wait_for_update(self) -> None:
        """Wait for the update phase running beside the forward (``overlap=True``), if any, and record it; the
        optimizer state is then where it lives (resident subgroups' on the device, the others' on the host), current.
        Call it from a callback before reading weights or optimizer state directly (an EMA, a weight histogram): the
        strategy does it by itself at the end of training, joins before checkpoints, validation, plan changes and at
        the end of each epoch, and DeepSpeed's own readers of the optimizer state (a checkpoint save, ``safe_get_*``)
        get it current."""
        if self.manager is not None:
            self.manager.settle()

    def _join(self) -> None:
        """Wait for the update phase in flight, if any (what reads the 16-bit params or the host gradients needs)."""
        if self.manager is not None:
            self.manager.join()

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        self._join()  # Lightning's checkpoint dump reads the weights here first
        return super().lightning_module_state_dict()

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        self._join()
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        self._join()
        return super().load_checkpoint(checkpoint_path, weights_only)

    @override
    def on_exception(self, exception: BaseException) -> None:
        if self.manager is not None:
            self.manager.join(raise_error=False)  # the run failed already: only make sure the worker is done
        super().on_exception(exception)

    @override
    def teardown(self) -> None:
        manager = self.manager
        try:
            if manager is not None:
                manager.close()  # before the engine is released and before anyone reads the weights
        finally:
            super().teardown()

    # ------------------------------------------------------------------ hooks
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Finalise this step's plan (free memory is known now: activations are gone) at the update boundary."""
        if self.manager is None:
            return
        engine = self.model
        if hasattr(engine, "is_gradient_accumulation_boundary") and not engine.is_gradient_accumulation_boundary():
            return
        shown = len(self.manager.memory_plans)
        self.manager.dispatch()
        for plan in self.manager.memory_plans[shown:]:  # the homes have just been placed
            rank_zero_info("deep_optimizer_states: " + plan.describe())


#: the DOS arguments' entries, from DOSOptions' field docstrings (help() and the CLI's --help read them)
DeepOptimizerStatesStrategy.__doc__ = document_options(DeepOptimizerStatesStrategy.__doc__ or "")


class _DispatchCallback(Callback):
    """Forwards ``on_before_optimizer_step`` to the strategy (Lightning gives strategies no such hook), and keeps the
    manager's plan state in checkpoints (a callback's ``state_dict`` is saved with them; a strategy's is not)."""

    def __init__(self, strategy: DeepOptimizerStatesStrategy) -> None:
        self.strategy = strategy

    @property
    @override
    def state_key(self) -> str:
        return STRATEGY_NAME

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if isinstance(trainer.strategy, DeepOptimizerStatesStrategy):
            trainer.strategy.on_before_optimizer_step(optimizer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy._join()  # the gates would do; joining is cheap and leaves the records current

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy._join()  # e.g. before DataLoader workers fork for the next epoch

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.wait_for_update()

    @override
    def state_dict(self) -> dict[str, Any]:
        manager = self.strategy.manager
        return {"plan_state": manager.state_dict()} if manager is not None and manager.active else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        manager = self.strategy.manager
        if manager is not None and manager.active and "plan_state" in state_dict:
            if manager.load_state_dict(state_dict["plan_state"]):
                rank_zero_info(f"deep_optimizer_states: resumed the plan state: {manager.plans.in_force}")


# ---------------------------------------------------------------------- config helpers
def _activation_offload_callback(options: DOSOptions) -> Optional[Callback]:
    """The activation-offload callback the (checked) ``activation_*`` options ask for (None: off)."""
    if options.activation_offload is None:
        return None
    from lightning_dos.activations import ActivationOffloadCallback

    return ActivationOffloadCallback(options.activation_offload, options.activation_nvme_path,
                                     options.activation_min_tensor_bytes, options.activation_keep_last_layers,
                                     keys=STRATEGY_KEYS, layers=options.layers, layer_types=options.layer_types)


def persistence_threshold(setting: Union[str, bool, int], world_size: int, model_bytes: int,
                          free_bytes: Optional[int]) -> Optional[int]:
    """DeepSpeed's ``stage3_param_persistence_threshold`` for ``param_persistence=setting`` (None: its default).

    ``"auto"`` persists everything on one rank, and on several when a whole 16-bit copy of the model
    (``model_bytes``) takes at most :data:`AUTO_PERSISTENCE_SHARE` of the free device memory (unknown: no).
    """
    if setting is True or (setting == "auto" and (world_size == 1 or (
            free_bytes is not None and model_bytes <= AUTO_PERSISTENCE_SHARE * free_bytes))):
        return PERSIST_ALL
    if setting == "auto" or setting is False:
        return None
    return int(setting)


def precision_param_bytes(precision: Any) -> int:
    """Bytes per parameter of the training's parameters under Lightning's ``precision``: 2 for 16-bit, else 4."""
    return 2 if "16" in str(precision) else 4


def _model_bytes(model: torch.nn.Module, precision: str) -> int:
    """Bytes of a whole copy of the model's parameters in the training precision (:func:`precision_param_bytes`)."""
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    return numel * precision_param_bytes(precision)


def _free_device_bytes(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def auto_sub_group_size(partition_numel: int) -> int:
    """Subgroup size for ``"auto"``: about ``AUTO_SUB_GROUP_COUNT`` subgroups, never above ``AUTO_SUB_GROUP_MAX``."""
    return int(max(1, min(AUTO_SUB_GROUP_MAX, math.ceil(partition_numel / AUTO_SUB_GROUP_COUNT))))


def _partition_numel(model: torch.nn.Module, world_size: int) -> int:
    total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    return math.ceil(total / max(1, world_size))


def _complete_user_config(config: dict[str, Any], pin_memory: bool, sub_group_size: int) -> None:
    """Fill the DOS keys a user-supplied DeepSpeed config leaves out (never overriding what it sets)."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    offload = zero.get("offload_optimizer")
    if isinstance(offload, dict):
        offload.setdefault("pin_memory", pin_memory)
    zero.setdefault("sub_group_size", sub_group_size)


def overlap_by_default(world_size: int, device_type: str) -> bool:
    """What ``overlap="auto"`` turns on before the engine is built: training on CUDA devices, at any number of ranks
    (measured faster on one GPU in benchmarks/ runs Z and Z3, and on four in docs/multi-node.md). Where the host
    stands in for the device the update and the forward would share the same cores. The engine may still run
    serially: where the interleaved update does not run (``OptimizerStateManager.overlap``)."""
    del world_size  # every rank overlaps its own update: the collectives stay on the training thread, in order
    return device_type == "cuda"


def leaf_blocks_on(setting: Union[str, bool], world_size: int, persist_all: bool) -> bool:
    """Whether ZeRO-3 hooks the repeated blocks as leaves: ``True``/``False`` as set; ``"auto"``: on one rank, and on
    several when every 16-bit parameter persists (the per-layer hooks then fetch nothing on any rank, and a block's
    gradients are reduced together when its backward ends: measured at four GPUs, docs/multi-node.md)."""
    if isinstance(setting, bool):
        return setting
    return world_size == 1 or persist_all


def _overlap_config_defaults(config: dict[str, Any]) -> None:
    """With ``overlap``: DeepSpeed's throughput timer (on by default) synchronises the device at every forward and
    step, which would wait for the update the forward is meant to overlap; it keeps timing on the host clock
    unless the config sets ``timers.throughput.synchronized`` itself."""
    timers = config.setdefault("timers", {})
    if isinstance(timers, dict):
        throughput = timers.setdefault("throughput", {})
        if isinstance(throughput, dict):
            throughput.setdefault("synchronized", False)


def dos_config_problems(config: Optional[dict[str, Any]]) -> list[str]:
    """Every way the DeepSpeed ``config`` cannot run DOS, one line each with its fix (empty: it can)."""
    problems = offload_config_problems(config, stage=3)
    zero = (config or {}).get("zero_optimization")
    if isinstance(zero, dict):
        offload = zero.get("offload_optimizer")
        if isinstance(offload, dict) and offload.get("ratio", 1.0) != 1.0:
            problems.append(
                "zero_optimization.offload_optimizer.ratio: DeepSpeed's static split conflicts with the plan; "
                "remove ratio and set the strategy's plan instead"
            )
        sub = zero.get("sub_group_size")
        if sub is not None and (not isinstance(sub, (int, float)) or sub <= 0):
            problems.append(f"zero_optimization.sub_group_size: is {sub!r}; set a positive number such as 5e7")
    return problems

