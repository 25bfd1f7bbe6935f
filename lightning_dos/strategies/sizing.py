"""Owns the memory plan of a run before it exists: ``lightning-dos plan`` sizes a recipe for a box in seconds.

The strategy itself prints the memory plan when its engine is built and again once the first forward and backward
have shown the training's peak (:mod:`lightning_dos.planning.placement`). Here the same two plans are made from the
model alone, on the meta device (no weights allocated): the parameters and how ZeRO-3 groups them into subgroups, the
16-bit parameters the device holds, and the activations, from the module's own ``activation_bytes(micro_batch,
seq_len)`` where it has one (:class:`~lightning_dos.models.GPTModule` does), else none (the plan is then the best
case, and says so). The box is this machine's GPU and host, or the sizes given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dos.planning.placement import (
    GIB,
    DeviceMemory,
    HostMemory,
    MemoryPlan,
    memory_plan,
    place,
    start_plan,
    zero3_subgroups,
)
from lightning_dos.strategies.dos import auto_sub_group_size, precision_param_bytes

#: Device memory held outside the training's allocator and by ZeRO-3's own buffers (CUDA context, communication
#: buffers, reduce and prefetch buckets), as this estimate counts it.
OTHER_BYTES = 2 * GIB
#: What a training process and the system take on the host besides the optimizer state, as this estimate counts it.
HOST_PROCESS_BYTES = 8 * GIB


@dataclass(frozen=True)
class Sizing:
    """A run sized for a box: the model's parameters, its subgroups on one rank, and the two memory plans."""

    params: int
    world_size: int
    sizes: list[int]
    device_params_bytes: int
    activation_bytes: int | None
    start: MemoryPlan
    after_first_step: MemoryPlan

    @property
    def fits(self) -> bool:
        return self.start.fits and self.after_first_step.fits

    def describe(self) -> str:
        acts = ("not estimated (the module has no activation_bytes): the plans are the best case"
                if self.activation_bytes is None else f"{self.activation_bytes / GIB:.2f} GiB (the module's estimate)")
        head = (f"{self.params:,} parameters over {self.world_size} rank(s): {len(self.sizes)} subgroups per rank, "
                f"largest {max(self.sizes):,}; the training's parameters on each device "
                f"{self.device_params_bytes / GIB:.2f} GiB, "
                f"activations {acts}")
        if self.fits:
            verdict = "the run fits this box"
        elif self.start.fits:  # the second plan's peak is an upper estimate; the strategy's is measured
            verdict = ("the run may NOT fit this box: it fits with the most the GPU could hold resident, not with the "
                       "estimated peak (an upper one); the strategy plans again from the measured peak after the first "
                       "forward and backward, and stops before its first update if it does not fit")
        else:
            verdict = "the run does NOT fit this box"
        return "\n".join([head, self.start.describe(), self.after_first_step.describe(), verdict])


def param_groups_numel(module: torch.nn.Module) -> list[list[int]]:
    """The trainable parameters' element counts in two groups, matrices and embeddings (weight decay) then the rest, as
    :func:`lightning_dos.optim.weight_decay_groups` forms them."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [[p.numel() for p in params if p.dim() >= 2], [p.numel() for p in params if p.dim() < 2]]
    return [group for group in groups if group]


def size_run(module: Any, world_size: int, sub_group_size: int | str, micro_batch: int, seq_len: int,
             device_bytes: int, host: HostMemory, param_bytes: int = 2, grad_bytes: int = 2,
             budget_bytes: int | None = None, resident_bytes: int | None = None,
             host_grad_bytes: int | None = None) -> Sizing:
    """The memory plans of ``module`` (a LightningModule whose ``configure_model`` builds it, or a built one) trained
    on ``world_size`` ranks with micro-batches of ``micro_batch`` x ``seq_len`` tokens, on devices of ``device_bytes``
    and the host ``host``: ``param_bytes`` and ``grad_bytes`` per parameter of the training's parameters and
    gradients, ``host_grad_bytes`` of a host home's gradient (default ``grad_bytes``; fp32 under gradient
    accumulation, see :func:`precision_bytes`). The module is built on the meta device: nothing is allocated."""
    host_grad = grad_bytes if host_grad_bytes is None else host_grad_bytes
    with torch.device("meta"):
        configure = getattr(module, "configure_model", None)
        if callable(configure):
            configure()
    groups = param_groups_numel(module)
    params = sum(sum(group) for group in groups)
    if sub_group_size == "auto":
        sub_group_size = auto_sub_group_size(math.ceil(params / world_size))
    sizes = zero3_subgroups(groups, world_size, int(sub_group_size))
    device_params = param_bytes * (params if world_size == 1 else math.ceil(params / world_size))
    estimate = getattr(module, "activation_bytes", None)
    activations = int(estimate(micro_batch, seq_len)) if callable(estimate) else None
    at_start = DeviceMemory(total=device_bytes, peak=device_params, other=OTHER_BYTES)
    start = start_plan(sizes, host, at_start, grad_bytes, budget_bytes, resident_bytes, host_grad_bytes=host_grad)
    candidates = start.placement.resident
    kept = grad_bytes * sum(sizes[i] for i in candidates)
    peak = device_params + (activations or 0) + kept
    measured = DeviceMemory(total=device_bytes, peak=min(peak, device_bytes), other=OTHER_BYTES)
    if resident_bytes is not None:
        placement = start.placement
    else:
        placement = place(sizes, measured, budget_bytes, candidates=candidates)
    when = ("after the first step: the peak estimated as the training's parameters, the activations and the "
            "candidates' gradients")
    after = memory_plan(sizes, placement, host, measured, when, host_grad_bytes=host_grad)
    return Sizing(params=params, world_size=world_size, sizes=sizes, device_params_bytes=device_params,
                  activation_bytes=activations, start=start, after_first_step=after)


def precision_bytes(precision: Any, accumulate_grad_batches: int = 1) -> tuple[int, int, int]:
    """Bytes per parameter of a run's parameters, gradients and host homes' gradients under Lightning's ``precision``
    (:func:`~lightning_dos.strategies.dos.precision_param_bytes`), as the engine keeps them: a host home's gradient
    is the backward's own, fp32 under gradient accumulation (``accumulate_grad_batches`` > 1)."""
    width = precision_param_bytes(precision)
    return width, width, 4 if accumulate_grad_batches > 1 else width


def host_for(total_bytes: int, ranks: int, available_bytes: int | None = None) -> HostMemory:
    """A host of ``total_bytes``: what is available now on this one, or the total less what a training process and
    the system take (:data:`HOST_PROCESS_BYTES`) on another."""
    available = total_bytes - HOST_PROCESS_BYTES if available_bytes is None else available_bytes
    return HostMemory(total=total_bytes, available=max(0, available), ranks=ranks)


def world_of(devices: Any, num_nodes: int = 1) -> int:
    """Ranks of a trainer's ``devices`` (an int, a list of ids, or ``"auto"``/``-1``, taken as one) and nodes."""
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        count = len(devices)
    elif isinstance(devices, int) and devices > 0:
        count = devices
    elif isinstance(devices, str) and devices.isdigit():
        count = int(devices)
    else:
        count = 1
    return count * max(1, int(num_nodes))
