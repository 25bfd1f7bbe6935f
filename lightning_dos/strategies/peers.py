"""Owns the peers a user could pick instead of DOS, as Lightning strategies (plain, torchao, SuperOffload, ZenFlow).

Each one is what its project ships, wired into Lightning the way a user would, so that a recipe runs under it with
one ``--config configs/strategy/<name>.yaml`` and the bench measures it beside vanilla offload, the static split, DOS
and ZeRO-3 without offload:

* ``plain`` (:class:`PlainStrategy`): no ZeRO, no offload: Lightning's single-device strategy, torch AdamW, fp32
  weights, gradients and optimizer state all on the one GPU (``bf16-mixed`` autocasts). The floor one GPU can reach.
* ``torchao_offload`` (:class:`TorchaoOffloadStrategy`): torchao's ``CPUOffloadOptimizer`` on one GPU: fp32
  parameters and gradients on the GPU, AdamW state and its update on the host. Single GPU, no gradient clipping.
* ``superoffload`` (:class:`SuperOffloadStrategy`): DeepSpeed's SuperOffload, ZeRO-3 offload with
  ``offload_optimizer.super_offload: true`` (NVIDIA CUDA GPUs only).
* ``zenflow`` (:class:`ZenFlowStrategy`): DeepSpeed's ZenFlow at ZeRO stage 2 with the optimizer offloaded. It is
  approximate: the update of the gradient columns it ranks unimportant is deferred.

Every refusal happens before anything is built (in the constructor, or in ``setup_environment`` where it needs the
Trainer), with one error naming the key and what to set instead. torchao is optional
(``pip install 'lightning-dos[peers]'``); without it the strategy still instantiates and refuses only when training
starts.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_dos.strategies.baselines import ZeRO3OffloadStrategy
from lightning_dos.strategies.deepspeed_base import (
    DeepSpeedBase,
    module_left_in_place,
    offload_config_problems,
    state_left_in_place,
)

#: How to install the optional peers (torchao); named by every error about a missing one.
PEERS_EXTRA = "pip install 'lightning-dos[peers]'"
#: The torchao release the extra asks for (its ``CPUOffloadOptimizer`` as described here).
TORCHAO_REQUIREMENT = "torchao>=0.18"
#: ZenFlowStrategy's defaults, as measured on the GPU host: the top 10% of gradient columns every step, the rest every
#: 4th, overlapped.
ZENFLOW_DEFAULTS: dict[str, Any] = {"topk_ratio": 0.1, "update_interval": 4, "overlap_step": True}
#: Precisions that leave the weights in fp32 (torchao's host AdamW updates fp32 copies of them).
FP32_WEIGHT_PRECISIONS = ("32-true", "bf16-mixed")


def _trainer_of(strategy: pl.strategies.Strategy) -> Optional[pl.Trainer]:
    """The Trainer running ``strategy``'s module, or None outside ``Trainer.fit`` and friends."""
    module = strategy.lightning_module
    if module is None:
        return None
    try:
        return module.trainer
    except RuntimeError:  # a module not attached to a Trainer
        return None


def _fitting(trainer: Optional[pl.Trainer]) -> bool:
    return trainer is not None and trainer.state.fn == TrainerFn.FITTING


