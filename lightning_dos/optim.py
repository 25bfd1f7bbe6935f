"""Owns the choice of AdamW implementation for a LightningModule's ``configure_optimizers``.

A strategy that brings its own optimizer (torchao's ``CPUOffloadOptimizer`` under ``torchao_offload``,
``ZenFlowCPUAdam`` under ``zenflow``, fused torch AdamW over the host shards under ``fsdp_offload``:
:class:`ProvidesAdamW`) builds it; under any other DeepSpeed strategy that
offloads the optimizer, ZeRO needs DeepSpeed's ``DeepSpeedCPUAdam`` (DeepSpeed refuses a plain torch optimizer;
``deep_optimizer_states`` and ``zero3_offload`` convert torch's Adam/AdamW themselves:
:mod:`lightning_dos.strategies.torch_optimizers`); everywhere else a torch AdamW is right. Models call
:func:`adamw` and stay ignorant of how they are trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import torch

#: The attribute that holds a parameter's whole shape where a sharding strategy flattens it in place (FSDP with
#: ``use_orig_params``: a 1-D view of this rank's shard), set by that strategy before it wraps the model.
FULL_SHAPE = "dos_full_shape"


@runtime_checkable
class ProvidesAdamW(Protocol):
    """A strategy that builds the AdamW its training needs (:func:`adamw` asks it first)."""

    def configure_adamw(
        self,
        param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> torch.optim.Optimizer:
        """AdamW with decoupled weight decay over ``param_groups``, as this strategy trains with it."""
        ...


def offloads_optimizer(trainer: Any) -> bool:
    """Whether ``trainer``'s strategy is DeepSpeed with the optimizer state offloaded to host memory."""
    strategy = getattr(trainer, "strategy", None)
    config = getattr(strategy, "config", None)
    if not isinstance(config, dict):
        return False
    offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return offload.get("device") in ("cpu", "nvme")


def weight_decay_groups(params: Iterable[torch.nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Param groups with decay for tensors of 2+ dims (matrices, embeddings) and none for norms and biases.

    Under ZeRO-3 the parameters are already partitioned when ``configure_optimizers`` runs (each one an empty
    1-D tensor), so the real number of dims is read from ``ds_shape``; under FSDP from :data:`FULL_SHAPE`. Empty
    groups are left out.
    """
    params = [p for p in params if p.requires_grad]
    ndim = {id(p): len(getattr(p, "ds_shape", getattr(p, FULL_SHAPE, p.shape))) for p in params}
    groups = [
        {"params": [p for p in params if ndim[id(p)] >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if ndim[id(p)] < 2], "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def adamw(
    trainer: Any,
    param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
    lr: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
) -> torch.optim.Optimizer:
    """AdamW with decoupled weight decay: the strategy's own when it provides one (:class:`ProvidesAdamW`),
    ``DeepSpeedCPUAdam`` when DeepSpeed offloads the optimizer, torch's otherwise (:func:`fuses` says which)."""
    strategy = getattr(trainer, "strategy", None)
    if isinstance(strategy, ProvidesAdamW):
        return strategy.configure_adamw(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if offloads_optimizer(trainer):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=fuses(trainer))


def fuses(trainer: Any) -> bool:
    """Whether torch's AdamW is the fused one: on a GPU, unless the Trainer clips gradients under Lightning's mixed
    precision, which refuses to clip for an optimizer that unscales its own gradients (fused does); torch's default
    (``foreach``) then."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    if not torch.cuda.is_available():
        return False
    clips = bool(getattr(trainer, "gradient_clip_val", None))
    return not (clips and isinstance(getattr(getattr(trainer, "strategy", None), "precision_plugin", None),
                                     MixedPrecision))
