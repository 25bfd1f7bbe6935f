"""Owns each subgroup's optimizer state in its one home (:class:`~lightning_dos.planning.placement.Home`).

Nothing is allocated for a subgroup's state before its home is chosen. Until then its fp32 partition
(``fp32_partitioned_groups_flat[i]``: the key of its optimizer state, and what DeepSpeed's checkpoint code saves) is an
empty placeholder, and its master weights are its 16-bit parameters widened, which is what DeepSpeed's
``_create_fp32_partitions`` would have copied to the host at start. :meth:`StateHomes.place` then gives each subgroup
its home: the placeholder's data becomes a tensor there (its identity stays), filled from the 16-bit parameters, or
from what a checkpoint load left in it; both moments are made there (zeros, or the loaded ones); a subgroup living on
the host also gets the gradient CPU Adam reads, in the dtype the backward sends (:meth:`StateHomes.host_grad_dtype`:
16 bits in bf16 or fp16 training, widened exactly as it is read, where vanilla keeps an fp32 copy). A subgroup
already placed elsewhere moves: each tensor is copied across and the old one freed, one subgroup at a time, so the
host never holds a subgroup twice for longer than its copy.

Host homes are ordinary host allocations page-locked in place
(:class:`~lightning_dos.update.host_memory.PinnedRegistry`:
exactly their bytes, where torch's pinned allocator would round each block up to a power of two); device homes are
allocations of the accelerator (on a machine without one, the host stands in).

A subgroup that will live on the host whatever the first step shows (the plan at start says which) gets one tensor
before placement: the gradient its first backward writes there (:meth:`StateHomes.make_host_gradients`); placement
keeps it, with the gradient in it, and makes the master and moments beside it. A run stopped at placement (the box
cannot hold it) has then allocated only those gradients.

A checkpoint loaded before placement (a resume) is not copied anywhere: each unplaced subgroup's placeholder takes the
loaded master tensor itself, so DeepSpeed's copy into it reads and writes the same memory and does nothing, and the
loaded moments stay as torch's optimizer puts them, on the host beside it; placement copies them into their homes. With
the checkpoint read through a memory map (:func:`~lightning_dos.zero.checkpoint_io.load_mapped`), they are the
checkpoint file's pages until then, not host memory in use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from deepspeed.accelerator import get_accelerator

from lightning_dos.planning.placement import Home
from lightning_dos.update.host_memory import PinnedRegistry

#: Elements widened from 16 bits per copy when a master is first made (a 64 MB fp32 transient at most).
_WIDEN_CHUNK = 16 * 1024 * 1024


class StateHomes:
    """The homes of one ZeRO-3 optimizer's subgroups: a mixin of
    :class:`~lightning_dos.zero.optimizer.InterleavedZeroOptimizer`, whose DeepSpeed lists it reads and writes."""

    fp32_partitioned_groups_flat: list[torch.Tensor]
    fp16_partitioned_groups_flat: list[torch.Tensor]
    fp16_partitioned_groups_flat_numel: list[int]
    fp16_partitioned_groups_flat_id: list[Any]
    master_weights_and_grads_dtype: torch.dtype
    gradient_accumulation_dtype: torch.dtype
    gradient_accumulation_steps: int
    offload_optimizer_pin_memory: bool
    optimizer: Any

    def _create_placeholders(self) -> None:
        """DeepSpeed's fp32 partitions as empty placeholders: no subgroup has state before it is placed."""
        self._dos_homes: list[Home | None] = [None] * len(self.fp16_partitioned_groups_flat)
        for i in range(len(self.fp16_partitioned_groups_flat)):
            ids = self.fp16_partitioned_groups_flat_id[i]
            placeholder = torch.empty(0, dtype=self.master_weights_and_grads_dtype)
            placeholder.ds_id = f"{ids[0]}_{ids[-1]}"
            placeholder.requires_grad = True  # as DeepSpeed's own partitions (an optimizer may look at it)
            self.fp32_partitioned_groups_flat.append(placeholder)
        for group in self.optimizer.param_groups:  # as vanilla: the partitions join their groups only around a step
            group["params"] = []

    # ------------------------------------------------------------------ what lives where
    @property
    def placed(self) -> bool:
        """Whether every subgroup has its home (its state then exists, in that home). Read at every step and, under
        gradient accumulation, at every parameter's boundary copy: kept by :meth:`place`, not recounted."""
        return bool(self.__dict__.get("_dos_placed"))

    def homes(self) -> tuple[Home | None, ...]:
        """Each subgroup's home (None: not placed yet)."""
        return tuple(self.__dict__.get("_dos_homes", ()))

    def home_bytes(self) -> dict[Home, int]:
        """Bytes of optimizer state and gradients held in each home now (the gradient of a host home included; a
        gradient kept on the device through backward is not state)."""
        out = {Home.DEVICE: 0, Home.HOST: 0}
        held = self.__dict__.get("_dos_host_grads", {})
        for i, home in enumerate(self.homes()):
            if home is None:  # a host gradient made before placement (make_host_gradients) is held there already
                early = held.get(i)
                out[Home.HOST] += early.numel() * early.element_size() if early is not None else 0
                continue
            master = self.fp32_partitioned_groups_flat[i]
            state = self.optimizer.state.get(master, {})
            tensors = [master, state.get("exp_avg"), state.get("exp_avg_sq"), self.update_grad(i)]
            out[home] += sum(t.numel() * t.element_size() for t in tensors if t is not None)
        return out

    def host_grad_dtype(self) -> torch.dtype:
        """The dtype of a host home's gradient: the one the backward sends (DeepSpeed's gradient accumulation dtype,
        the model's 16-bit dtype unless configured otherwise); fp32 when gradients accumulate over micro-batches
        (DeepSpeed's boundary copy then writes the master's fp32 ``.grad``)."""
        if self.gradient_accumulation_steps > 1:
            return self.master_weights_and_grads_dtype
        return self.gradient_accumulation_dtype

    def host_grad_bytes_per_param(self) -> int:
        """Bytes per parameter of a host home's gradient (:meth:`host_grad_dtype`)."""
        return self.host_grad_dtype().itemsize

    def update_grad(self, i: int) -> torch.Tensor | None:
        """The gradient subgroup ``i``'s update reads from its home (None where there is none): the master's ``.grad``,
        or, when it is 16-bit, the tensor held beside it (torch gives a tensor no ``.grad`` of another dtype)."""
        held = self.__dict__.get("_dos_host_grads", {}).get(i)
        return held if held is not None else self.fp32_partitioned_groups_flat[i].grad

    def _home_device(self, home: Home) -> torch.device:
        if home == Home.HOST:
            return torch.device("cpu")
        return torch.device(get_accelerator().current_device_name())

    def _pinned_registry(self) -> PinnedRegistry | None:
        """Where host homes are page-locked in place (None when not pinning, or with no CUDA device)."""
        if not (self.offload_optimizer_pin_memory and torch.cuda.is_available()):
            return None
        if "_dos_pinned" not in self.__dict__:
            self._dos_pinned = PinnedRegistry()
        return self._dos_pinned

    # ------------------------------------------------------------------ placing and moving
    @torch.no_grad()
    def make_host_gradients(self, ids: Iterable[int]) -> None:
        """Before placement, for the unplaced subgroups ``ids``, which will live on the host: only the gradient their
        first backward writes there (zeros, in :meth:`host_grad_dtype`, page-locked as a host home's). :meth:`place`
        keeps it and makes their master and moments. Nothing under gradient accumulation: DeepSpeed's whole-partition
        buffer takes those gradients, and its boundary copy places every subgroup before it writes theirs."""
        if self.gradient_accumulation_steps > 1:
            return
        held = self.__dict__.setdefault("_dos_host_grads", {})
        for i in ids:
            if self._dos_homes[i] is None and i not in held:
                held[i] = self._gradient_home(int(self.fp16_partitioned_groups_flat_numel[i]), Home.HOST)

    @torch.no_grad()
    def place(self, homes: Sequence[Home | None]) -> None:
        """Give subgroup ``i`` its home ``homes[i]``: allocate the state of those not placed yet there, move those
        placed elsewhere; None leaves a subgroup as it is. Subgroups going to the device go first: a move there frees
        host memory before any new host home is made."""
        if len(homes) != len(self.fp32_partitioned_groups_flat):
            raise ValueError(f"homes: {len(homes)} given for {len(self.fp32_partitioned_groups_flat)} subgroups")
        current = self._dos_homes
        for i in sorted(range(len(homes)), key=lambda k: homes[k] != Home.DEVICE):
            home = homes[i]
            if home is not None and current[i] != home:
                self._move(i, Home(home))
        self._dos_placed = None not in current

    def _move(self, i: int, home: Home) -> None:
        """Subgroup ``i``'s master, moments and gradient made in ``home`` from wherever they are (or begin)."""
        held = self.__dict__.setdefault("_dos_host_grads", {})
        unplaced = self._dos_homes[i] is None
        if unplaced and i in held and home != Home.HOST:
            raise RuntimeError(f"subgroup {i}: its gradient was made on the host before placement, so it lives there")
        master = self.fp32_partitioned_groups_flat[i]
        numel = int(self.fp16_partitioned_groups_flat_numel[i])
        state = self.optimizer.state.setdefault(master, {})
        new_master = self._allocate(numel, home, zero=False)
        if master.numel() == numel:  # placed elsewhere, or loaded before placement
            new_master.copy_(master.reshape(-1))
        else:  # the placeholder: DeepSpeed's initial master is the 16-bit partition widened (exact)
            source = self.fp16_partitioned_groups_flat[i]
            for start in range(0, numel, _WIDEN_CHUNK):
                n = min(_WIDEN_CHUNK, numel - start)
                new_master.narrow(0, start, n).copy_(source.narrow(0, start, n))
        previous = held.pop(i, None)
        early = previous if unplaced else None  # made before placement (make_host_gradients), written since: kept
        old = [master.data, master.grad, None if unplaced else previous]
        master.grad = None  # a gradient must be on its tensor's device: dropped before the data moves
        master.data = new_master
        for key in ("exp_avg", "exp_avg_sq"):
            loaded = state.get(key)
            moment = self._allocate(numel, home, zero=loaded is None)
            if loaded is not None:
                moment.copy_(loaded.reshape(-1))
                old.append(loaded)
            state[key] = moment
        state.setdefault("step", 0)
        grad = early if early is not None else self._gradient_home(numel, home)
        if grad is not None and grad.dtype != master.dtype:
            held[i] = grad
        else:
            master.grad = grad
        self._dos_homes[i] = home
        self._free(old)

    def _gradient_home(self, numel: int, home: Home) -> torch.Tensor | None:
        """The gradient a subgroup's update reads where its state lives: on the host, CPU Adam's (the backward copies
        it there, in :meth:`host_grad_dtype`); on the device none, the 16-bit one kept there through backward is read
        instead, unless gradients accumulate (DeepSpeed's own gradient path then writes an fp32 one at the
        boundary)."""
        if home == Home.HOST:
            return self._allocate(numel, home, zero=True, dtype=self.host_grad_dtype())
        if self.gradient_accumulation_steps > 1:
            return self._allocate(numel, home, zero=True)
        return None

    def _allocate(self, numel: int, home: Home, zero: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        device = self._home_device(home)
        tensor = torch.zeros(numel, dtype=dtype, device=device) if zero else torch.empty(
            numel, dtype=dtype, device=device)
        registry = self._pinned_registry()
        if home == Home.HOST and registry is not None:
            registry.pin(tensor)
        return tensor

    def _free(self, tensors: list[torch.Tensor | None]) -> None:
        """Unlock what this optimizer page-locked among ``tensors`` (their memory goes once the last reference does)."""
        registry = self._pinned_registry()
        if registry is None:
            return
        for tensor in tensors:
            if tensor is not None and tensor.device.type == "cpu" and tensor.numel():
                registry.unpin(tensor)

    # ------------------------------------------------------------------ checkpoints
    def _adopt_loaded_masters(self, saved: Sequence[torch.Tensor]) -> None:
        """Before DeepSpeed loads a checkpoint's masters: each unplaced subgroup's placeholder takes the loaded tensor
        itself (see the module docstring)."""
        for i, master in enumerate(self.fp32_partitioned_groups_flat):
            if self._dos_homes[i] is None and master.numel() != saved[i].numel():
                master.data = saved[i].data.to(self.master_weights_and_grads_dtype).reshape(-1)

    def _moment_homes(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The (exp_avg, exp_avg_sq) each placed subgroup's state lives in now (before a load replaces them)."""
        out = {}
        for i, master in enumerate(self.fp32_partitioned_groups_flat):
            state = self.optimizer.state.get(master, {})
            if self._dos_homes[i] is not None and "exp_avg" in state and "exp_avg_sq" in state:
                out[i] = (state["exp_avg"], state["exp_avg_sq"])
        return out

    def _restore_moment_homes(self, homes: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """After a load: the loaded moments of placed subgroups copied into their homes, so each subgroup keeps one
        copy, where it lives (torch's ``Optimizer.load_state_dict`` puts the checkpoint's tensors into the state)."""
        for i, (exp_avg, exp_avg_sq) in homes.items():
            state = self.optimizer.state.get(self.fp32_partitioned_groups_flat[i])
            if state is None or "exp_avg" not in state or "exp_avg_sq" not in state:
                raise RuntimeError("optimizer state lost its exp_avg/exp_avg_sq after loading a checkpoint")
            for key, home in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                if state[key] is not home:
                    home.copy_(state[key].reshape(home.shape))
                    state[key] = home
