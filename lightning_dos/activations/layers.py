"""Owns where layer boundaries are: forward hooks on the model's blocks, installed from outside the model.

The offloader needs to know, for each tensor saved for backward, which layer it belongs to: the last layers stay
on the device (``keep_last_layers``) and backward restores layers in reverse order. The model does not say; its
blocks are found as ZeRO-3's leaf blocks are (:mod:`lightning_dos.blocks`: the children of the model's largest
``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` of one block class, or the modules of given types), or given
as a list, and a forward pre-hook and a forward hook on each count them as the forward pass runs through them.

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

from lightning_dos.blocks import BlockTypes, find_blocks

__all__ = ["LayerTracker", "as_layers", "find_layers"]


def find_layers(root: nn.Module, types: BlockTypes = None) -> list[nn.Module]:
    """The blocks of ``root`` in registration order (a transformer's forward order): the outermost modules of
    ``types`` (classes or class names), else its repeated blocks (:func:`lightning_dos.blocks.repeated_blocks`)."""
    return [module for _, module in find_blocks(root, layer_types=types)]


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


def as_layers(layers: Union[nn.Module, Iterable[nn.Module]], types: BlockTypes = None) -> list[nn.Module]:
    """``layers`` as a list of blocks: a module is searched for blocks of ``types``; a sequence is taken as given."""
    if isinstance(layers, nn.ModuleDict):
        return list(layers.values())
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.ModuleList, nn.Sequential)):
        return find_layers(layers, types)
    return list(layers)
