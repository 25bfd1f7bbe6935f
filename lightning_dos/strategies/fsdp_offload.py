"""Owns the peer ``fsdp_offload``: torch FSDP with CPU offload under Lightning, as a user would set it up for a GPT.

It is the multi-GPU peer a Lightning user picks when the model's states do not fit on the GPUs: Lightning's own
``FSDPStrategy(cpu_offload=True)``, every transformer block an FSDP unit, fully sharded over every rank, the
parameters, gradients and the AdamW update on the host. The bench runs it at every device count beside vanilla
ZeRO-3 offload and DOS; a recipe runs under it with ``--config configs/strategy/fsdp_offload.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.nn import Module
from typing_extensions import override

from lightning_dos.blocks import repeated_blocks
from lightning_dos.optim import FULL_SHAPE

#: The only sharding this peer runs: parameters, gradients and optimizer state sharded over every rank (ZeRO-3's).
SHARDING = "FULL_SHARD"
#: Precisions that keep the weights in fp32 on the host (FSDP keeps the sharded weights in the module's dtype).
HALF_WEIGHT_PRECISIONS = ("16-true", "bf16-true")
#: Checkpoint formats Lightning's FSDPStrategy writes: one shard per rank, or the whole state gathered on rank 0.
STATE_DICT_TYPES = ("sharded", "full")


def offloads_params(cpu_offload: Any) -> bool:
    """Whether ``cpu_offload`` (``FSDPStrategy``'s argument: a bool, a torch ``CPUOffload`` or None) puts the
    parameters on the host."""
    return bool(getattr(cpu_offload, "offload_params", cpu_offload))


def mark_full_shapes(module: Module) -> None:
    """Record on each parameter of ``module`` the shape it has now, under :data:`lightning_dos.optim.FULL_SHAPE`.

    Call before FSDP wraps the module: with ``use_orig_params`` each parameter then becomes a 1-D view of this rank's
    shard (empty on the ranks that hold none of it), and :func:`lightning_dos.optim.weight_decay_groups` would find no
    matrix to decay. A parameter marked already keeps its mark (the module is wrapped once, set up again for
    validation).
    """
    for param in module.parameters():
        if getattr(param, FULL_SHAPE, None) is None:
            setattr(param, FULL_SHAPE, torch.Size(param.shape))



def wrap_blocks(module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    """The default FSDP auto-wrap policy's stand-in: a marker, replaced when the model is wrapped by
    :func:`block_wrap_policy` of that model (the units need the model: they are its repeated blocks)."""
    raise RuntimeError("wrap_blocks: replaced by block_wrap_policy(model) when fsdp_offload wraps the model")


def block_wrap_policy(model: torch.nn.Module) -> Any:
    """FSDP units for ``model``: a ``ModuleWrapPolicy`` of its repeated blocks' class (:mod:`lightning_dos.blocks`:
    the children of its largest ``nn.ModuleList``/``nn.Sequential``/``nn.ModuleDict`` of one block class); one clear
    error for a model with none."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    types = {type(block) for _, block in repeated_blocks(model)}
    if not types:
        raise MisconfigurationException(
            f"auto_wrap_policy: fsdp_offload makes each repeated block an FSDP unit and found none in "
            f"{type(model).__name__}; pass auto_wrap_policy={{MyBlock}} (the block classes to wrap)")
    return ModuleWrapPolicy(types)

