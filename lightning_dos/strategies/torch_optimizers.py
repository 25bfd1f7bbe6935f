"""Owns taking torch's Adam and AdamW from a LightningModule's ``configure_optimizers`` as they are.

With the optimizer state offloaded, ZeRO-3 steps DeepSpeed's ``DeepSpeedCPUAdam`` and refuses a torch optimizer. A
module written for plain PyTorch returns ``torch.optim.AdamW(self.parameters(), ...)``; under
``deep_optimizer_states`` and ``zero3_offload`` :func:`adopt_optimizer` runs the same arithmetic instead: it builds
``DeepSpeedCPUAdam`` over the *same* param-group dicts (every group's ``lr``, ``betas``, ``eps`` and
``weight_decay`` as given; ``adamw_mode`` from torch's decoupled weight decay, so ``Adam(weight_decay=...)`` keeps its
L2 decay) and points the user's LR schedulers at it, so they drive the optimizer the engine steps and Lightning's
view (``trainer.optimizers``, ``lr_scheduler_configs``, ``LearningRateMonitor``, checkpoints) is that one.

Torch's ``foreach``, ``fused`` and ``capturable`` choose how the same update is computed, and are ignored (the host
lane is DeepSpeed's CPU Adam, the device lane torch's fused kernel). What this cannot run as written is refused
before training with one ``MisconfigurationException`` that names the optimizer and what to return instead:
another optimizer class (a subclass of Adam too: its step may differ), ``amsgrad``, ``maximize``, ``differentiable``,
hyperparameters given as tensors, and several optimizers. DeepSpeed's own host optimizers (``DeepSpeedCPUAdam``, what
:func:`lightning_dos.optim.adamw` returns, and its siblings) pass through unchanged, as does any optimizer when the
DeepSpeed config sets ``zero_force_ds_cpu_optimizer: false`` (DeepSpeed then steps it itself, on the host).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

__all__ = ["TAKEN", "adopt_optimizer", "configured_optimizers", "refusal"]

#: The torch optimizers taken as they are (exactly these classes).
TAKEN: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW)
#: Group keys holding a hyperparameter that must be a number, not a tensor.
_NUMBERS = ("lr", "eps", "weight_decay")
#: Torch's flags that change the arithmetic (or, ``differentiable``, what the step is for): refused.
_REFUSED_FLAGS = ("amsgrad", "maximize", "differentiable")
#: What to return instead, in every refusal.
_INSTEAD = ("return torch.optim.AdamW(...) or torch.optim.Adam(...) (amsgrad, maximize and differentiable off, "
            "hyperparameters as numbers), or lightning_dos.optim.adamw(self.trainer, ...)")


def _native(optimizer: torch.optim.Optimizer) -> bool:
    """DeepSpeed's own host optimizers, which ZeRO-Offload steps as they are."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    native: tuple[type, ...] = (DeepSpeedCPUAdam,)
    try:
        from deepspeed.ops.lion import DeepSpeedCPULion

        native += (DeepSpeedCPULion,)
    except ImportError:  # pragma: no cover - every 0.19 release has it
        pass
    return isinstance(optimizer, native)


