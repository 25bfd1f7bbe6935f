"""ZeRO-3 hooks per transformer block instead of per layer (DeepSpeed's z3 leaf modules).

ZeRO-3 registers four hooks on every submodule (fetch before its forward, release after it, the same around its
backward) and one on every parameter's gradient accumulator (reduce and partition the gradient). At gpt-2.7b that is
1,184 module hooks and 389 gradient hooks, run again for activation checkpointing's recomputation, whether or not
anything is fetched: on one rank, with every parameter kept whole, they fetch and release nothing and cost Python time
per module on the training thread.

Marking each repeated block as a *leaf* makes ZeRO-3 hook the block alone: its parameters are fetched together before
its forward and its gradients reduced together when its backward ends (a full backward hook on the block), 160 module
hooks and 5 gradient hooks at gpt-2.7b. The blocks are found as activation offload finds them
(:mod:`lightning_dos.blocks`: the children of the model's largest ``nn.ModuleList``, ``nn.Sequential`` or
``nn.ModuleDict`` of one block class, or what the strategy's ``layers`` / ``layer_types`` name); a block's own inner
lists (experts) stay inside it.

A block's full backward hook fires once the gradients of its *inputs* are computed; when no input requires a gradient
(a first block behind frozen embeddings) it fires before the block's parameter gradients exist, and DeepSpeed would
reduce zeros in their place. A forward pre-hook on each block refuses that case with one clear error instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from lightning_dos.blocks import BlockNames, BlockTypes, find_blocks, no_blocks_message, repeated_blocks

__all__ = ["mark_leaf_blocks", "repeated_blocks"]

#: The attribute a marked block keeps its input check's hook handle in (marking twice adds no second check).
_GUARD = "_dos_leaf_block_guard"


def mark_leaf_blocks(model: torch.nn.Module, layers: BlockNames = None, layer_types: BlockTypes = None) -> list[str]:
    """Mark every block of ``model`` (:func:`lightning_dos.blocks.find_blocks`: ``layers`` / ``layer_types`` override
    the rule) as a ZeRO-3 leaf module (before the engine is built) and guard its inputs; return the blocks' names
    (empty: the model has no repeated blocks, nothing changes). Overrides that find nothing raise ``ValueError``."""
    from deepspeed.utils import set_z3_leaf_module

    found = find_blocks(model, layers, layer_types)
    if not found and (layers or layer_types):
        raise ValueError(no_blocks_message(model, layer_types, what="leaf_blocks"))
    names = []
    for name, block in found:
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
