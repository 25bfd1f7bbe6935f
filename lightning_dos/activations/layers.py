"""Owns where layer boundaries are: forward hooks on the model's blocks, installed from outside the model.

The offloader needs to know, for each tensor saved for backward, which layer it belongs to: the last layers stay
on the device (``keep_last_layers``) and backward restores layers in reverse order. The model does not say; its
blocks are found by type or given as a list, and a forward pre-hook and a forward hook on each count them as the
forward pass runs through them. The types found by default are those a model package registers
(:func:`register_layer_type`: :mod:`lightning_dos.models` registers its GPT ``Block``), so this package imports no
model.

A tensor saved inside block ``i`` belongs to layer ``i``; one saved between blocks belongs to the next block to run
(under activation checkpointing that is the block's input, saved when ``checkpoint`` is entered, before the block
runs), and one saved after the last block (final norm, head, loss) to layer ``n_layers``: the "tail", which is
always kept, since backward needs it first. Blocks re-run by activation checkpointing's recomputation inside
backward are not counted. A block entered again after every block ran, or after backward began, starts a new pass
(a new micro-batch under the same hooks); a tensor's position is ``(pass, layer)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

import torch
from torch import nn

__all__ = ["LayerTracker", "default_layer_types", "find_layers", "register_layer_type"]

#: The block types found when none are given, in the order they were registered.
_DEFAULT_LAYER_TYPES: list[type[nn.Module]] = []


def register_layer_type(block_type: type[nn.Module]) -> None:
    """Make ``block_type`` one of the block types found when none are given (registering twice adds it once)."""
    if block_type not in _DEFAULT_LAYER_TYPES:
        _DEFAULT_LAYER_TYPES.append(block_type)


def default_layer_types() -> tuple[type[nn.Module], ...]:
    """The block types found when none are given: those registered, this package's GPT blocks
    (:mod:`lightning_dos.models` registers them when it is imported, as it is before any of its models exists)."""
    return tuple(_DEFAULT_LAYER_TYPES)


def find_layers(root: nn.Module, types: Optional[Sequence[type[nn.Module]]] = None) -> list[nn.Module]:
    """The outermost modules of ``types`` in ``root``, in registration order (a transformer's forward order)."""
    types = tuple(types) if types else default_layer_types()
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in root.modules():
        if id(module) in inside:
            continue
        if isinstance(module, types):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def _in_backward() -> bool:
    # a graph task is running on this thread: activation checkpointing is recomputing a block inside backward
    return torch._C._current_graph_task_id() != -1


class LayerTracker:
    """Counts the forward pass through ``layers`` and says which layer a tensor saved now belongs to."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.layers = list(layers)
        self.n_layers = len(self.layers)
        self._handles: list[Any] = []
        self.pass_id = 0
        self._started = 0  # blocks entered in this pass
        self._current: Optional[int] = None  # block running now, if any
        self._backward_seen = False

    def install(self) -> None:
        if self._handles:
            return
        for module in self.layers:
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._exit))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def new_pass(self) -> None:
        """Start counting a new forward pass (the hooks' owner calls it at the start of every step)."""
        self.pass_id += 1
        self._started = 0
        self._current = None
        self._backward_seen = False

    def backward_started(self) -> None:
        self._backward_seen = True

    def position(self) -> tuple[int, int]:
        """``(pass, layer)`` of a tensor saved now: the running block, else the next one (``n_layers``: the tail)."""
        layer = self._current if self._current is not None else self._started
        return self.pass_id, min(layer, self.n_layers)

    def _enter(self, module: nn.Module, args: Any) -> None:
        if _in_backward():
            return
        if self._started >= self.n_layers or self._backward_seen:
            self.new_pass()
        self._current = self._started
        self._started += 1

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if _in_backward():
            return
        self._current = None


def as_layers(layers: Union[nn.Module, Iterable[nn.Module]], types: Optional[Sequence[type[nn.Module]]] = None
              ) -> list[nn.Module]:
    """``layers`` as a list of blocks: a module is searched for blocks of ``types``; a sequence is taken as given."""
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.ModuleList, nn.Sequential)):
        return find_layers(layers, types)
    return list(layers)
