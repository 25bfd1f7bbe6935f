"""Owns where each subgroup's optimizer state lives (its home) and the memory plan that says whether a run fits.

Every subgroup's fp32 master, exp_avg, exp_avg_sq (and the gradient its update reads) has exactly one home:

* :attr:`Home.DEVICE` (*resident*): on the accelerator for the whole run, updated there by fused Adam; it never
  crosses the host-device link, takes no CPU Adam time and no host memory at all;
* :attr:`Home.HOST`: pinned host memory, updated each step either by CPU Adam (the host lane) or streamed through the
  device (the device lane), as the plan of that step says; 12 bytes per parameter of state and the gradient in the
  dtype the backward sends (:func:`host_bytes_per_param`: 14 in bf16 or fp16 training, 16 in fp32).

Nothing is allocated for a subgroup before its home is chosen. The choice is made once the first forward and backward
have shown the training's own peak on the device (activations, 16-bit parameters, ZeRO-3's buffers, and every
gradient, which the first backward keeps on the device): in id order (the order the forward reads them), every
subgroup whose state still fits is resident::

    room = total - other - peak - headroom - device-lane slots      (with a budget: at most the budget less the slots)

* ``total``: the device's memory; ``other``: memory held outside the training's allocator (CUDA context,
  communication buffers); ``peak``: the allocator's peak so far;
* ``headroom``: :data:`HEADROOM_SHARE` of ``total``, at least :data:`HEADROOM_MIN_BYTES`, for the allocator's
  fragmentation and what the first step did not show;
* device-lane slots: two pieces of the subgroups left to stream.

The rest lives on the host, which must hold :func:`host_bytes_per_param` for each of their parameters within its share
of what the host has available (the ranks of one host share it). :class:`MemoryPlan` says so in one table, and where
the run cannot fit the box it lists every problem with what to change, before anything more is allocated
(:meth:`MemoryPlan.check`). Before the first step, :func:`start_plan` makes the same check for the best case (every
subgroup the device could hold resident), so a run that cannot fit stops before its engine trains.

Under memory pressure later (something else took device memory), :func:`residents_to_release` names the residents to
give back to the host, newest first, until the headroom is free again; the host must have room for them.

A further tier (NVMe) would be another :class:`Home` with its own bytes per parameter. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .perf_model import PIECE_PARAMS, device_memory_bytes
from .plan import Lane, Plan, _check_sizes

GIB = 1024**3
#: The name of the memory plan's tier of subgroups resident on the device (its table's and its JSON's).
RESIDENT_TIER = "GPU, resident"
#: Share of the device's memory left free beyond the measured peak ...
HEADROOM_SHARE = 0.08
#: ... and at least this much.
HEADROOM_MIN_BYTES = 2 * GIB
#: Bytes of a resident subgroup's state on the device per parameter: fp32 master, exp_avg, exp_avg_sq.
RESIDENT_BYTES_PER_PARAM = 12
#: Bytes per parameter of a subgroup's state living on the host (fp32 master, exp_avg, exp_avg_sq), besides the
#: gradient CPU Adam reads there (:func:`host_bytes_per_param`).
HOST_STATE_BYTES_PER_PARAM = 12
#: Host memory kept free beyond what the plan places there (the training process, the loader, page cache) ...
HOST_RESERVE_BYTES = 4 * GIB
#: ... at most this share of the host (a small machine's reserve would otherwise be most of it).
HOST_RESERVE_SHARE = 0.05
#: Device-lane slots left room for at most: two slots of a whole piece, as the planner weighs them.
SLOT_RESERVE_BYTES = device_memory_bytes(Plan(lanes=(Lane.DEVICE,)), [PIECE_PARAMS])


def host_bytes_per_param(grad_bytes: int) -> int:
    """Host bytes per parameter of a subgroup living there: its state and its gradient, ``grad_bytes`` per parameter
    (2 when the backward's 16-bit gradients are kept as they are, 4 in fp32 training or under accumulation)."""
    return HOST_STATE_BYTES_PER_PARAM + grad_bytes


class Home(str, Enum):
    """Where a subgroup's optimizer state lives for the whole run."""

    DEVICE = "device"
    """Resident on the accelerator (on a machine without one, the host stands in)."""
    HOST = "host"
    """Pinned host memory; updated by the host lane or streamed through the device lane."""


@dataclass(frozen=True)
class DeviceMemory:
    """The device's memory at a reading, in bytes."""

    total: int
    """The device's memory."""
    peak: int
    """The most the training's allocator held allocated at once so far (its cached, unallocated blocks are room)."""
    other: int
    """Memory held outside the allocator (CUDA context, communication buffers)."""

    def __post_init__(self) -> None:
        if min(self.total, self.peak, self.other) < 0:
            raise ValueError(f"device memory: negative figures in {self}")

    @property
    def headroom(self) -> int:
        return headroom_bytes(self.total)

    @property
    def free(self) -> int:
        """What is free beyond the peak and what others hold."""
        return max(0, self.total - self.other - self.peak)


@dataclass(frozen=True)
class HostMemory:
    """The host's memory at a reading, in bytes: the whole host's, driver-pinned pages included (``MemAvailable``)."""

    total: int
    available: int
    ranks: int = 1
    """Ranks of this run on the host: they share what is available."""
    held: int = 0
    """Bytes this rank's own host homes (and DeepSpeed's host gradient buffer) hold already: in use at the reading, so
    not in ``available``, and counted again in any plan that keeps them there."""

    def __post_init__(self) -> None:
        if min(self.total, self.available, self.held) < 0 or self.ranks < 1:
            raise ValueError(f"host memory: bad figures in {self}")

    @property
    def share(self) -> int:
        """What one rank's host homes may take in all: its share of what is available, what it holds already, less
        the reserve (the ranks of a host are taken to hold alike)."""
        return max(0, self.available // self.ranks + self.held - self.reserve)

    @property
    def room(self) -> int:
        """What more this rank may place on the host, beyond what it holds already."""
        return max(0, self.available // self.ranks - self.reserve)

    @property
    def reserve(self) -> int:
        """What one rank leaves free of its share."""
        return min(HOST_RESERVE_BYTES, int(HOST_RESERVE_SHARE * self.total))


def headroom_bytes(total: int) -> int:
    """The memory kept free above the measured peak on a device of ``total`` bytes."""
    return max(HEADROOM_MIN_BYTES, int(HEADROOM_SHARE * total))


@dataclass(frozen=True)
class Placement:
    """Each subgroup's home, and the arithmetic behind the choice."""

    homes: tuple[Home, ...]
    room: int = 0
    """Bytes of device memory the resident state could take (:func:`resident_room`)."""
    memory: DeviceMemory | None = None
    """The reading it was made from (None: no device to measure, or residents set by hand)."""

    @property
    def resident(self) -> tuple[int, ...]:
        """The subgroups whose state lives on the device, in id order."""
        return tuple(i for i, home in enumerate(self.homes) if home == Home.DEVICE)

    def params(self, sizes: Sequence[int], home: Home) -> int:
        return sum(size for size, h in zip(sizes, self.homes) if h == home)


def all_on_host(n: int) -> Placement:
    return Placement(homes=(Home.HOST,) * n)


def resident_room(memory: DeviceMemory, budget_bytes: int | None = None, slot_bytes: int = SLOT_RESERVE_BYTES) -> int:
    """Bytes of device memory the resident subgroups may take (see the module docstring); never negative."""
    if slot_bytes < 0:
        raise ValueError("resident_room: sizes must be >= 0")
    room = memory.total - memory.other - memory.peak - memory.headroom - slot_bytes
    if budget_bytes is not None:
        if budget_bytes < 0:
            raise ValueError(f"memory budget: {budget_bytes} bytes is negative")
        room = min(room, budget_bytes - slot_bytes)
    return max(0, room)


def slot_bytes(sizes: Sequence[int]) -> int:
    """Two device-lane slots for subgroups of ``sizes``, as the planner weighs them."""
    return device_memory_bytes(Plan(lanes=(Lane.DEVICE,) * len(sizes)), sizes) if any(sizes) else 0


def fill(sizes: Sequence[int], room: int, bytes_per_param: int = RESIDENT_BYTES_PER_PARAM) -> tuple[int, ...]:
    """In id order, every subgroup whose state still fits in ``room`` bytes at ``bytes_per_param``."""
    chosen, used = [], 0
    for i, size in enumerate(_check_sizes(sizes)):
        if 0 < size and used + size * bytes_per_param <= room:
            chosen.append(i)
            used += size * bytes_per_param
    return tuple(chosen)


def place(sizes: Sequence[int], memory: DeviceMemory | None, budget_bytes: int | None = None,
          resident_bytes: int | None = None, candidates: Sequence[int] | None = None,
          grad_bytes_per_param: int = 0) -> Placement:
    """Each subgroup's home. ``resident_bytes`` (``resident_gib`` set by hand): the subgroups that fit in it, whatever
    the reading; else, from the reading ``memory`` (None: nothing to measure, everything on the host), among
    ``candidates`` only (None: all). ``grad_bytes_per_param``: what a resident subgroup's gradient adds on the device
    beyond the reading's peak (0 when the peak holds it already)."""
    sizes = _check_sizes(sizes)

    def homes(ids: set[int]) -> tuple[Home, ...]:
        return tuple(Home.DEVICE if i in ids else Home.HOST for i in range(len(sizes)))

    if resident_bytes is not None:
        return Placement(homes=homes(set(fill(sizes, resident_bytes))), room=resident_bytes)
    if memory is None:
        return all_on_host(len(sizes))
    slots = slot_bytes(sizes)
    room = resident_room(memory, None, slots)
    budget = None if budget_bytes is None else max(0, budget_bytes - slots)  # the budget counts state, not gradients
    allowed = set(range(len(sizes)) if candidates is None else candidates)
    ids, used, state = [], 0, 0
    for i, size in enumerate(sizes):
        takes = size * (RESIDENT_BYTES_PER_PARAM + grad_bytes_per_param)
        if (i in allowed and 0 < size and used + takes <= room
                and (budget is None or state + size * RESIDENT_BYTES_PER_PARAM <= budget)):
            ids.append(i)
            used += takes
            state += size * RESIDENT_BYTES_PER_PARAM
    return Placement(homes=homes(set(ids)), room=room if budget is None else min(room, budget), memory=memory)


def zero3_subgroups(groups: Sequence[Sequence[int]], world_size: int, sub_group_size: int) -> list[int]:
    """The parameters of each subgroup of one rank's ZeRO-3 partition, as DeepSpeed 0.19 forms them: each parameter's
    partition is its elements over the ranks, rounded up; within each param group (``groups``: the parameters' element
    counts, in order), a subgroup closes once it reaches ``sub_group_size`` or at the group's last parameter (a group
    no larger than ``sub_group_size`` is one subgroup)."""
    if world_size < 1 or sub_group_size < 1:
        raise ValueError(f"zero3_subgroups: world_size {world_size} and sub_group_size {sub_group_size} must be >= 1")
    sizes: list[int] = []
    for group in groups:
        parts = [-(-int(numel) // world_size) for numel in group]
        if not parts:
            continue
        if sum(parts) <= sub_group_size:
            sizes.append(sum(parts))
            continue
        size = 0
        for k, part in enumerate(parts):
            size += part
            if size >= sub_group_size or k == len(parts) - 1:
                sizes.append(size)
                size = 0
    return sizes


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


# ---------------------------------------------------------------------------------------------- the memory plan
#: What a user can change when the host cannot hold the state that lives there.
HOST_ADVICE = ("more of the state on the GPU (a smaller micro-batch, activation checkpointing or activation_offload "
               "leave it room), more GPUs (each rank then holds a share of the state), or a host with more memory")


class DoesNotFit(RuntimeError):
    """The run cannot fit the box: raised before its first update, with the numbers and what to change; nothing is
    allocated for it beyond the host gradients made at start, which it would need in any placement."""


@dataclass(frozen=True)
class MemoryPlan:
    """Where the optimizer state goes on one rank and whether the box holds it; :meth:`describe` is the table the
    strategy prints, :meth:`check` raises :class:`DoesNotFit` listing every problem."""

    sizes: tuple[int, ...]
    placement: Placement
    host: HostMemory | None
    device: DeviceMemory | None
    when: str
    """When it was made ("before the first step", "after the first step", ...)."""
    lanes: tuple[Lane, ...] | None = None
    """The plan in force, to split the host-homed subgroups by lane (None: not known yet)."""
    host_extra_bytes: int = 0
    """Host memory this rank takes besides the homes (DeepSpeed's gradient buffer under accumulation)."""
    host_grad_bytes: int = 4
    """Bytes per parameter of a host home's gradient (2 in 16 bits, 4 in fp32)."""
    device_needed_bytes: int = 0
    """Device memory the first step takes beyond the reading's peak: the gradients it keeps for the candidates."""
    problems: tuple[str, ...] = field(default=())

    @property
    def host_needed(self) -> int:
        return self.host_bytes_per_param * self.placement.params(self.sizes, Home.HOST) + self.host_extra_bytes

    @property
    def host_bytes_per_param(self) -> int:
        return host_bytes_per_param(self.host_grad_bytes)

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The plan as a report keeps it: each tier's subgroups, parameters and GiB, the readings, what the host
        needs and whether it fits (GiB as floats)."""
        device, host = self.device, self.host
        return {
            "when": self.when,
            "tiers": [{"home": home, "subgroups": n, "params": params, "gib": gib}
                      for home, n, params, gib in self.rows()],
            "device": None if device is None else {"total_gib": device.total / GIB, "peak_gib": device.peak / GIB,
                                                   "other_gib": device.other / GIB,
                                                   "headroom_gib": device.headroom / GIB},
            "host": None if host is None else {"total_gib": host.total / GIB, "available_gib": host.available / GIB,
                                               "held_gib": host.held / GIB, "may_take_gib": host.share / GIB},
            "host_needed_gib": self.host_needed / GIB,
            "fits": self.fits,
        }

    def rows(self) -> list[tuple[str, int, int, float]]:
        """(home, subgroups, parameters, GiB) for each tier."""
        sizes, homes = self.sizes, self.placement.homes
        tiers: list[tuple[str, list[int], int]] = [
            (RESIDENT_TIER, [i for i, h in enumerate(homes) if h == Home.DEVICE], RESIDENT_BYTES_PER_PARAM)]
        host = [i for i, h in enumerate(homes) if h == Home.HOST]
        if self.lanes is None:
            tiers.append(("host", host, self.host_bytes_per_param))
        else:
            tiers.append(("host, streamed (device lane)", [i for i in host if self.lanes[i] == Lane.DEVICE],
                          self.host_bytes_per_param))
            tiers.append(("host, CPU Adam (host lane)", [i for i in host if self.lanes[i] != Lane.DEVICE],
                          self.host_bytes_per_param))
        return [(name, len(ids), sum(sizes[i] for i in ids), per * sum(sizes[i] for i in ids) / GIB)
                for name, ids, per in tiers]

    def describe(self) -> str:
        lines = [f"memory plan ({self.when}):",
                 f"  {'home':<30} {'subgroups':>9} {'parameters':>15} {'GiB':>9}"]
        for name, n, params, gib in self.rows():
            lines.append(f"  {name:<30} {n:>9} {params:>15,} {gib:>9.2f}")
        if self.device is not None:
            d = self.device
            lines.append(f"  device: {d.total / GIB:.2f} GiB, training peak {d.peak / GIB:.2f}, held outside the "
                         f"allocator {d.other / GIB:.2f}, headroom {d.headroom / GIB:.2f}; room for resident state "
                         f"{self.placement.room / GIB:.2f} GiB"
                         + (f" (and {self.device_needed_bytes / GIB:.2f} GiB of gradients the first backward keeps "
                            "for it)" if self.device_needed_bytes else ""))
        if self.host is not None:
            h = self.host
            lines.append(f"  host: {h.total / GIB:.2f} GiB, {h.available / GIB:.2f} available"
                         + (f" for {h.ranks} ranks" if h.ranks > 1 else "")
                         + (f" and {h.held / GIB:.2f} held by this rank's state already" if h.held else "")
                         + f"; this rank places {self.host_needed / GIB:.2f} GiB there (of {h.share / GIB:.2f} it may "
                         f"take, {h.reserve / GIB:.2f} GiB kept free)")
        lines += [f"  does not fit: {problem}" for problem in self.problems]
        return "\n".join(lines)

    def check(self, problems: Sequence[str] | None = None) -> None:
        """Raise :class:`DoesNotFit` with the table if the box cannot hold the run: its own problems, or ``problems``
        in their place (every rank's, where the ranks check together)."""
        problems = self.problems if problems is None else tuple(problems)
        if problems:
            held = self.host.held if self.host is not None else 0
            made = ("nothing was allocated for its optimizer state" if not held else
                    f"nothing was allocated for its optimizer state beyond the {held / GIB:.2f} GiB of host gradients "
                    "made for its first backward")
            raise DoesNotFit(f"deep_optimizer_states: this run cannot fit the box, so it stops before its first "
                             f"update: {made}.\n" + replace(self, problems=problems).describe())


def memory_plan(sizes: Sequence[int], placement: Placement, host: HostMemory | None, device: DeviceMemory | None,
                when: str, lanes: Sequence[Lane] | None = None, host_extra_bytes: int = 0,
                device_needed_bytes: int = 0, host_grad_bytes: int = 4) -> MemoryPlan:
    """The plan for ``placement``, with every problem it has on this box (a host home's gradient taking
    ``host_grad_bytes`` per parameter)."""
    sizes = _check_sizes(sizes)
    plan = MemoryPlan(sizes=sizes, placement=placement, host=host, device=device, when=when,
                      lanes=None if lanes is None else tuple(lanes), host_extra_bytes=host_extra_bytes,
                      host_grad_bytes=host_grad_bytes, device_needed_bytes=device_needed_bytes)
    problems = []
    if host is not None and plan.host_needed > host.share:
        problems.append(f"the host needs {plan.host_needed / GIB:.2f} GiB for the state living there "
                        f"({plan.host_bytes_per_param} bytes per parameter), and this rank may take "
                        f"{host.share / GIB:.2f} GiB; set {HOST_ADVICE}")
    return replace(plan, problems=tuple(problems))


def start_plan(sizes: Sequence[int], host: HostMemory | None, device: DeviceMemory | None, grad_bytes_per_param: int,
               budget_bytes: int | None = None, resident_bytes: int | None = None,
               host_extra_bytes: int = 0, host_grad_bytes: int = 4) -> MemoryPlan:
    """Before the first step: the best case the box allows. ``device``'s peak is what the training holds now (the
    16-bit parameters and ZeRO-3's buffers, no activations yet), and a resident subgroup takes its state and the
    gradient its backward keeps on the device (``grad_bytes_per_param``). The subgroups resident in this plan are the
    *candidates*: the first step keeps their gradients on the device, and the measured peak decides which stay; the
    others can never be resident (activations only take more), so they live on the host from the start. If the host
    cannot hold even those, the run cannot fit."""
    sizes = _check_sizes(sizes)
    placement = place(sizes, device, budget_bytes, resident_bytes, grad_bytes_per_param=grad_bytes_per_param)
    kept = grad_bytes_per_param * placement.params(sizes, Home.DEVICE)
    return memory_plan(sizes, placement, host, device, "before the first step: the most the GPU could hold resident",
                       host_extra_bytes=host_extra_bytes, device_needed_bytes=kept if device is not None else 0,
                       host_grad_bytes=host_grad_bytes)