class _OneDeviceStrategy(SingleDeviceStrategy):
    """Lightning's single-device strategy on the device the Trainer's ``accelerator`` and ``devices`` pick.

    Lightning's own ``SingleDeviceStrategy`` keeps the device it was built with (the CPU by default) whatever the
    Trainer says; this one exposes ``parallel_devices``, which the Trainer fills in, and trains on the first, after
    checking that there is only one.
    """

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        super().__init__(device="cpu", accelerator=accelerator, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.parallel_devices: Optional[list[torch.device]] = None  # the Trainer's accelerator connector sets it

    @property
    @override
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else self._root_device

    @override
    def teardown(self) -> None:
        # Lightning's, less its copy of the whole model to the host at the end (DOS's teardown skips it too): the
        # fp32 module on top of torchao_offload's host state can exhaust a host that held the training itself
        with module_left_in_place(self.lightning_module):
            super().teardown()

    def _check_one_device(self) -> None:
        devices = self.parallel_devices or []
        if len(devices) > 1:
            raise MisconfigurationException(
                f"devices: {self.strategy_name} trains on one device, got {len(devices)} "
                f"({', '.join(str(d) for d in devices)}); set devices: 1, or pick zero3_offload or "
                "deep_optimizer_states to train on several GPUs"
            )

    def _precision(self) -> str:
        return str(getattr(self.precision_plugin, "precision", "32-true"))


class PlainStrategy(_OneDeviceStrategy):
    """No ZeRO, no offload: everything on one device, the floor one GPU can reach when the model fits.

    Lightning's single-device strategy on the device the Trainer's accelerator picks. The model keeps fp32 weights;
    :func:`lightning_dos.optim.adamw` gives it torch's AdamW (fused on a GPU unless mixed precision clips:
    :func:`~lightning_dos.optim.fuses`), whose state lives on the same device;
    with ``precision: bf16-mixed`` Lightning autocasts the matmuls. Gradient clipping is Lightning's own. Memory:
    4 bytes per parameter each for the weights, the gradients and both Adam moments (16 B/param), plus activations:
    pick it when that fits on one GPU, as the speed every offloading strategy is measured against.

    Args:
        accelerator: set by the Trainer from its ``accelerator`` argument; leave it unset.
        checkpoint_io: Lightning's checkpoint plugin; unset keeps ``torch.save``.
        precision_plugin: unset lets the Trainer's ``precision`` choose; ``16-true`` and ``bf16-true`` are refused
            (they cast the weights to 16 bits, and this strategy keeps them in fp32).
    """

    strategy_name = "plain"

    @override
    def setup_environment(self) -> None:
        self._check_one_device()
        if self._precision() in ("16-true", "bf16-true"):
            raise MisconfigurationException(
                f"precision: plain keeps fp32 weights, but {self._precision()} casts them to 16 bits; set precision: "
                "bf16-mixed (autocast, fp32 weights) or 32-true"
            )
        super().setup_environment()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="one device, no ZeRO, no offload: torch AdamW, fp32 weights"
        )


def import_cpu_offload_optimizer() -> type:
    """torchao's ``CPUOffloadOptimizer`` class; ``ImportError`` naming the extra when torchao is missing."""
    try:
        module = importlib.import_module("torchao.optim")
    except ImportError as err:
        raise ImportError(
            f"torchao_offload needs torchao, which is not installed ({err}); {PEERS_EXTRA} "
            f"(or pip install '{TORCHAO_REQUIREMENT}')"
        ) from err
    optimizer = getattr(module, "CPUOffloadOptimizer", None)
    if optimizer is None:
        raise ImportError(
            f"torchao_offload needs torchao's CPUOffloadOptimizer, which this torchao lacks; {PEERS_EXTRA} "
            f"(or pip install -U '{TORCHAO_REQUIREMENT}')"
        )
    return optimizer


