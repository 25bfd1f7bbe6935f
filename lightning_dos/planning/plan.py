"""Owns the plan: which lane updates each optimizer-state subgroup, in what order, with how many buffer slots.

A *plan* assigns every subgroup of the ZeRO-3 partition to the host lane (CPU Adam on pinned host memory) or
the device lane (prefetch to the GPU, fused Adam there, flush back). This module parses the user's ``plan``
value early, before any subgroup sizes are known (:func:`parse_plan`), and turns an explicit value into a
concrete :class:`Plan` once the sizes are known (:func:`resolve_plan`). ``"auto"`` is resolved by the planner.

Pure Python: no torch, so plans can be built, printed and tested anywhere.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any

PLAN_HINT = (
    "set plan to 'auto', 'host', 'device', a fraction in [0, 1], 'stride:K' (K >= 1) "
    "or a list of 'host'/'device' per subgroup"
)
_STRIDE = re.compile(r"^stride\s*:\s*(\d+)$")
_LANE_NAMES = {"host": "host", "h": "host", "device": "device", "d": "device"}
_STR_WIDTH = 64  # lane letters shown by Plan.__str__ before eliding
_ORDER_SHOWN = 8  # host-lane ids shown by Plan.__str__ before eliding
_MAX_DENOMINATOR = 10**6  # decimal fractions like 0.3 are meant as 3/10, not as their float


class Lane(str, Enum):
    """Where a subgroup's optimizer step runs."""

    HOST = "host"
    DEVICE = "device"

    @property
    def letter(self) -> str:
        """One-letter form used in compact plan strings: H or D."""
        return "H" if self is Lane.HOST else "D"


def _as_lane(value: Any, where: str) -> Lane:
    if isinstance(value, Lane):
        return value
    if isinstance(value, str) and value.strip().lower() in _LANE_NAMES:
        return Lane(_LANE_NAMES[value.strip().lower()])
    raise ValueError(f"plan: {where} {value!r} is not a lane; use 'host' or 'device' (or 'h'/'d')")


def _check_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    out = []
    for i, size in enumerate(sizes):
        # bool is an int subclass but never a parameter count
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
            raise ValueError(f"sizes: subgroup {i} has size {size!r}; sizes must be parameter counts (integers >= 0)")
        out.append(int(size))
    return tuple(out)


def _check_buffers(buffers: Any) -> int:
    if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 1:
        raise ValueError(f"buffers: {buffers!r} is not a number of device buffer slots; set buffers to an integer >= 1")
    return buffers