def _decoupled(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether ``group`` decays weights decoupled (AdamW) rather than as L2 added to the gradient (Adam). torch >= 2.7
    keeps it in the group (``AdamW`` is ``Adam`` with it on); older torch says it by the class alone."""
    return bool(group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)))


def refusal(optimizer: Any, strategy: str) -> str | None:
    """Why ``strategy`` cannot run ``optimizer`` exactly as written (None: it can, converted or as it is)."""
    cls = type(optimizer)
    if cls not in TAKEN:
        if cls.__name__ == "_MockOptimizer":  # what Lightning puts in for configure_optimizers returning None
            what = "no optimizer"
        elif isinstance(optimizer, TAKEN):
            base = "AdamW" if isinstance(optimizer, torch.optim.AdamW) else "Adam"
            what = f"{cls.__module__}.{cls.__qualname__}, a subclass of torch's {base} whose step may differ from it,"
        else:
            what = f"{cls.__module__}.{cls.__qualname__}, an optimizer it does not implement,"
        return (f"configure_optimizers returned {what} and {strategy} runs torch's Adam and AdamW with its own update "
                f"(the optimizer state stays in host memory); {_INSTEAD}")
    groups = optimizer.param_groups
    problems = [f"{flag}=True" for flag in _REFUSED_FLAGS if any(group.get(flag) for group in groups)]
    for i, group in enumerate(groups):
        values = [(key, group.get(key)) for key in _NUMBERS]
        values += [(f"betas[{j}]", beta) for j, beta in enumerate(group["betas"])]
        problems += [f"param group {i}'s {key} as a tensor" for key, value in values if isinstance(value, torch.Tensor)]
    if len({_decoupled(optimizer, group) for group in groups}) > 1:
        problems.append("decoupled_weight_decay differing between param groups")
    if optimizer.state:
        problems.append("optimizer state already (it was stepped or loaded before training)")
    if not problems:
        return None
    return (f"configure_optimizers returned torch.optim.{cls.__name__} with {', '.join(problems)}, which {strategy} "
            f"does not run; {_INSTEAD}")


def adopt_optimizer(optimizer: Any, scheduler_configs: Sequence[Any], strategy: str,
                    force_ds_cpu_optimizer: bool = True) -> Any:
    """The optimizer ZeRO-3 with the optimizer state offloaded is to step for ``optimizer`` (see the module docstring):
    ``DeepSpeedCPUAdam`` over the same param groups for torch's Adam/AdamW, with every scheduler in
    ``scheduler_configs`` (Lightning's ``LRSchedulerConfig``s) pointed at it; DeepSpeed's own host optimizers as they
    are. Raises ``MisconfigurationException`` for anything else (unless ``force_ds_cpu_optimizer`` is off: DeepSpeed's
    ``zero_force_ds_cpu_optimizer: false``, which lets it step another optimizer on the host itself)."""
    if _native(optimizer):
        return optimizer
    problem = refusal(optimizer, strategy)
    if problem is not None:
        if not force_ds_cpu_optimizer and type(optimizer) not in TAKEN:
            return optimizer
        raise MisconfigurationException(problem)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    groups = optimizer.param_groups
    defaults = optimizer.defaults
    adamw_mode = _decoupled(optimizer, groups[0]) if groups else isinstance(optimizer, torch.optim.AdamW)
    # the same dicts: what the user's code (or a scheduler that kept the old optimizer) reads and writes, this steps
    taken = DeepSpeedCPUAdam(groups, lr=float(defaults["lr"]), betas=tuple(float(b) for b in defaults["betas"]),
                             eps=float(defaults["eps"]), weight_decay=float(defaults["weight_decay"]),
                             bias_correction=True, adamw_mode=adamw_mode)
    for config in scheduler_configs:
        _point_at(config.scheduler, optimizer, taken)
        if getattr(config, "name", "") is None:  # LearningRateMonitor logs under the user's optimizer's name
            config.name = f"lr-{type(optimizer).__name__}"
    return taken


def _point_at(scheduler: Any, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """Make ``scheduler`` (and the schedulers it chains: ``SequentialLR``, ``ChainedScheduler``) drive ``new``."""
    if getattr(scheduler, "optimizer", None) is old:
        scheduler.optimizer = new
    for inner in getattr(scheduler, "_schedulers", ()) or ():
        _point_at(inner, old, new)
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        _track_step_calls(new)


def _track_step_calls(optimizer: torch.optim.Optimizer) -> None:
    """What a torch LR scheduler does to the optimizer it is built on: mark its ``step`` so that the scheduler's
    order check (``optimizer.step()`` before ``lr_scheduler.step()``) sees the optimizer the engine steps."""
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return
    ref = weakref.ref(optimizer)
    func = step.__func__  # type: ignore[attr-defined]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True  # type: ignore[union-attr]
        return func.__get__(opt, opt.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]


def configured_optimizers(module: Any, strategy: str) -> tuple[Any, Any]:
    """The one optimizer and the LR scheduler config (or None) ``module.configure_optimizers`` returns, parsed and
    validated by Lightning; several of either are refused with a message saying what to return instead (DeepSpeed's
    engine steps one optimizer), also where Lightning would first suggest manual optimization."""
    from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers

    try:
        optimizers, schedulers = _init_optimizers_and_lr_schedulers(module)
    except (MisconfigurationException, RuntimeError) as error:
        if "multiple optimizers" not in str(error):
            raise
        raise MisconfigurationException(_several("several optimizers", strategy)) from error
    if len(optimizers) > 1 or len(schedulers) > 1:
        names = ", ".join(type(o).__name__ for o in optimizers)
        raise MisconfigurationException(
            _several(f"{len(optimizers)} optimizers ({names}) and {len(schedulers)} LR schedulers", strategy))
    return optimizers[0], schedulers[0] if schedulers else None


def _several(what: str, strategy: str) -> str:
    return (f"configure_optimizers returned {what}; {strategy} steps one optimizer (DeepSpeed's engine holds one): "
            "return a single torch.optim.AdamW over every param group (a dict per group for a different lr or "
            "weight_decay) with at most one LR scheduler")