class TorchaoOffloadStrategy(_OneDeviceStrategy):
    """torchao's ``CPUOffloadOptimizer`` on one GPU: the AdamW state and its update on the host, the rest on the GPU.

    Lightning's single-device strategy; :func:`lightning_dos.optim.adamw` returns
    ``CPUOffloadOptimizer(param_groups, torch.optim.AdamW, lr=..., betas=..., eps=..., weight_decay=...)``. torchao
    keeps the fp32 parameters and gradients on the GPU (8 B/param there), copies each gradient to pinned host memory
    on a side stream from a post-accumulate-grad hook as soon as the backward produces it, and in ``step()`` runs
    fused CPU AdamW per parameter on fp32 host copies (another 16 B/param of host memory: parameter, gradient, two
    moments) and copies each updated parameter back. Tensors under 4,096 elements (norms, biases) stay on the GPU
    with torch AdamW. Use ``precision: bf16-mixed`` (autocast over fp32 weights) or ``32-true``.

    Limits, each refused before anything is built:

    * **No gradient clipping.** The optimizer's ``param_groups`` are the host copies, so Lightning's clipping would
      compute the norm of, and scale, host gradients whose copies may still be in flight: silently wrong. Set
      ``trainer.gradient_clip_val: null`` (``configs/strategy/torchao_offload.yaml`` does).
    * **Single GPU**: ``devices: 1``; torchao's optimizer has no notion of ranks.
    * **CUDA only**: torchao's optimizer asserts a CUDA (or XPU) device when it is built.
    * **torchao installed**: ``pip install 'lightning-dos[peers]'``; without it this class still instantiates (so a
      recipe composes with its config on any machine) and refuses when ``fit`` starts.

    Lightning moves every optimizer's state to the root device at setup and to the CPU at teardown; this strategy
    skips both moves, which would put torchao's host state on the GPU (and ``CPUOffloadOptimizer`` has no ``state``).

    Args:
        accelerator: set by the Trainer from its ``accelerator`` argument; leave it unset.
        checkpoint_io: Lightning's checkpoint plugin; unset keeps ``torch.save``.
        precision_plugin: unset lets the Trainer's ``precision`` choose (``bf16-mixed`` or ``32-true``).
    """

    strategy_name = "torchao_offload"

    @override
    def setup_environment(self) -> None:
        trainer = _trainer_of(self)
        clip = None if trainer is None else trainer.gradient_clip_val
        if _fitting(trainer) and clip:
            raise MisconfigurationException(
                f"gradient_clip_val: {clip} cannot be honoured by torchao_offload: torchao's CPUOffloadOptimizer "
                "hands Lightning host gradients whose copies from the GPU may still be in flight when Lightning "
                "clips them, so the clip would be silently wrong; set trainer.gradient_clip_val: null "
                "(configs/strategy/torchao_offload.yaml does), or pick a strategy that clips (zero3_offload, "
                "deep_optimizer_states, plain)"
            )
        self._check_one_device()
        if self._precision() not in FP32_WEIGHT_PRECISIONS:
            raise MisconfigurationException(
                f"precision: torchao_offload updates fp32 host copies of fp32 weights, got {self._precision()}; set "
                f"precision: {' or '.join(FP32_WEIGHT_PRECISIONS)}"
            )
        if _fitting(trainer):
            try:
                import_cpu_offload_optimizer()
            except ImportError as err:
                if not self._on_cuda():  # the next thing the user would hit: say it now
                    raise ImportError(f"{err}; it also needs a CUDA GPU, and got device {self.root_device}") from err
                raise
        self._require_cuda()
        super().setup_environment()

    def _on_cuda(self) -> bool:
        return self.root_device.type == "cuda" and torch.cuda.is_available()

    def _require_cuda(self) -> None:
        """Refuse any device but a CUDA GPU (torchao's optimizer asserts one when it is built)."""
        if not self._on_cuda():
            raise MisconfigurationException(
                f"accelerator: torchao_offload needs a CUDA GPU (torchao's CPUOffloadOptimizer copies gradients on a "
                f"CUDA stream), got device {self.root_device}; set accelerator: gpu on a GPU host, or pick plain or "
                "zero3_offload on a CPU"
            )

    def configure_adamw(
        self,
        param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> torch.optim.Optimizer:
        """torchao's ``CPUOffloadOptimizer`` over torch AdamW (what :func:`lightning_dos.optim.adamw` returns here)."""
        optimizer_class = import_cpu_offload_optimizer()
        return optimizer_class(list(param_groups), torch.optim.AdamW, lr=lr, betas=betas, eps=eps,
                               weight_decay=weight_decay)

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        # Strategy.setup less its last step, which moves the optimizer's state to the root device
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.model = self._setup_model(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    @override
    def teardown(self) -> None:
        with state_left_in_place(self):
            super().teardown()

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        # Strategy's, less the move of the loaded state to the root device: torchao's AdamW state lives on the host
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            optimizer.load_state_dict(state)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls,
            description="torchao's CPUOffloadOptimizer on one GPU: AdamW state and update on the host, no clipping",
        )


class SuperOffloadStrategy(ZeRO3OffloadStrategy):
    """DeepSpeed's SuperOffload: ZeRO-3 optimizer offload with ``offload_optimizer.super_offload: true``.

    DeepSpeed builds its ``SuperOffloadOptimizer_Stage3``, which runs CPU Adam in a separate process started with
    ``spawn`` (on ``cpuadam_cores_perc`` of this process's cores) and overlaps the host update of each subgroup with
    the rest of the backward. With gradient clipping (the recipes set ``gradient_clip_val: 1.0``) it must know the
    global norm before any update and takes its synchronous path; ``gradient_clip_val: null`` measures its overlapped
    one. The model and the optimizer come from the module as under ``zero3_offload`` (DeepSpeed's CPU Adam).

    Limits: NVIDIA CUDA GPUs only (DeepSpeed asserts it when it builds the optimizer; refused here before the model
    is built). ``spawn`` re-imports the launching script in the optimizer process: a script of your own must keep
    its training under ``if __name__ == "__main__":`` (``lightning-dos fit`` and the bench's worker do).

    Args:
        cpuadam_cores_perc: share of this process's CPU cores given to the CPU Adam process (DeepSpeed's default 0.8).
        sub_group_size: parameters per subgroup, as for ``zero3_offload``.
        pin_memory: page-locked host buffers for the offloaded state.
        stage, offload_optimizer: must stay 3 and True (SuperOffload is a ZeRO-3 offload mode); they exist so that a
            mistaken override is refused instead of ignored.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``; ``ratio`` (the static split) is refused.
    """

    strategy_name = "superoffload"

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        cpuadam_cores_perc: float = 0.8,
        sub_group_size: int = 100_000_000,
        pin_memory: bool = True,
        stage: int = 3,
        offload_optimizer: bool = True,
        **kwargs: Any,
    ) -> None:
        if "ratio" in kwargs:
            raise MisconfigurationException(
                f"ratio: superoffload keeps all of the optimizer state on the host, got ratio={kwargs['ratio']}; "
                "remove ratio (DeepSpeed's static split is static_split_R)"
            )
        if isinstance(cpuadam_cores_perc, bool) or not 0.0 < cpuadam_cores_perc <= 1.0:
            raise ValueError(
                f"cpuadam_cores_perc: {cpuadam_cores_perc!r} must be a share of the CPU cores in (0, 1], e.g. 0.8"
            )
        super().__init__(accelerator=accelerator, ratio=1.0, sub_group_size=sub_group_size, pin_memory=pin_memory,
                         stage=stage, offload_optimizer=offload_optimizer, **kwargs)
        self.cpuadam_cores_perc = float(cpuadam_cores_perc)
        offload = (self.config.get("zero_optimization") or {}).get("offload_optimizer")
        if not isinstance(offload, dict) or offload.get("device") != "cpu":
            raise MisconfigurationException(
                "zero_optimization.offload_optimizer: superoffload offloads the optimizer state to the CPU; set "
                "offload_optimizer.device: cpu in the DeepSpeed config (or pass none)"
            )
        offload["super_offload"] = True
        offload["cpuadam_cores_perc"] = self.cpuadam_cores_perc

    @override
    def setup_environment(self) -> None:
        if self.root_device.type != "cuda":
            raise MisconfigurationException(
                f"accelerator: superoffload runs on NVIDIA CUDA GPUs only (DeepSpeed's SuperOffloadOptimizer_Stage3 "
                f"asserts it), got device {self.root_device}; set accelerator: gpu on a GPU host, or pick "
                "zero3_offload or deep_optimizer_states on a CPU"
            )
        super().setup_environment()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DeepSpeed SuperOffload: ZeRO-3 offload with super_offload (CUDA only)"
        )


