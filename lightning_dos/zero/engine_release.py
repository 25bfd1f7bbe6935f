"""Lets a finished DeepSpeed engine be freed.

Three references keep an engine alive after ``Trainer.fit`` returns and the trainer is dropped (deepspeed 0.19.8):

- The ZeRO optimizer registers a hook on each parameter's gradient accumulator (an autograd node) and keeps the
  node in a list: optimizer -> node -> hook -> optimizer is a cycle through C++ that Python's collector cannot see.
- ZeRO-3's parameter offload pushes the model onto a module-level stack (``FWD_MODULE_STACK`` in
  ``deepspeed.runtime.zero.parameter_offload``) when it registers its hooks and never pops it; activation
  checkpointing's recomputation leaves submodules there too.
- Its parameter coordinator memoises, in a class-level ``functools.lru_cache`` keyed by coordinator and submodule,
  which parameters each submodule releases.

Through any of them the module, the engine and every buffer of the optimizer (the reduce bucket alone is
``reduce_bucket_size`` elements) stay alive for the life of the process: each ``Trainer.fit`` in one process (a
notebook, a sweep, a test suite) keeps every earlier one's engine, pinned host buffers included. After
:func:`release_engine` the engine is freed with the last reference a user holds (the trainer, the strategy or the
module, whose ZeRO-3 forward hooks stay); a new fit builds a new engine.
"""

from __future__ import annotations

from typing import Any

import torch


def forget_module(module: torch.nn.Module) -> int:
    """Drop ``module`` and its submodules from DeepSpeed's forward-module stack; return how many entries went.

    Besides the model pushed at start-up, a submodule can be left on the stack by a forward that pushed it and never
    reached its post-forward hook (activation checkpointing's recomputation does this).
    """
    from deepspeed.runtime.zero import parameter_offload

    stack = parameter_offload.FWD_MODULE_STACK
    owned = {id(m) for m in module.modules()}
    kept = [m for m in stack if id(m) not in owned]
    dropped = len(stack) - len(kept)
    stack[:] = kept
    return dropped


def clear_release_cache() -> None:
    """Empty the coordinator's memo of which parameters each submodule releases.

    The memo only saves recomputing a set from the recorded trace; an engine still in use recomputes what it needs
    at its next release (the order of releases may shift, the arithmetic does not).
    """
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    method = vars(PartitionedParameterCoordinator).get("_PartitionedParameterCoordinator__params_to_release")
    for cell in getattr(method, "__closure__", None) or ():  # DeepSpeed's NVTX wrapper around the lru_cache
        memo = cell.cell_contents
        if hasattr(memo, "cache_clear"):
            memo.cache_clear()
    if hasattr(method, "cache_clear"):
        method.cache_clear()


def remove_gradient_hooks(optimizer: Any) -> int:
    """Remove the ZeRO optimizer's gradient hooks (on the parameters' gradient accumulators, and on leaf modules);
    return how many there were.

    Training with this optimizer is over once they are gone: a later backward no longer reaches it.
    """
    count = 0
    for attribute in ("_grad_acc_hooks", "_leaf_module_hooks"):  # the second: leaf blocks' full backward hooks
        hooks = getattr(optimizer, attribute, None) or []
        for hook in hooks:
            hook.remove()
        count += len(hooks)
        hooks.clear()
    accumulators = getattr(optimizer, "grad_accs", None)
    if isinstance(accumulators, list):
        accumulators.clear()
    return count


def release_engine(engine: Any, module: torch.nn.Module) -> None:
    """Drop DeepSpeed's own references to ``engine`` (built around ``module``) so that it can be freed."""
    remove_gradient_hooks(getattr(engine, "optimizer", None))
    forget_module(module)
    clear_release_cache()
