"""Owns ``DeepOptimizerStatesStrategy``: DOS defaults for DeepSpeed ZeRO-3, validation, registration, hooks.

The strategy is deliberately small. It resolves a DeepSpeed config with the optimizer state offloaded to
pinned host memory and several subgroups, swaps the interleaved ZeRO-3 optimizer into the engine
(``lightning_dos.zero``), and dispatches each update phase from ``on_before_optimizer_step``. It also
lets the real strategy run on a CPU-only machine (DeepSpeed's CPU accelerator and gloo), so CI exercises
the same code users run.
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

from lightning_dos.activations.options import (
    DEFAULT_KEEP_LAST_LAYERS,
    DEFAULT_MIN_TENSOR_BYTES,
    STRATEGY_KEYS,
)
from lightning_dos.blocks import BlockNames, BlockTypes, block_override_problems
from lightning_dos.planning.perf_model import CostParams
from lightning_dos.planning.plan import parse_plan
from lightning_dos.strategies.deepspeed_base import CPUSupportMixin, offload_config_problems

log = logging.getLogger(__name__)

STRATEGY_NAME = "deep_optimizer_states"

#: Largest subgroup chosen by ``sub_group_size="auto"``: 1e8 fp32 params = 1.2 GB of master/m/v per subgroup.
AUTO_SUB_GROUP_MAX = 100_000_000
#: ``sub_group_size="auto"`` aims for at least this many subgroups per rank, so the planner has choices.
AUTO_SUB_GROUP_COUNT = 16
#: ``param_persistence="auto"`` on several ranks keeps the 16-bit parameters whole when a whole copy takes at most this
#: share of the device memory free when the engine is built (activations and the device lane need the rest).
AUTO_PERSISTENCE_SHARE = 0.25
#: A persistence threshold above any parameter's size: every parameter persists.
PERSIST_ALL = 10**15
_PERSISTENCE_KEYS = ("stage3_param_persistence_threshold", "param_persistence_threshold")


class DeepOptimizerStatesStrategy(CPUSupportMixin):
    """DeepSpeed ZeRO-3 with the optimizer state in pinned host memory, updated in two interleaved lanes.

    Every update phase, each subgroup of this rank's optimizer state is updated either on the host
    (DeepSpeed's CPU Adam) or streamed through the accelerator (prefetch, fused Adam, flush), as the
    ``plan`` says. Everything else (ZeRO-3 partitioning, loss scaling, clipping, checkpoints) is DeepSpeed's.

    Args:
        plan: which lane updates each subgroup. ``"auto"`` lets the performance model choose every step;
            ``"host"`` updates every subgroup on the CPU (vanilla ZeRO-3 offload, with pinned state);
            ``"device"`` streams every subgroup through the accelerator; a float in [0, 1] puts that
            fraction of the parameters (by size) on the device lane; ``"stride:K"`` puts every K-th
            subgroup there (the reference implementation's rule); a list of ``"host"``/``"device"``
            gives one lane per subgroup.
        sub_group_size: parameters per subgroup (ZeRO-3 never splits a tensor, so subgroups are about this
            size). ``"auto"`` picks ``min(1e8, partition / 16)`` from the model once it is built.
        memory_budget_gib: most accelerator memory DOS may keep for the optimizer state: the resident subgroups and
            the device lane's buffers and kept gradients (``None``: whatever is free beside the training, less a
            headroom and a safety margin).
        resident_gib: accelerator memory in which to keep optimizer-state subgroups for the whole run. ``"auto"``
            (the default): after the first forward and backward (which keeps every gradient on the device), as many
            subgroups as fit beside the measured peak, a headroom (8% of the device, at least 2 GiB) and two
            device-lane slots, within ``memory_budget_gib``; given back to the host, newest first, if something else
            later takes more than half the headroom (``lightning_dos.planning.placement``). A number: that many GiB;
            0: none. Resident subgroups, in id order at 12 bytes per parameter (fp32 master and both moments), live
            on the device only (no host copy), are updated there by fused Adam and never cross the host-device link;
            the plan balances the others across the two lanes. The others live on the host, 16 bytes per parameter.
            Nothing is allocated for the state before the first update boundary; the memory plan is printed at start
            and then, and a run the box cannot hold stops before its state is allocated
            (``docs/optimizer-state-manager.md``).
        buffers: device-lane buffer slots (prefetch depth); ``None`` lets the planner choose.
        cost_overrides: fixed values for performance-model parameters (e.g. ``{"h2d_bytes_per_s": 25e9}``);
            calibration never changes an overridden parameter. See ``docs/performance-model.md``.
        pin_memory: keep offloaded optimizer state in page-locked memory (2-3x faster transfers).
        param_persistence: whether ZeRO-3 keeps the 16-bit parameters whole on the device between steps instead of
            gathering and releasing each layer's in every forward and backward (on one GPU that fetch-and-release
            roughly doubles forward and backward). ``"auto"``: yes on one rank (its partition is the whole model
            already, so persisting costs no memory), and on several ranks when a whole 16-bit copy takes at most a
            quarter of the device memory free when the engine is built; ``True``/``False``: always/never; an int:
            DeepSpeed's ``stage3_param_persistence_threshold`` (parameters of at most that many elements persist).
            A persistence threshold in ``config`` wins.
        leaf_blocks: whether ZeRO-3 hooks each repeated block (the transformer blocks: see ``layers``) once instead
            of every layer in it (DeepSpeed's z3 leaf modules; ``lightning_dos.zero.leaf_blocks``): a block's
            parameters are fetched together and its gradients reduced together when its backward ends.
            ``"auto"``: on one rank (where every parameter persists, so the per-layer hooks fetch nothing);
            ``True``/``False``: always/never (on several ranks a whole block is gathered at once and its gradients
            reduced only when its backward ends: more device memory, later communication; not measured). A
            ``leaf_module`` entry in ``config`` wins.
        layers: the module holding the model's transformer blocks, by name relative to the LightningModule
            (``"model.layers"``: its children are the blocks), or the blocks' own names; for ``leaf_blocks`` and
            ``activation_offload``. ``None`` (the default) finds them: the children of the model's largest
            ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` of one block class (``lightning_dos.blocks``).
        layer_types: the blocks' classes or class names instead (``["LlamaDecoderLayer"]``): the outermost modules of
            those classes are the blocks.
        bind_cores: with several ranks on one host, give each rank's process (its CPU Adam and torch's CPU threads)
            its own block of the host's cores, NUMA node by NUMA node (``lightning_dos.strategies.host_binding``), so
            one rank's update phase does not take another's cores. Nothing changes with one rank per host.
        stage, offload_optimizer: must stay 3 and True; they exist so a mistaken override is reported
            clearly instead of silently ignored.
        config: a DeepSpeed config dict or JSON path; it must keep ZeRO stage 3 and ``offload_optimizer``
            on the CPU. ``sub_group_size`` and ``pin_memory`` from this strategy fill keys it leaves out.
        activation_offload: where the activations saved for backward go during each training step: ``None`` (stay on
            the device, the default), ``"host"`` (pinned host memory) or ``"nvme"`` (files under
            ``activation_nvme_path``). Installs :class:`~lightning_dos.activations.ActivationOffloadCallback`; see
            ``docs/activation-offload.md``.
        activation_nvme_path: an existing, writable directory on a local disk with at least 1 GiB free, for
            ``activation_offload="nvme"`` only (DeepSpeed's own ``nvme_path`` is for parameter/optimizer offload).
        activation_min_tensor_bytes: saved storages smaller than this many bytes stay on the device.
        activation_keep_last_layers: the last this-many transformer blocks keep their activations on the device.
        overlap: run each update phase on a worker thread beside the next forward and backward instead of before
            them (exact: every read of a subgroup's params or host gradient waits for that subgroup's update; see
            ``docs/optimizer-state-manager.md``). ``"auto"`` (the default): on where it was measured faster, one rank
            training on a CUDA device with the interleaved update; serial elsewhere (several ranks, a CPU run, a
            configuration that runs DeepSpeed's own update). ``True`` insists (anything else is one error before
            training); ``False`` runs every update phase before the next forward. When on, DeepSpeed's throughput
            timer is not synchronised unless ``config`` says otherwise, and each phase's ``dos/*`` record is logged
            one step later (the last one at the end of training).
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
        if not (overlap == "auto" or isinstance(overlap, bool)):
            raise ValueError(f"overlap: {overlap!r} is not 'auto', true or false; set overlap: auto (the default: on "
                             "with one CUDA device), true to run the update beside the next forward, or false")
        #: the ``overlap`` asked for; :attr:`overlapped` says what runs
        self.overlap: Union[Literal["auto"], bool] = overlap
        #: whether update phases run beside the next forward (decided in ``setup_environment``, confirmed when the
        #: engine is built)
        self.overlapped = overlap is True
        problems = block_override_problems(layers, layer_types)
        if problems:
            raise ValueError("; ".join(problems))
        #: the blocks' names or classes, where the strategy was told them (None: found)
        self.layers, self.layer_types = layers, layer_types
        self.activation_offload_callback = _activation_offload_callback(
            activation_offload, activation_nvme_path, activation_min_tensor_bytes, activation_keep_last_layers,
            layers, layer_types)
        self.plan_spec = parse_plan(plan)
        self._auto_sub_group_size = _validate_sub_group_size(sub_group_size)
        if memory_budget_gib is not None and memory_budget_gib < 0:
            raise ValueError(f"memory_budget_gib: {memory_budget_gib} is negative; set a size in GiB >= 0 or null")
        if resident_gib != "auto" and (isinstance(resident_gib, bool) or not isinstance(resident_gib, (int, float))
                                       or not 0 <= resident_gib < float("inf")):
            raise ValueError(f"resident_gib: {resident_gib!r} is not a size; set auto (the default: as much as fits "
                             "beside the training's measured peak), or the GiB of accelerator memory in which to keep "
                             "optimizer state (a number >= 0; 0 keeps all of it on the host)")
        if resident_gib != "auto" and memory_budget_gib is not None and resident_gib > memory_budget_gib:
            raise ValueError(f"resident_gib: {resident_gib} GiB is more than memory_budget_gib ({memory_budget_gib} "
                             "GiB), which covers the resident subgroups too; set resident_gib <= memory_budget_gib, "
                             "or resident_gib: auto")
        #: GiB for resident subgroups, or ``"auto"``
        self.resident_gib: Union[Literal["auto"], float] = "auto" if resident_gib == "auto" else float(resident_gib)
        if buffers is not None and buffers < 1:
            raise ValueError(
                f"buffers: {buffers} is not a number of device-lane buffer slots; "
                "set 1 or more, or null to let the planner choose"
            )
        if stage != 3:
            raise MisconfigurationException(
                f"stage: deep_optimizer_states needs ZeRO stage 3, got {stage}; set stage: 3 "
                f"(or use strategy: deepspeed_stage_{stage} for plain DeepSpeed)"
            )
        if not offload_optimizer:
            raise MisconfigurationException(
                "offload_optimizer: deep_optimizer_states keeps the optimizer state in host memory; set "
                "offload_optimizer: true (or use strategy: deepspeed_stage_3 for a GPU-resident optimizer)"
            )
        if cost_overrides:
            CostParams().with_values(cost_overrides, key="cost_overrides")  # unknown names fail here, early
        if not (param_persistence == "auto" or isinstance(param_persistence, bool)
                or (isinstance(param_persistence, int) and param_persistence >= 0)):
            raise ValueError(f"param_persistence: {param_persistence!r}; set 'auto', true, false, or a number of "
                             "elements >= 0 (parameters of at most that many elements stay whole on the device)")
        self.param_persistence = param_persistence
        if not (leaf_blocks == "auto" or isinstance(leaf_blocks, bool)):
            raise ValueError(f"leaf_blocks: {leaf_blocks!r}; set 'auto', true or false")
        self.leaf_blocks = leaf_blocks
        #: Names of the blocks ZeRO-3 hooks as leaves (empty: hooks on every layer).
        self.leaf_block_names: list[str] = []
        self.bind_cores = bool(bind_cores)
        self.bound_cores: Optional[list[int]] = None  # this rank's cores, once bound
        self.persistence_threshold: Optional[int] = None  # what prepare_config decided (None: DeepSpeed's default)
        if isinstance(config, dict):
            config = copy.deepcopy(config)  # defaults are filled into a copy: the caller's dict stays as given
        self.memory_budget_gib = memory_budget_gib
        self.buffers = buffers
        self.cost_overrides = dict(cost_overrides or {})
        super().__init__(
            accelerator=accelerator,
            stage=3,
            offload_optimizer=True,
            offload_parameters=offload_parameters,
            pin_memory=pin_memory,
            sub_group_size=AUTO_SUB_GROUP_MAX if self._auto_sub_group_size else int(sub_group_size),
            config=config,
            **kwargs,
        )
        if config is not None:
            _complete_user_config(self.config, pin_memory=pin_memory, sub_group_size=sub_group_size)
        if overlap is True:
            _overlap_config_defaults(self.config)
        validate_dos_config(self.config)
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
        zero = self.config["zero_optimization"]
        if self._auto_sub_group_size:
            zero["sub_group_size"] = auto_sub_group_size(_partition_numel(model, self.world_size))
        user_persistence = next((zero[key] for key in _PERSISTENCE_KEYS if key in zero), None)
        if user_persistence is None:  # else the user's DeepSpeed config decides
            free = _free_device_bytes(self.root_device)
            self.persistence_threshold = persistence_threshold(
                self.param_persistence, self.world_size, _model_bytes(model, self.precision_plugin.precision), free)
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
                rank_zero_info(f"deep_optimizer_states: resumed the plan state: {manager.base_plan}")


# ---------------------------------------------------------------------- config helpers
def _activation_offload_callback(placement: Optional[str], nvme_path: Optional[Union[str, Path]],
                                 min_tensor_bytes: int, keep_last_layers: int, layers: BlockNames = None,
                                 layer_types: BlockTypes = None) -> Optional[Callback]:
    """The activation-offload callback the ``activation_*`` arguments ask for (None: off); one ``ValueError`` naming
    each bad argument and its fix otherwise."""
    from lightning_dos.activations import OFFLOAD_PLACEMENTS, ActivationOffloadCallback, validate_options

    validate_options(placement, nvme_path, min_tensor_bytes, keep_last_layers, keys=STRATEGY_KEYS,
                     placements=(None, *OFFLOAD_PLACEMENTS))
    if placement is None:
        return None
    return ActivationOffloadCallback(placement, nvme_path, min_tensor_bytes, keep_last_layers, keys=STRATEGY_KEYS,
                                     layers=layers, layer_types=layer_types)


def _validate_sub_group_size(value: Union[int, str]) -> bool:
    """Return whether the size is ``"auto"``; raise for anything that is not a positive integer."""
    if value == "auto":
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or int(value) != value:
        raise ValueError(
            f"sub_group_size: {value!r} is not a positive whole number of parameters; set e.g. 50000000 "
            "(a few 1e7 to 1e8 per subgroup) or 'auto'"
        )
    return False


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


def _model_bytes(model: torch.nn.Module, precision: str) -> int:
    """Bytes of a whole copy of the model's parameters in the training precision (2 for 16-bit, else 4)."""
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    return numel * (2 if ("16" in str(precision)) else 4)


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


def _complete_user_config(config: dict[str, Any], pin_memory: bool, sub_group_size: Union[int, str]) -> None:
    """Fill the DOS keys a user-supplied DeepSpeed config leaves out (never overriding what it sets)."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    offload = zero.get("offload_optimizer")
    if isinstance(offload, dict):
        offload.setdefault("pin_memory", pin_memory)
    if sub_group_size != "auto":
        zero.setdefault("sub_group_size", int(sub_group_size))
    else:
        zero.setdefault("sub_group_size", AUTO_SUB_GROUP_MAX)


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


def validate_dos_config(config: Optional[dict[str, Any]]) -> None:
    """Raise one ``MisconfigurationException`` listing every way ``config`` cannot run DOS."""
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
    if problems:
        raise MisconfigurationException("deep_optimizer_states: " + "; ".join(problems))