@dataclass(frozen=True)
class Plan:
    """A concrete assignment of subgroups to lanes, fixed for a number of iterations."""

    lanes: tuple[Lane, ...]
    """Lane of each subgroup; the index is the subgroup id."""
    device_order: tuple[int, ...] = ()
    """Processing order of the device-lane subgroups; empty means ascending ids."""
    buffers: int = 2
    """Device buffer slots (buffering depth of the device lane), >= 1."""
    source: str = "list"
    """What produced the plan: 'host', 'device', 'fraction:0.5', 'stride:3', 'list', 'auto', ..."""
    host_order: tuple[int, ...] = ()
    """Processing order of the host-lane subgroups; empty means ascending ids (every named plan). ``auto`` may
    choose another: the host lane ends with the upload of its last subgroup, so ending on small ones is shorter."""

    def __post_init__(self) -> None:
        lanes = tuple(lane if isinstance(lane, Lane) else _as_lane(lane, f"subgroup {i}:")
                      for i, lane in enumerate(self.lanes))
        object.__setattr__(self, "lanes", lanes)
        _check_buffers(self.buffers)
        for name, lane in (("device_order", Lane.DEVICE), ("host_order", Lane.HOST)):
            ids = [i for i, each in enumerate(lanes) if each is lane]
            given = tuple(getattr(self, name))
            order = given if given else tuple(ids)
            if sorted(order) != ids:
                raise ValueError(
                    f"plan: {name} {list(order)} must list each {lane.value}-lane subgroup {ids} exactly once; "
                    f"set {name} to a permutation of the {lane.value}-lane subgroup ids"
                )
            object.__setattr__(self, name, order)

    def device_subgroups(self) -> tuple[int, ...]:
        """Ids of the device-lane subgroups, ascending."""
        return tuple(i for i, lane in enumerate(self.lanes) if lane is Lane.DEVICE)

    def host_subgroups(self) -> tuple[int, ...]:
        """Ids of the host-lane subgroups, ascending."""
        return tuple(i for i, lane in enumerate(self.lanes) if lane is Lane.HOST)

    def device_fraction(self, sizes: Sequence[int]) -> float:
        """Fraction of the parameters (by count of parameters, not subgroups) updated on the device lane."""
        sizes = _check_sizes(sizes)
        _check_length(self, sizes)
        total = sum(sizes)
        return sum(sizes[i] for i in self.device_subgroups()) / total if total else 0.0

    def demote(self, subgroup_ids: Iterable[int]) -> Plan:
        """A new plan with ``subgroup_ids`` on the host lane; the plan itself if none of them was on the device."""
        ids = set(subgroup_ids)
        bad = sorted(i for i in ids if not isinstance(i, int) or not 0 <= i < len(self.lanes))
        if bad:
            raise ValueError(f"plan: cannot demote subgroups {bad}; ids must be in [0, {len(self.lanes)})")
        moved = ids & set(self.device_subgroups())
        if not moved:
            return self
        lanes = tuple(Lane.HOST if i in moved else lane for i, lane in enumerate(self.lanes))
        device_order = tuple(i for i in self.device_order if i not in moved)
        source = self.source if self.source.endswith("+demoted") else self.source + "+demoted"
        # ascending ids stay ascending; a chosen host order takes the demoted subgroups first (demotion moves the
        # device lane's largest subgroups, and a host lane that ends on small ones ends sooner)
        host_order = () if self.host_order == self.host_subgroups() else (*sorted(moved), *self.host_order)
        return Plan(lanes=lanes, device_order=device_order, buffers=self.buffers, source=source, host_order=host_order)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_json` reads it back."""
        return {
            "lanes": [lane.value for lane in self.lanes],
            "order": list(self.device_order),  # the saved format's key for the device lane's order
            "buffers": self.buffers,
            "source": self.source,
            "host_order": list(self.host_order),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The plan written by :meth:`to_json`."""
        if not isinstance(data, dict) or "lanes" not in data:
            raise ValueError(f"plan: {data!r} is not a saved plan; expected a dict with 'lanes', 'order', 'buffers'")
        return cls(
            lanes=tuple(data["lanes"]),
            device_order=tuple(data.get("order", ())),
            buffers=data.get("buffers", 2),
            source=str(data.get("source", "list")),
            host_order=tuple(data.get("host_order", ())),
        )

    def lane_letters(self) -> str:
        """The lanes as a string of H/D letters, one per subgroup."""
        return "".join(lane.letter for lane in self.lanes)

    def __str__(self) -> str:
        """Compact form, e.g. ``plan fraction:0.5 [HDHD] 2 buffers, 50.0% on device`` (share of subgroups)."""
        letters = self.lane_letters()
        if len(letters) > _STR_WIDTH:
            letters = letters[:_STR_WIDTH] + "..."
        share = 100.0 * len(self.device_order) / len(self.lanes) if self.lanes else 0.0
        slots = "buffer" if self.buffers == 1 else "buffers"
        text = f"plan {self.source} [{letters}] {self.buffers} {slots}, {share:.1f}% on device"
        if self.host_order != self.host_subgroups():
            shown = " ".join(str(g) for g in self.host_order[:_ORDER_SHOWN])
            text += f", host lane in order {shown}{' ...' if len(self.host_order) > _ORDER_SHOWN else ''}"
        return text


def _check_length(plan: Plan, sizes: Sequence[int]) -> None:
    if len(plan.lanes) != len(sizes):
        raise ValueError(
            f"plan: has {len(plan.lanes)} lanes but the partition has {len(sizes)} subgroups; "
            f"set plan to a list of {len(sizes)} lanes or to 'auto', 'host', 'device', a fraction or 'stride:K'"
        )


@dataclass(frozen=True)
class PlanSpec:
    """A validated user ``plan`` value, before subgroup sizes are known."""

    kind: str
    """One of 'auto', 'host', 'device', 'fraction', 'stride', 'list'."""
    fraction: float | None = None
    """For kind 'fraction': share of the parameters, by size, on the device lane."""
    stride: int | None = None
    """For kind 'stride': every stride-th subgroup goes to the device lane."""
    lanes: tuple[Lane, ...] | None = None
    """For kind 'list': the lane of each subgroup."""

    @property
    def source(self) -> str:
        """The label carried by plans resolved from this spec."""
        if self.kind == "fraction":
            return f"fraction:{self.fraction:g}"
        if self.kind == "stride":
            return f"stride:{self.stride}"
        return self.kind


def _not_a_plan(value: Any) -> ValueError:
    return ValueError(f"plan: {value!r} is not a plan; {PLAN_HINT}")


def _fraction(value: float, original: Any) -> PlanSpec:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise _not_a_plan(original)
    return PlanSpec(kind="fraction", fraction=float(value))


def parse_plan(value: Any) -> PlanSpec:
    """Validate a user ``plan`` value early; see :data:`PLAN_HINT` for the accepted forms."""
    if isinstance(value, PlanSpec):
        return value
    if isinstance(value, bool):  # True/False would otherwise read as the fractions 1 and 0
        raise _not_a_plan(value)
    if isinstance(value, numbers.Real):
        return _fraction(float(value), value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "host", "device"):
            return PlanSpec(kind=text)
        match = _STRIDE.match(text)
        if match:
            stride = int(match.group(1))
            if stride < 1:
                raise _not_a_plan(value)
            return PlanSpec(kind="stride", stride=stride)
        try:
            number = float(text)
        except ValueError:
            raise _not_a_plan(value) from None
        return _fraction(number, value)
    if isinstance(value, (list, tuple)):
        if not value:
            raise _not_a_plan(value)
        return PlanSpec(kind="list", lanes=tuple(_as_lane(v, f"element {i}:") for i, v in enumerate(value)))
    raise _not_a_plan(value)


def fraction_lanes(sizes: Sequence[int], fraction: float) -> tuple[Lane, ...]:
    """Lanes putting ``fraction`` of the parameters, by size, on the device, spread evenly (error diffusion).

    Walk the subgroups in id order with running total ``T`` (this subgroup included) and running device total
    ``D`` (this subgroup excluded); subgroup i of size s goes to the device iff ``|D + s - f*T| < |D - f*T|``,
    i.e. iff that brings the device total strictly closer to ``f*T`` (a tie stays on the host). Exact rational
    arithmetic keeps it deterministic; f is read as the closest rational with a denominator <= 10**6, so 0.3
    means exactly 3/10 and 1/3 exactly one third, not their binary approximations.
    f=0 puts everything on the host and f=1 everything on the device. With equal sizes, after subgroup i the
    device holds round-half-down(f*(i+1)) subgroups.
    """
    sizes = _check_sizes(sizes)
    if not 0.0 <= fraction <= 1.0:
        raise _not_a_plan(fraction)
    if fraction == 1.0:  # zero-size subgroups would otherwise tie and stay on the host
        return tuple(Lane.DEVICE for _ in sizes)
    f = Fraction(fraction).limit_denominator(_MAX_DENOMINATOR)
    lanes: list[Lane] = []
    total = device = 0
    for size in sizes:
        total += size
        target = f * total
        on_device = abs(device + size - target) < abs(device - target)
        device += size if on_device else 0
        lanes.append(Lane.DEVICE if on_device else Lane.HOST)
    return tuple(lanes)


def even_device_lanes(sizes: Sequence[int], count: int) -> tuple[Lane, ...]:
    """Lanes with exactly ``count`` device subgroups spread evenly by size (the planner's candidates).

    Same error diffusion as :func:`fraction_lanes`, but on the number of device subgroups: the target after
    subgroup i is ``count * T_i / T`` (T_i the running parameter total, T the grand total) and subgroup i goes
    to the device iff ``D + 1/2 < target`` (D device subgroups so far), while fewer than ``count`` are placed;
    when the remaining subgroups are all needed to reach ``count`` they go to the device. With equal sizes
    this is exactly ``fraction_lanes(sizes, count / len(sizes))``.
    """
    sizes = _check_sizes(sizes)
    n = len(sizes)
    if not 0 <= count <= n:
        raise ValueError(f"plan: cannot put {count} of {n} subgroups on the device lane; use 0..{n}")
    grand = sum(sizes)
    lanes: list[Lane] = []
    running = placed = 0
    for i, size in enumerate(sizes):
        running += size
        forced = count - placed >= n - i
        # placed + 1/2 < count * running / grand, in integers; zero-size partitions spread by subgroup count
        below = (2 * placed + 1) * grand < 2 * count * running if grand else (2 * placed + 1) * n < 2 * count * (i + 1)
        on_device = placed < count and (forced or below)
        placed += int(on_device)
        lanes.append(Lane.DEVICE if on_device else Lane.HOST)
    return tuple(lanes)


def stride_lanes(n: int, stride: int) -> tuple[Lane, ...]:
    """Every ``stride``-th subgroup on the device lane: subgroup i is on the device iff (i + 1) % stride == 0."""
    if stride < 1:
        raise _not_a_plan(f"stride:{stride}")
    return tuple(Lane.DEVICE if (i + 1) % stride == 0 else Lane.HOST for i in range(n))


def random_plan(rng: Any, n: int, source: str = "random") -> Plan:
    """A random plan for ``n`` subgroups from ``rng`` (a ``random.Random``): each subgroup's lane, the host lane's
    order and the buffering depth (1-3), drawn in that order (the tests and the soak change the plan every step)."""
    lanes = tuple(rng.choice([Lane.HOST, Lane.DEVICE]) for _ in range(n))
    host = [i for i, lane in enumerate(lanes) if lane is Lane.HOST]
    rng.shuffle(host)
    return Plan(lanes=lanes, buffers=rng.choice([1, 2, 3]), source=source, host_order=tuple(host))


def resolve_plan(spec: PlanSpec | Any, sizes: Sequence[int], buffers: int = 2) -> Plan:
    """The concrete plan for an explicit ``plan`` value and the partition's subgroup sizes."""
    spec = parse_plan(spec)
    sizes = _check_sizes(sizes)
    buffers = _check_buffers(buffers)
    n = len(sizes)
    if spec.kind == "auto":
        raise ValueError("plan: 'auto' is chosen by the planner from measured rates; call best_plan for it, "
                         "or set plan to 'host', 'device', a fraction in [0, 1], 'stride:K' or a list of lanes")
    if spec.kind == "host":
        lanes = tuple(Lane.HOST for _ in sizes)
    elif spec.kind == "device":
        lanes = tuple(Lane.DEVICE for _ in sizes)
    elif spec.kind == "fraction":
        assert spec.fraction is not None
        lanes = fraction_lanes(sizes, spec.fraction)
    elif spec.kind == "stride":
        assert spec.stride is not None
        lanes = stride_lanes(n, spec.stride)
    else:
        assert spec.lanes is not None
        if len(spec.lanes) != n:
            raise ValueError(
                f"plan: the list has {len(spec.lanes)} lanes but the partition has {n} subgroups; "
                f"set plan to a list of exactly {n} 'host'/'device' entries, or to 'auto' or a fraction"
            )
        lanes = spec.lanes
    return Plan(lanes=lanes, buffers=buffers, source=spec.source)
