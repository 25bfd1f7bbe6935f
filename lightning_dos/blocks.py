"""Owns where a model's repeated blocks are: the one rule that activation offload and ZeRO-3's leaf blocks share.

A transformer's blocks are the children of its largest ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict``
(torchtitan's choice) that holds at least two modules, all of one class, owning parameters. "Largest" counts parameters
(whole ones under ZeRO-3, whose partitioned parameters keep their size in ``ds_numel``); on a tie the outermost, the
first met, wins. The rule finds the blocks of this package's GPT (``blocks``), of torch's ``nn.TransformerEncoder``
(``layers``), of Hugging Face models (``model.layers``, ``transformer.h``), of nanoGPT's (``transformer.h``) and
torchtitan's (``layers``, a ``ModuleDict``), and of a stack written as ``nn.Sequential(*blocks)``; a block's own inner
lists (its experts, say) are never chosen, being smaller than the list that holds the block, and nothing inside a
chosen block is chosen again.

Two overrides, as the strategy, :class:`~lightning_dos.activations.ActivationOffload` and its callback take them:

- ``layer_types``: the blocks' classes, or their names (``"LlamaDecoderLayer"`` or the dotted path): the outermost
  modules of those classes, in registration order (a transformer's forward order);
- ``layers``: the name of the module holding the blocks (``"model.layers"``: its children), or the blocks' own names.

A model with no repeated blocks and no override has no blocks: ZeRO-3 then keeps its hooks on every layer, and
activation offload, which needs them, says so in one error that names what to set (:func:`no_blocks_message`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from torch import nn

__all__ = ["BlockNames", "BlockTypes", "block_override_problems", "find_blocks", "no_blocks_message",
           "repeated_blocks"]

#: ``layers``: the name of the module holding the blocks, or the blocks' names.
BlockNames = Optional[Union[str, Sequence[str]]]
#: ``layer_types``: block classes or their names.
BlockTypes = Optional[Sequence[Union[str, type]]]


#: The containers whose children may be a model's blocks (a ``ModuleDict`` in its insertion order, as it runs them).
_STACKS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _numel(module: nn.Module) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())


def repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of each block of ``model`` by the rule above (empty: no repeated blocks)."""
    best: Optional[tuple[int, str, list[tuple[str, nn.Module]]]] = None
    for name, container in model.named_modules():
        if not isinstance(container, _STACKS):
            continue
        children = list(container.named_children())
        if len(children) < 2 or len({type(child) for _, child in children}) != 1:
            continue
        if not any(True for _ in children[0][1].parameters()):
            continue
        size = _numel(container)
        if best is None or size > best[0]:
            best = (size, name, children)
    if best is None:
        return []
    _, name, children = best
    return [(f"{name}.{child_name}" if name else child_name, child) for child_name, child in children]


def _matches(module: nn.Module, types: Sequence[Union[str, type]]) -> bool:
    cls = type(module)
    for wanted in types:
        if isinstance(wanted, str):
            if wanted in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
                return True
        elif isinstance(module, wanted):
            return True
    return False


def blocks_of_types(model: nn.Module, types: Sequence[Union[str, type]]) -> list[tuple[str, nn.Module]]:
    """The outermost modules of ``types`` (classes, or class names) in ``model``, in registration order."""
    found: list[tuple[str, nn.Module]] = []
    inside: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        if _matches(module, types):
            found.append((name, module))
            inside.update(id(m) for m in module.modules())
    return found


def named_blocks(model: nn.Module, layers: Union[str, Sequence[str]]) -> list[tuple[str, nn.Module]]:
    """The blocks ``layers`` names in ``model``: one name is the module holding them (its children), several are the
    blocks themselves. Raises ``ValueError`` naming what is not there."""
    modules = dict(model.named_modules())
    names = [layers] if isinstance(layers, str) else list(layers)
    missing = [name for name in names if name not in modules]
    if missing:
        holders = [n for n, m in modules.items() if isinstance(m, _STACKS) and n][:5]
        raise ValueError(f"layers: {type(model).__name__} has no module named {', '.join(map(repr, missing))}; set "
                         f"the name of the module holding the blocks (e.g. {', '.join(map(repr, holders)) or 'none'}) "
                         "or the blocks' own names")
    if isinstance(layers, str):
        return [(f"{layers}.{child}", module) for child, module in modules[layers].named_children()]
    return [(name, modules[name]) for name in names]


def find_blocks(model: nn.Module, layers: BlockNames = None, layer_types: BlockTypes = None
                ) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of each block of ``model``: those ``layers`` names, else the outermost modules of
    ``layer_types``, else :func:`repeated_blocks`."""
    if layers:
        return named_blocks(model, layers)
    if layer_types:
        return blocks_of_types(model, list(layer_types))
    return repeated_blocks(model)


def no_blocks_message(model: nn.Module, layer_types: BlockTypes = None, what: str = "activation offload") -> str:
    """The error for a model in which no blocks were found: what was looked for, and what to set."""
    if layer_types:
        names = ", ".join(t if isinstance(t, str) else t.__name__ for t in layer_types)
        looked = f"no module of type {names}"
    else:
        looked = ("no repeated blocks (no nn.ModuleList, nn.Sequential or nn.ModuleDict holding two or more modules of "
                  "one class with parameters)")
    return (f"layers: found {looked} in {type(model).__name__}, and {what} needs the model's blocks; set layers (the "
            "name of the module holding the blocks, e.g. 'model.layers', or the blocks' names) or layer_types (their "
            "class or its name, e.g. 'LlamaDecoderLayer')")


def block_override_problems(layers: Any, layer_types: Any) -> list[str]:
    """One line, with its fix, for each way ``layers`` / ``layer_types`` are not what they must be (empty: fine)."""
    problems = []
    if layers is not None and not (isinstance(layers, str) and layers or _strings(layers)):
        problems.append(f"layers: {layers!r} is not a module name or a list of them; set e.g. 'model.layers' (the "
                        "module holding the blocks) or null")
    if layer_types is not None and (isinstance(layer_types, (str, type)) or not isinstance(layer_types, Iterable)
                                    or not list(layer_types)
                                    or not all(isinstance(t, (str, type)) and t for t in layer_types)):
        problems.append(f"layer_types: {layer_types!r} is not a list of block classes or class names; set e.g. "
                        "['LlamaDecoderLayer'] or null")
    return problems


def _strings(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(item, str) and item for item in value))
