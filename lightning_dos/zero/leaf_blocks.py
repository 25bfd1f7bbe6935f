"""ZeRO-3 hooks per transformer block instead of per layer (DeepSpeed's z3 leaf modules).

ZeRO-3 registers four hooks on every submodule (fetch before its forward, release after it, the same around its
backward) and one on every parameter's gradient accumulator (reduce and partition the gradient). At gpt-2.7b that is
1,184 module hooks and 389 gradient hooks, run again for activation checkpointing's recomputation, whether or not
anything is fetched: on one rank, with every parameter kept whole, they fetch and release nothing and cost Python time
per module on the training thread.

Marking each repeated block as a *leaf* makes ZeRO-3 hook the block alone: its parameters are fetched together before
its forward and its gradients reduced together when its backward ends (a full backward hook on the block), 160 module
hooks and 5 gradient hooks at gpt-2.7b. The blocks are the modules of every ``nn.ModuleList`` that holds at least two
modules of one class with parameters, outermost first (a block's own inner lists, e.g. experts, stay inside it).

A block's full backward hook fires once the gradients of its *inputs* are computed; when no input requires a gradient
(a first block behind frozen embeddings) it fires before the block's parameter gradients exist, and DeepSpeed would
reduce zeros in their place. A forward pre-hook on each block refuses that case with one clear error instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

#: The attribute a marked block keeps its input check's hook handle in (marking twice adds no second check).
_GUARD = "_dos_leaf_block_guard"


def repeated_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of each repeated block of ``model``: the modules of an ``nn.ModuleList`` holding at least two
    modules of one class that own parameters; nothing inside a block already chosen is chosen again."""
    chosen: list[tuple[str, torch.nn.Module]] = []
    inside: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in inside or not isinstance(module, torch.nn.ModuleList):
            continue
        children = list(module.named_children())
        classes = {type(child) for _, child in children}
        if len(children) < 2 or len(classes) != 1 or not any(True for _ in children[0][1].parameters()):
            continue
        for child_name, child in children:
            chosen.append((f"{name}.{child_name}" if name else child_name, child))
            inside.update(id(m) for m in child.modules())
    return chosen


def mark_leaf_blocks(model: torch.nn.Module) -> list[str]:
    """Mark every repeated block of ``model`` as a ZeRO-3 leaf module (before the engine is built) and guard its
    inputs; return the blocks' names (empty: the model has no repeated blocks, nothing changes)."""
    from deepspeed.utils import set_z3_leaf_module

    names = []
    for name, block in repeated_blocks(model):
        set_z3_leaf_module(block, True)
        if getattr(block, _GUARD, None) is None:
            setattr(block, _GUARD, block.register_forward_pre_hook(_require_input_grad(name), with_kwargs=True))
        names.append(name)
    return names


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _require_input_grad(name: str) -> Any:
    def check(block: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in block.parameters()):
            return
        if not any(t.requires_grad for t in _tensors((args, kwargs))):
            raise RuntimeError(
                f"leaf_blocks: block {name!r} runs with gradients on, and none of its inputs requires a gradient "
                "(e.g. it follows frozen embeddings), so ZeRO-3 would reduce its gradients before they exist; "
                "set leaf_blocks: false on the strategy")

    return check
