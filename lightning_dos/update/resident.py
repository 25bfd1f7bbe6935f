"""Owns the resident subgroups: optimizer state kept on the device for the whole run (``resident_gib``).

A resident subgroup's fp32 master and both moments live in device memory, allocated once when the manager starts;
its update is fused Adam on the device, on the executor's ``adam`` stream, with no prefetch and no flush, so it never
crosses the host-device link and takes no CPU Adam time. The plan balances the other subgroups across the two lanes.

The host homes (DeepSpeed's own tensors, which its checkpoint code reads) stay allocated, and are written only when
something reads them: the seam calls :meth:`ResidentState.flush` before every read of the optimizer state (a
checkpoint save, ``state_dict``, ``safe_get_*``) and :meth:`ResidentState.invalidate` after every write to it (a
checkpoint load, ``safe_set_*``); the next update phase then loads the device copies from the homes again. The device
copies are loaded from the homes at the first update phase, when the moments exist.

The arithmetic is the device lane's (:mod:`lightning_dos.update.device_adam`): the gradient widened to fp32 chunk by
chunk through one scratch buffer, multiplied by the same unscale/clip factor, fused Adam with the param group's current
hyperparameters, the 16-bit params written from the new master. No DeepSpeed import here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lightning_dos.planning.planner import RESIDENT_BYTES_PER_PARAM
from lightning_dos.update.device_adam import adam, adam_widened, scratch_for
from lightning_dos.update.subgroup import Subgroup


class ResidentState:
    """The device copies of the resident subgroups' optimizer state (see the module docstring).

    Args:
        ids: the resident subgroups' ids.
        sizes: every subgroup's parameter count (indexed by id).
        device: where the copies live (on a machine without an accelerator the host stands in for the device).
    """

    def __init__(self, ids: Sequence[int], sizes: Sequence[int], device: torch.device) -> None:
        self.ids = tuple(ids)
        self.device = torch.device(device)
        # one (3, numel) block per subgroup: master, exp_avg, exp_avg_sq
        self.blocks = {i: torch.empty((3, sizes[i]), dtype=torch.float32, device=self.device) for i in self.ids}
        self.loaded = False  # the device copies hold the homes' values (False until the first update phase)
        self.dirty = False  # the device copies are newer than the homes
        self._scratch: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Device bytes the copies take."""
        return sum(block.numel() * block.element_size() for block in self.blocks.values())

    @property
    def params(self) -> int:
        return sum(block.shape[1] for block in self.blocks.values())

    def __contains__(self, i: object) -> bool:
        return i in self.blocks

    # ------------------------------------------------------------------ homes <-> device copies
    @torch.no_grad()
    def load(self, subgroups: Sequence[Subgroup]) -> None:
        """Copy the homes into the device copies, if they do not hold them already (a blocking copy: at the first
        update phase and after a write to the homes only)."""
        if self.loaded or not self.ids:
            return
        for i in self.ids:
            sg = subgroups[i]
            for row, home in zip(self.blocks[i], (sg.master, sg.exp_avg, sg.exp_avg_sq)):
                row.copy_(home.reshape(-1))
        self.loaded, self.dirty = True, False

    @torch.no_grad()
    def flush(self, homes: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Write the device copies into the homes (``homes(i)``: subgroup ``i``'s master, exp_avg, exp_avg_sq), if
        they are newer; blocking. Call it with no update phase in flight."""
        if not self.dirty:
            return
        for i in self.ids:
            for home, row in zip(homes(i), self.blocks[i]):
                home.reshape(-1).copy_(row)
        self.dirty = False

    @torch.no_grad()
    def release(self, ids: Sequence[int], homes: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                ) -> None:
        """Give subgroups ``ids`` back to the host: their device copies written into their homes (``homes(i)``) if
        newer, then freed; the others stay. Blocking; call it with no update phase in flight."""
        ids = [i for i in ids if i in self.blocks]
        if not ids:
            return
        for i in ids:
            if self.dirty:
                for home, row in zip(homes(i), self.blocks[i]):
                    home.reshape(-1).copy_(row)
            del self.blocks[i]
        self.ids = tuple(i for i in self.ids if i in self.blocks)
        if not self.ids:
            self._scratch = None
            self.loaded = self.dirty = False

    def invalidate(self) -> None:
        """The homes were written: the next update phase loads the device copies from them again."""
        self.loaded = self.dirty = False

    # ------------------------------------------------------------------ the update
    @torch.no_grad()
    def step(self, subgroups: Sequence[Subgroup], inv_scale: torch.Tensor | float) -> None:
        """Issue every resident subgroup's update on the current stream (the caller picks it)."""
        if not self.ids:
            return
        self.load(subgroups)
        inv = torch.as_tensor(inv_scale, dtype=torch.float32).to(self.device)
        unit = float(inv_scale) == 1.0
        for i in self.ids:
            sg = subgroups[i]
            master, exp_avg, exp_avg_sq = self.blocks[i]
            step = torch.full((), float(sg.state["step"] + 1), dtype=torch.float32, device=self.device)
            grad = sg.grad.reshape(-1)
            if grad.dtype == torch.float32 and grad.device == self.device:  # kept in fp32: used in place
                if not unit:
                    grad.mul_(inv)
                adam(sg, master, grad, exp_avg, exp_avg_sq, step)
            else:
                if self._scratch is None:
                    self._scratch = scratch_for(max(b.shape[1] for b in self.blocks.values()), self.device)
                adam_widened(sg, master, grad, exp_avg, exp_avg_sq, step, self._scratch, inv, unit)
            sg.param16.copy_(master)
            sg.state["step"] += 1
        self.dirty = True


def resident_bytes(sizes: Sequence[int], ids: Sequence[int]) -> int:
    """Device bytes the resident copies of subgroups ``ids`` take."""
    return RESIDENT_BYTES_PER_PARAM * sum(sizes[i] for i in ids)