class FSDPOffloadStrategy(FSDPStrategy):
    """torch FSDP with CPU offload: each rank's shard of the parameters, its gradients and the AdamW update on the host.

    Lightning's ``FSDPStrategy`` as a user would configure it for a GPT, with ``CPUOffload(offload_params=True)``:

    * **Units**: every transformer block (the block types registered with
      :mod:`lightning_dos.blocks` finds: the GPT's ``Block``) is an FSDP unit
      (:func:`block_wrap_policy`); the embeddings, the final norm and the output layer form the root unit.
    * **Sharding**: ``FULL_SHARD`` over every rank (at one rank torch runs it unsharded, ``NO_SHARD``). Each rank keeps
      its shard of the fp32 parameters in pinned host memory, copies a unit's shard to the GPU and all-gathers the
      unit just before its forward and again before its backward, frees it after each, and reduce-scatters the
      gradients, whose shard goes back to pinned host memory.
    * **Optimizer**: :func:`lightning_dos.optim.adamw` returns torch AdamW, fused, over the host shards
      (:meth:`configure_adamw`); its two moments live on the host beside them. Host memory per rank: 16 bytes per
      parameter of its shard (weights, gradients, two moments), and, while FSDP wraps it, the whole model as the
      module built it (every rank builds it on the host, fp32: 4 bytes per parameter, until it is sharded); GPU
      memory: the units in flight and the activations.
    * **Precision**: the Trainer's, through Lightning's FSDP precision plugin: ``bf16-mixed`` computes with bf16
      copies of the gathered parameters and reduces the gradients in bf16 (FSDP ``MixedPrecision``), the host keeps
      fp32 weights; ``32-true`` computes in fp32.
    * **Activation checkpointing**: left to the model. :class:`~lightning_dos.models.gpt.GPT` checkpoints each block
      itself (``torch.utils.checkpoint``, non-reentrant) when its ``activation_checkpointing`` is on, so the
      checkpoint encloses the block's FSDP unit. FSDP supports that nesting: by the time the backward recomputes a
      block, the unit's pre-backward hook has gathered its parameters for the backward, and FSDP skips its forward
      hooks in the recomputed forward, so nothing is gathered twice. Every strategy in the bench thus runs the same
      model code and the same recompute (the GPU tier checks that the losses match torch AdamW without FSDP with
      the model's checkpointing on). Lightning's ``activation_checkpointing_policy`` would wrap the block in a second
      checkpoint, which is refused while the model checkpoints itself.
    * **Checkpoints**: ``state_dict_type="sharded"``: each rank writes its own shard (torch distributed checkpoint),
      with no gather of the whole model on one rank.

    Refused before anything is built, each with one error naming the key: ``cpu_offload`` off (that is Lightning's
    ``strategy="fsdp"``), another sharding or a ``device_mesh``, ``use_orig_params=False`` (``configure_optimizers``
    would see no parameters of its own), a ``state_dict_type`` Lightning does not write; when ``fit`` starts: a device
    that is not a CUDA GPU (FSDP needs an accelerator, and its CPU offload pins host memory, which needs CUDA), a
    16-bit ``-true`` precision (the host weights would be 16-bit), gradient clipping by norm (Lightning's FSDP
    precision plugin cannot: ``torch.nn.utils.clip_grad_norm_`` over sharded gradients is wrong; clipping by value
    works), and ``activation_checkpointing_policy`` with a model that checkpoints its blocks itself.

    Args:
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin, process_group_backend,
            timeout: as for Lightning's ``FSDPStrategy``; the Trainer sets the first ones.
        cpu_offload: must stay on (``True`` or ``CPUOffload(offload_params=True)``); it exists so that a mistaken
            override is refused instead of ignored.
        auto_wrap_policy: the FSDP units; ``None`` wraps each of the model's repeated blocks
            (:func:`block_wrap_policy`). Lightning accepts a set of module classes, a ``ModuleWrapPolicy`` or a
            policy function.
        sharding_strategy: must stay ``"FULL_SHARD"`` (or ``ShardingStrategy.FULL_SHARD``).
        state_dict_type: ``"sharded"`` (one shard per rank) or ``"full"`` (gathered on rank 0).
        **kwargs: any other argument of Lightning's ``FSDPStrategy`` or torch's ``FullyShardedDataParallel``.
    """

    strategy_name = "fsdp_offload"

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = default_pg_timeout,
        cpu_offload: Union[bool, Any] = True,
        auto_wrap_policy: Optional[Any] = None,
        sharding_strategy: Union[str, Any] = SHARDING,
        state_dict_type: str = "sharded",
        **kwargs: Any,
    ) -> None:
        if not offloads_params(cpu_offload):
            raise MisconfigurationException(
                f"cpu_offload: fsdp_offload is FSDP with the parameters, gradients and optimizer step on the host, got "
                f"cpu_offload={cpu_offload!r}; remove cpu_offload (or set it true), or pick Lightning's "
                "strategy='fsdp' for FSDP without offload"
            )
        sharding = getattr(sharding_strategy, "name", sharding_strategy)
        if str(sharding).upper() != SHARDING:
            raise MisconfigurationException(
                f"sharding_strategy: fsdp_offload shards parameters, gradients and optimizer state over every rank "
                f"(FULL_SHARD, as ZeRO-3 does), got {sharding_strategy!r}; set sharding_strategy: {SHARDING}"
            )
        if kwargs.get("device_mesh") is not None:
            raise MisconfigurationException(
                f"device_mesh: fsdp_offload shards over every rank (FULL_SHARD), got device_mesh="
                f"{kwargs['device_mesh']!r}; remove device_mesh"
            )
        if kwargs.get("use_orig_params", True) is not True:
            raise MisconfigurationException(
                "use_orig_params: fsdp_offload keeps the module's own parameters (use_orig_params=True), which "
                "configure_optimizers builds AdamW over; remove use_orig_params"
            )
        if state_dict_type not in STATE_DICT_TYPES:
            raise MisconfigurationException(
                f"state_dict_type: {state_dict_type!r} is not a checkpoint format Lightning's FSDP writes; set "
                f"state_dict_type: {' or '.join(STATE_DICT_TYPES)}"
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            cpu_offload=cpu_offload,
            auto_wrap_policy=wrap_blocks if auto_wrap_policy is None else auto_wrap_policy,
            sharding_strategy=SHARDING,
            state_dict_type=state_dict_type,  # type: ignore[arg-type]
            **kwargs,
        )

    @property
    def state_dict_type(self) -> str:
        """The checkpoint format: ``"sharded"`` (one shard per rank) or ``"full"``."""
        return self._state_dict_type

    @override
    def setup_environment(self) -> None:
        self._refuse_what_cannot_run()
        super().setup_environment()

    def _refuse_what_cannot_run(self) -> None:
        """The refusals that need the Trainer: its precision and clipping, the model's own checkpointing, and last
        the device (so that each refusal can be met on a CPU too)."""
        precision = str(self.precision_plugin.precision)
        if precision in HALF_WEIGHT_PRECISIONS:
            raise MisconfigurationException(
                f"precision: fsdp_offload keeps fp32 weights on the host and computes in the Trainer's precision, but "
                f"{precision} makes the weights themselves 16-bit; set precision: bf16-mixed or 32-true"
            )
        module = self.lightning_module
        trainer = getattr(module, "_trainer", None)
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING and trainer.gradient_clip_val:
            algorithm = trainer.gradient_clip_algorithm
            if algorithm is None or algorithm == "norm":
                raise MisconfigurationException(
                    f"gradient_clip_val: {trainer.gradient_clip_val} clips by norm, which Lightning's FSDP precision "
                    "plugin cannot do (torch.nn.utils.clip_grad_norm_ over sharded gradients is wrong); set "
                    "trainer.gradient_clip_val: null (configs/strategy/fsdp_offload.yaml does), or "
                    "trainer.gradient_clip_algorithm: value"
                )
        checkpoints_itself = bool(getattr(getattr(module, "config", None), "activation_checkpointing", False))
        if checkpoints_itself and self._activation_checkpointing_kwargs:
            raise MisconfigurationException(
                "activation_checkpointing_policy: the model checkpoints its own blocks (its activation_checkpointing "
                "is on), and the policy would wrap each block in a second checkpoint, recomputing it twice; remove "
                "activation_checkpointing_policy, or set the model's activation_checkpointing: false"
            )
        if self.root_device.type != "cuda" or not torch.cuda.is_available():
            raise MisconfigurationException(
                f"accelerator: fsdp_offload needs a CUDA GPU, got device {self.root_device} (torch FSDP computes on "
                "an accelerator, and its CPU offload pins the host copies of the parameters and gradients, which "
                "needs CUDA); set accelerator: gpu on a GPU host, or pick zero3_offload or deep_optimizer_states on "
                "a CPU"
            )

    @override
    def _setup_model(self, model: Module) -> Module:
        mark_full_shapes(model)  # before FSDP flattens the parameters into 1-D views of each rank's shard
        if self.kwargs.get("auto_wrap_policy") is wrap_blocks:
            self.kwargs["auto_wrap_policy"] = block_wrap_policy(model)
        return super()._setup_model(model)

    def configure_adamw(
        self,
        param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> torch.optim.Optimizer:
        """torch AdamW, fused, over the host shards FSDP's CPU offload keeps (what :func:`lightning_dos.optim.adamw`
        returns here): torch's fused AdamW runs on CPU tensors from torch 2.4 on."""
        groups = list(param_groups)
        params = [p for group in groups for p in (group["params"] if isinstance(group, dict) else [group])]
        elsewhere = sorted({str(p.device) for p in params if p.device.type != "cpu"})
        if elsewhere:
            raise RuntimeError(
                f"fsdp_offload: AdamW updates the host shards of FSDP's CPU offload, but parameters are on "
                f"{', '.join(elsewhere)}; build the optimizer in configure_optimizers, once FSDP has wrapped the model"
            )
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        # not FSDPStrategy's list of names (get_registered_strategies): Lightning refuses those on a CPU when the
        # Trainer is built, and this strategy refuses what it cannot run itself, when fit starts
        strategy_registry.register(
            cls.strategy_name, cls,
            description="torch FSDP, FULL_SHARD, CPU offload: parameters, gradients and AdamW on the host (CUDA only)",
        )
