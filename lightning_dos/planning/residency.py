"""Owns how much optimizer state stays resident on the device: ``resident_gib="auto"``, as arithmetic.

Resident subgroups keep their fp32 master and both moments on the device for the whole run (12 bytes per parameter):
they never cross the host-device link and take no CPU Adam time, so a resident subgroup is always at least as fast as
either lane. What limits them is memory. ``auto`` decides after the first forward and backward, when the training's
own peak is known (activations, 16-bit parameters, ZeRO-3's buffers: whatever the allocator held at its highest), and
keeps resident, in id order (the order the forward reads them), every subgroup that fits in what is left:

    room = total - other - peak - headroom - kept gradients - device-lane slots

* ``total``: the device's memory; ``other``: memory held outside the training's allocator (the CUDA context,
  communication buffers); ``peak``: the allocator's peak so far;
* ``headroom``: :data:`HEADROOM_SHARE` of ``total``, at least :data:`HEADROOM_MIN_BYTES`, for the allocator's
  fragmentation and what the first step did not show;
* kept gradients: every gradient of this rank's partition kept on the device from backward to the update (the device
  lane and the resident subgroups keep theirs; the first step, which sent them to the host, did not count them);
* device-lane slots: two pieces of the subgroups left to stream (:data:`SLOT_RESERVE_BYTES` at most).

With ``memory_budget_gib`` the room is also at most the budget less the slots: the budget covers everything DOS keeps
on the device for the optimizer state (resident subgroups, the device lane's slots and kept gradients).

Under memory pressure later (something else took device memory), :func:`residents_to_release` names the residents to
give back, newest first, until the headroom is free again.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .perf_model import PIECE_PARAMS, device_memory_bytes
from .plan import Lane, Plan, _check_sizes
from .planner import RESIDENT_BYTES_PER_PARAM

GIB = 1024**3
#: Share of the device's memory ``auto`` leaves free beyond the measured peak ...
HEADROOM_SHARE = 0.08
#: ... and at least this much.
HEADROOM_MIN_BYTES = 2 * GIB
#: Device-lane slots ``auto`` leaves room for at most: two slots of a whole piece, as the planner weighs them.
SLOT_RESERVE_BYTES = device_memory_bytes(Plan(lanes=(Lane.DEVICE,)), [PIECE_PARAMS])


@dataclass(frozen=True)
class DeviceMemory:
    """What the device's memory looked like after the first forward and backward, in bytes."""

    total: int
    """The device's memory."""
    peak: int
    """The most the training's allocator held at once so far (or holds reserved, if more)."""
    other: int
    """Memory held outside the allocator (CUDA context, communication buffers)."""

    def __post_init__(self) -> None:
        if min(self.total, self.peak, self.other) < 0:
            raise ValueError(f"device memory: negative figures in {self}")

    @property
    def headroom(self) -> int:
        return headroom_bytes(self.total)


def headroom_bytes(total: int) -> int:
    """The memory ``auto`` keeps free above the measured peak on a device of ``total`` bytes."""
    return max(HEADROOM_MIN_BYTES, int(HEADROOM_SHARE * total))


@dataclass(frozen=True)
class Residency:
    """``auto``'s decision: the resident subgroups and the arithmetic behind it (for the start-up line and logs)."""

    ids: tuple[int, ...]
    """The subgroups kept resident, in id order."""
    params: int
    """Their parameters."""
    room: int
    """Bytes of optimizer state that fitted (:func:`resident_room`)."""
    memory: DeviceMemory | None
    """The reading it was made from (None: no device to measure, nothing resident)."""

    @property
    def nbytes(self) -> int:
        return self.params * RESIDENT_BYTES_PER_PARAM

    def describe(self, n_subgroups: int) -> str:
        if self.memory is None:
            return "resident_gib=auto: no device memory to measure (the host stands in), no resident subgroups"
        m = self.memory
        head = (f"resident_gib=auto: peak {m.peak / GIB:.2f} GiB of {m.total / GIB:.2f} GiB after the first step "
                f"({m.other / GIB:.2f} GiB outside the allocator, {m.headroom / GIB:.2f} GiB headroom)")
        if not self.ids:
            return head + f"; room for {self.room / GIB:.2f} GiB of state: no subgroup fits, none resident"
        return (head + f"; {len(self.ids)} of {n_subgroups} subgroups ({self.params:,} params, "
                f"{self.nbytes / GIB:.2f} GiB) resident on the device")


def resident_room(memory: DeviceMemory, partition_params: int, grad_bytes_per_param: int,
                  budget_bytes: int | None = None, slot_bytes: int = SLOT_RESERVE_BYTES) -> int:
    """Bytes of optimizer state ``auto`` may keep resident (see the module docstring); never negative."""
    if partition_params < 0 or grad_bytes_per_param < 0 or slot_bytes < 0:
        raise ValueError("resident_room: sizes must be >= 0")
    kept_grads = partition_params * grad_bytes_per_param
    room = memory.total - memory.other - memory.peak - memory.headroom - kept_grads - slot_bytes
    if budget_bytes is not None:
        if budget_bytes < 0:
            raise ValueError(f"memory budget: {budget_bytes} bytes is negative")
        room = min(room, budget_bytes - slot_bytes)
    return max(0, room)


def choose_residents(sizes: Sequence[int], memory: DeviceMemory | None, grad_bytes_per_param: int,
                     budget_bytes: int | None = None) -> Residency:
    """``resident_gib="auto"``: the subgroups to keep resident, in id order, each that still fits the room."""
    sizes = _check_sizes(sizes)
    if memory is None:
        return Residency(ids=(), params=0, room=0, memory=None)
    slots = device_memory_bytes(Plan(lanes=(Lane.DEVICE,) * len(sizes)), sizes)  # two slots, as the planner weighs
    room = resident_room(memory, sum(sizes), grad_bytes_per_param, budget_bytes, slots)
    ids, used = [], 0
    for i, size in enumerate(sizes):
        if 0 < size and used + size * RESIDENT_BYTES_PER_PARAM <= room:
            ids.append(i)
            used += size * RESIDENT_BYTES_PER_PARAM
    return Residency(ids=tuple(ids), params=sum(sizes[i] for i in ids), room=room, memory=memory)


def residents_to_release(resident: Sequence[int], sizes: Sequence[int], free_bytes: int, needed_bytes: int
                         ) -> tuple[int, ...]:
    """Under memory pressure: the residents to give back, newest (highest id) first, until ``free_bytes`` plus what
    they free reaches ``needed_bytes`` (all of them if that is not enough; none if it is free already)."""
    sizes = _check_sizes(sizes)
    released: list[int] = []
    free = free_bytes
    for i in sorted(resident, reverse=True):
        if free >= needed_bytes:
            break
        released.append(i)
        free += sizes[i] * RESIDENT_BYTES_PER_PARAM
    return tuple(released)