class ZenFlowStrategy(DeepSpeedBase):
    """DeepSpeed's ZenFlow at ZeRO stage 2, the optimizer offloaded: an approximate, stall-free offload.

    Every step ZenFlow updates on the GPU only the ``topk_ratio`` of gradient columns it ranks important, and
    accumulates the rest for the host, which applies them every ``update_interval`` steps (overlapped with the next
    steps' forward and backward in a ``spawn``-ed process when ``overlap_step``). It is **not the same arithmetic as
    AdamW**: the update of the "unimportant" columns is deferred, so its losses are expected to differ from every
    other row's. DeepSpeed's own optimizer runs (its ZeRO-2 ZenFlow optimizer around ``ZenFlowCPUAdam``, which
    :func:`lightning_dos.optim.adamw` returns here), not the DOS one.

    Limits: ZeRO stage 2 only (at stage 3, DeepSpeed 0.19's ZenFlow crashed in the first forward on a GPU: it
    transposes every 2-D parameter, the embedding too, and a gather index runs out of bounds); slow on the GPU host
    where it was measured; ``accumulate_grad_batches`` must stay 1 (ZenFlow takes over DeepSpeed's gradient
    accumulation steps for its update interval). It runs on CPUs too (DeepSpeed's CPU accelerator). With
    ``overlap_step`` the optimizer process re-imports the launching script: keep a script's training under
    ``if __name__ == "__main__":``, and note that ZenFlow pins this process to part of its CPU cores.

    A defect of DeepSpeed 0.19.8 at stage 2, observed on a CPU (``tests/integration/test_peers.py``) and in code that is
    the same on a GPU; a warning repeats it when the engine is built: ZenFlow's flatten lays every 2-D parameter out
    transposed in the flat buffer, and ``DeepSpeedZeroOptimizer._update_model_bit16_weights`` views it back without
    transposing, so the weights that train are each matrix's initial values in transposed order (weights loaded before
    ``fit``, such as pretrained ones, are not the weights trained), and the deferred host updates land on the transposed
    positions of the weights the forward uses: overfitting one batch for 40 steps, AdamW went from a loss of 4.7 to
    0.7, ZenFlow with every column updated every step (``update_interval: 1``) to 3.7. Read its row as DeepSpeed's
    ZenFlow as shipped, not as what the method can do.

    Args:
        topk_ratio: share of gradient columns updated every step, in (0, 1).
        update_interval: steps between the host's updates of the other columns (>= 1).
        overlap_step: run the host update in a separate process, overlapped with training (else in line).
        pin_memory: page-locked host buffers for the offloaded state.
        stage, offload_optimizer: must stay 2 and True; they exist so that a mistaken override is refused.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``. With ``config`` (a DeepSpeed config dict
            or path), the settings above fill a ``zenflow`` section it leaves out; it must keep ZeRO stage 2 with
            ``offload_optimizer.device: cpu``.
    """

    strategy_name = "zenflow"

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        topk_ratio: float = 0.1,
        update_interval: int = 4,
        overlap_step: bool = True,
        pin_memory: bool = True,
        stage: int = 2,
        offload_optimizer: bool = True,
        **kwargs: Any,
    ) -> None:
        if isinstance(topk_ratio, bool) or not 0.0 < topk_ratio < 1.0:
            raise ValueError(f"topk_ratio: {topk_ratio!r} must be a share of gradient columns in (0, 1), e.g. 0.1")
        if isinstance(update_interval, bool) or not isinstance(update_interval, int) or update_interval < 1:
            raise ValueError(f"update_interval: {update_interval!r} must be a whole number of steps >= 1, e.g. 4")
        if stage != 2:
            raise MisconfigurationException(
                f"stage: zenflow runs at ZeRO stage 2, got {stage} (at stage 3 DeepSpeed 0.19's ZenFlow crashes in "
                "the first forward); set stage: 2"
            )
        if not offload_optimizer:
            raise MisconfigurationException(
                "offload_optimizer: zenflow offloads the optimizer state to the host; set offload_optimizer: true"
            )
        if isinstance(kwargs.get("config"), dict):
            kwargs["config"] = copy.deepcopy(kwargs["config"])  # filled in below: the caller's dict stays as given
        super().__init__(accelerator=accelerator, stage=2, offload_optimizer=True, pin_memory=pin_memory, **kwargs)
        self.topk_ratio = float(topk_ratio)
        self.update_interval = int(update_interval)
        self.overlap_step = bool(overlap_step)
        zero = self.config.get("zero_optimization")
        if isinstance(zero, dict):
            zero.setdefault("zenflow", {"topk_ratio": self.topk_ratio, "update_interval": self.update_interval,
                                        "overlap_step": self.overlap_step})
            self.overlap_step = bool(zero["zenflow"].get("overlap_step", False))
        validate_zenflow_config(self.config)

    @override
    def setup_environment(self) -> None:
        trainer = _trainer_of(self)
        if _fitting(trainer) and trainer.accumulate_grad_batches != 1:
            raise MisconfigurationException(
                f"accumulate_grad_batches: {trainer.accumulate_grad_batches} under zenflow, which takes over "
                "DeepSpeed's gradient accumulation for its update interval; set accumulate_grad_batches: 1"
            )
        super().setup_environment()

    @override
    def after_initialize(self, engine: Any, optimizer: Any) -> None:
        rank_zero_warn(
            "zenflow: DeepSpeed 0.19's ZenFlow lays every 2-D parameter out transposed while the parameter keeps its "
            "shape: the weights that train are the initial ones in transposed order (weights loaded before fit are "
            "not the ones trained), and its deferred host updates land on transposed positions; see ZenFlowStrategy"
        )

    def configure_adamw(
        self,
        param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> torch.optim.Optimizer:
        """DeepSpeed's ``ZenFlowCPUAdam`` (AdamW mode), the host optimizer ZenFlow's ZeRO optimizer drives."""
        from deepspeed.ops.adam import ZenFlowCPUAdam

        return ZenFlowCPUAdam(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True,
                              overlap_step=self.overlap_step)

    @override
    def _setup_model_and_optimizer(
        self,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        lr_scheduler: Any = None,
    ) -> tuple[Any, Any]:
        if optimizer is None:  # the optimizer is in the user's DeepSpeed config: DeepSpeed builds ZenFlowCPUAdam
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        from deepspeed.ops.adam import ZenFlowCPUAdam

        if not isinstance(optimizer, ZenFlowCPUAdam):
            raise TypeError(
                f"optimizer: zenflow drives DeepSpeed's ZenFlowCPUAdam, got {type(optimizer).__name__}; build it with "
                "lightning_dos.optim.adamw(self.trainer, ...) in configure_optimizers"
            )
        # ZenFlow's GPU-side selective AdamW reads its hyperparameters from the config's optimizer section (with none,
        # DeepSpeed crashes); Lightning must not see one, or it would stop calling configure_optimizers
        defaults = optimizer.defaults
        params = {"lr": defaults["lr"], "betas": list(defaults["betas"]), "eps": defaults["eps"],
                  "weight_decay": defaults["weight_decay"]}
        config = self.config
        self.config = {**config, "optimizer": {"type": "AdamW", "params": params}}
        try:
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        finally:
            self.config = config

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DeepSpeed ZenFlow at ZeRO-2, optimizer offloaded (approximate AdamW)"
        )


def validate_zenflow_config(config: Optional[dict[str, Any]]) -> None:
    """Raise one ``MisconfigurationException`` listing every way ``config`` cannot run ZenFlow here."""
    problems = offload_config_problems(config, stage=2)
    zero = (config or {}).get("zero_optimization")
    if isinstance(zero, dict) and not isinstance(zero.get("zenflow"), dict):
        problems.append("zero_optimization.zenflow: missing; set topk_ratio, update_interval and overlap_step")
    if problems:
        raise MisconfigurationException("zenflow: " + "; ".join(problems))
