"""Owns the update of the resident subgroups: those whose optimizer state lives on the device (``resident_gib``).

A resident subgroup's fp32 master and both moments live in device memory, their one home
(:mod:`lightning_dos.planning.placement`); its update is fused Adam on the device, on the executor's ``adam`` stream,
with no prefetch and no flush, so it never crosses the host-device link and takes no CPU Adam time. The plan balances
the other subgroups across the two lanes.

The arithmetic is the device lane's (:mod:`lightning_dos.update.device_adam`): the gradient widened to fp32 chunk by
chunk through one scratch buffer, multiplied by the same unscale/clip factor, fused Adam with the param group's current
hyperparameters, the 16-bit params written from the new master. No DeepSpeed import here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_dos.planning.placement import RESIDENT_BYTES_PER_PARAM
from lightning_dos.update.device_adam import adam, adam_widened, scratch_for
from lightning_dos.update.subgroup import Subgroup


class ResidentUpdate:
    """Updates the resident subgroups in place, where they live.

    Args:
        ids: the resident subgroups' ids.
        sizes: every subgroup's parameter count (indexed by id).
        device: where their state lives (on a machine without an accelerator the host stands in).
    """

    def __init__(self, ids: Sequence[int], sizes: Sequence[int], device: torch.device) -> None:
        self.ids = tuple(ids)
        self.device = torch.device(device)
        self.params = sum(sizes[i] for i in self.ids)
        self._largest = max((sizes[i] for i in self.ids), default=0)
        self._scratch: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Device bytes their state takes."""
        return RESIDENT_BYTES_PER_PARAM * self.params

    @torch.no_grad()
    def step(self, subgroups: Sequence[Subgroup], inv_scale: torch.Tensor | float) -> None:
        """Issue every resident subgroup's update on the current stream (the caller picks it)."""
        if not self.ids:
            return
        inv = torch.as_tensor(inv_scale, dtype=torch.float32).to(self.device)
        unit = float(inv_scale) == 1.0
        for i in self.ids:
            sg = subgroups[i]
            if sg.master.device != self.device:
                raise RuntimeError(f"subgroup {i} is resident but its state lives on {sg.master.device}")
            step = torch.full((), float(sg.state["step"] + 1), dtype=torch.float32, device=self.device)
            grad = sg.grad.reshape(-1)
            if grad.dtype == torch.float32 and grad.device == self.device:  # kept in fp32: used in place
                if not unit:
                    grad.mul_(inv)
                adam(sg, sg.master, grad, sg.exp_avg, sg.exp_avg_sq, step)
            else:
                if self._scratch is None:
                    self._scratch = scratch_for(self._largest, self.device)
                adam_widened(sg, sg.master, grad, sg.exp_avg, sg.exp_avg_sq, step, self._scratch, inv, unit)
            sg.param16.copy_(sg.master)
            sg.state["step"] += 1


def resident_bytes(sizes: Sequence[int], ids: Sequence[int]) -> int:
    """Device bytes the state of subgroups ``ids`` takes when they are resident."""
    return RESIDENT_BYTES_PER_PARAM * sum(sizes[i] for i in ids)
