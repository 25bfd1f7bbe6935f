"""Owns the choice of plan: the ``auto`` search over the performance model, and demotion to fit GPU memory.

:func:`best_plan` tries every number of device subgroups k = 0..n (spread evenly by size, see
:func:`~.plan.even_device_lanes`) and the lanes of every ``stride:K`` and of fractions 0.05..0.95 (see
:func:`candidate_lanes`), each with every buffering depth 1..max_buffers; a candidate that does not fit the memory
budget is weighed as it would run, demoted to fit (:func:`demote_to_fit`, as dispatch would demote a named plan); it
keeps the smallest predicted makespan. Each candidate is weighed with its host lane in id order and largest first
(:func:`largest_first`). :func:`demote_to_fit` shrinks an existing plan
when the GPU turns out to have less free memory than planned for; :func:`fewer_slots_to_fit` first takes buffer slots
from ``auto``'s probe instead, so that its device lane runs and is measured.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from .perf_model import CostParams, Prediction, _check_grads, _timeline, device_memory_bytes, predict
from .plan import (
    Lane,
    Plan,
    _check_buffers,
    _check_length,
    _check_sizes,
    even_device_lanes,
    fraction_lanes,
    stride_lanes,
)

TIE_TOLERANCE = 1e-9
"""Makespans within this relative distance count as a tie (float noise must not buy a bigger plan)."""


#: Fractions whose lanes ``auto`` also weighs, by size: 1/20 .. 19/20 (the fraction plans a user would name; read
#: exactly as j/20 by :func:`~.plan.fraction_lanes`).
NAMED_FRACTIONS = tuple(j / 20 for j in range(1, 20))


def candidate_lanes(sizes: Sequence[int]) -> list[tuple[Lane, ...]]:
    """Every distinct lane assignment ``auto`` weighs, in the order ties are settled.

    First k = 0..n device subgroups spread evenly by size (:func:`~.plan.even_device_lanes`), then the lanes of
    every plan a user could name instead that are not among them: ``stride:K`` for K = 2..n and the fractions of
    :data:`NAMED_FRACTIONS`. With unequal subgroups these place the device lane differently (``stride:3`` skips a
    large first subgroup that the even spread takes), so ``auto`` is never predicted slower than any of them.
    """
    sizes = _check_sizes(sizes)
    n = len(sizes)
    seen: dict[tuple[Lane, ...], None] = {}
    for lanes in (
        *(even_device_lanes(sizes, count) for count in range(n + 1)),
        *(stride_lanes(n, stride) for stride in range(2, n + 1)),
        *(fraction_lanes(sizes, fraction) for fraction in NAMED_FRACTIONS),
    ):
        seen.setdefault(lanes, None)
    return list(seen)


def largest_first(plan: Plan, sizes: Sequence[int]) -> tuple[int, ...]:
    """The host lane's subgroups largest first (ties by id): the host lane then ends with the upload of a small
    subgroup, not of a large one (gpt-1b: the 103M-parameter subgroup 17 last costs its 9 ms upload at the end)."""
    return tuple(sorted(plan.host_subgroups(), key=lambda g: (-sizes[g], g)))


def candidate_plans(sizes: Sequence[int], max_buffers: int = 4) -> Iterator[Plan]:
    """Every plan the ``auto`` search considers: each of :func:`candidate_lanes` with buffers 1..max_buffers, its host
    lane in id order and, where that differs, :func:`largest_first`.

    The all-host plan is yielded with 1 buffer only, since its buffering depth does not matter.
    """
    sizes = _check_sizes(sizes)
    max_buffers = _check_buffers(max_buffers)
    for lanes in candidate_lanes(sizes):
        in_ids = Plan(lanes=lanes, source="auto")
        orders = [in_ids.host_order]
        if (reordered := largest_first(in_ids, sizes)) != in_ids.host_order:
            orders.append(reordered)
        for buffers in range(1, (max_buffers if Lane.DEVICE in lanes else 1) + 1):
            for host_order in orders:
                yield Plan(lanes=lanes, buffers=buffers, source="auto", host_order=host_order)


def _check_budget(memory_budget_bytes: float | None) -> None:
    if memory_budget_bytes is not None and not memory_budget_bytes >= 0:
        raise ValueError(
            f"memory_budget_gib: {memory_budget_bytes / 2**30:g} GiB is not a budget; set memory_budget_gib to a "
            "number of GiB >= 0, or leave it unset for no limit"
        )


def _ranked(
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    max_buffers: int,
    grads_on_device: frozenset[int],
) -> list[tuple[Plan, frozenset[int]]]:
    _check_budget(memory_budget_bytes)
    sizes = _check_sizes(sizes)
    grads_on_device = _check_grads(grads_on_device, len(sizes))
    scored: list[tuple[Plan, frozenset[int], float]] = []
    seen: set[tuple[tuple[Lane, ...], tuple[int, ...], tuple[int, ...], int]] = set()
    for plan in candidate_plans(sizes, max_buffers):
        # weighed as it would run under the budget: dispatch demotes a plan that does not fit, and a demoted plan can
        # be the fastest one that does
        fitted, grads = _as_run(plan, sizes, params, memory_budget_bytes, grads_on_device)
        plan = plan if fitted is plan else replace(fitted, source=plan.source)
        key = (plan.lanes, plan.device_order, plan.host_order, plan.buffers)
        if grads is None or key in seen or (not plan.device_order and plan.buffers != 1):  # the all-host plan is there
            continue
        seen.add(key)
        scored.append((plan, grads, _timeline(plan, sizes, params, grads).makespan_s()))
    cutoff = min(makespan for *_, makespan in scored) * (1 + TIE_TOLERANCE)  # the all-host plan always fits

    def key(item: tuple[Plan, frozenset[int], float]) -> tuple[bool, float, int, int, bool]:
        plan, _, makespan = item
        tied = makespan <= cutoff
        # tied plans compare only by size (then the host lane in id order first), the others by makespan first
        return (not tied, 0.0 if tied else makespan, len(plan.device_order), plan.buffers,
                plan.host_order != plan.host_subgroups())

    return [(plan, grads) for plan, grads, _ in sorted(scored, key=key)]


def grads_for(
    plan: Plan,
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    grads_on_device: frozenset[int],
) -> frozenset[int] | None:
    """Which gradients ``plan`` would keep on the device within the budget, or None if the plan cannot fit.

    The device lane's subgroups among ``grads_on_device`` keep their gradients on the device if the buffer
    slots and those gradients fit together; otherwise every gradient goes to the host, as in vanilla, and only
    the slots must fit. This is the rule the manager applies before each backward.
    """
    keep = frozenset(g for g in plan.device_subgroups() if g in grads_on_device)
    if memory_budget_bytes is None or device_memory_bytes(plan, sizes, params, keep) <= memory_budget_bytes:
        return keep
    if keep and device_memory_bytes(plan, sizes, params, frozenset()) <= memory_budget_bytes:
        return frozenset()
    return None


def kept_grads(
    plan: Plan,
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    grads_on_device: frozenset[int],
) -> frozenset[int]:
    """The gradients ``plan`` keeps on the device as dispatch will run it: :func:`grads_for` of the plan, or, when not
    even its buffer slots fit the budget, of the plan demoted to fit (:func:`demote_to_fit`), as the planner weighs
    it. The manager decides with it before each backward (a named ``stride:2`` that runs demoted keeps the
    gradients of the subgroups it still runs on the device)."""
    return _as_run(plan, sizes, params, memory_budget_bytes, grads_on_device)[1] or frozenset()


def _as_run(
    plan: Plan,
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    grads_on_device: frozenset[int],
) -> tuple[Plan, frozenset[int] | None]:
    """``plan`` as dispatch will run it within the budget (itself, or demoted to fit when not even its buffer slots
    fit) and the gradients that one keeps (:func:`grads_for`; None only if nothing fits)."""
    grads = grads_for(plan, sizes, params, memory_budget_bytes, grads_on_device)
    if grads is None and memory_budget_bytes is not None:
        plan = demote_to_fit(plan, sizes, memory_budget_bytes, params)[0]
        grads = grads_for(plan, sizes, params, memory_budget_bytes, grads_on_device)
    return plan, grads


def rank_plans(
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    max_buffers: int = 4,
    grads_on_device: frozenset[int] = frozenset(),
) -> list[tuple[Plan, Prediction]]:
    """The candidates, each as it fits ``memory_budget_bytes`` (None = unlimited; demoted to fit where it does not),
    with their predictions, best first.

    Order: smallest makespan (ties within :data:`TIE_TOLERANCE`), then fewer device subgroups, then fewer buffers.
    """
    ranked = _ranked(sizes, params, memory_budget_bytes, max_buffers, grads_on_device)
    return [(plan, predict(plan, sizes, params, grads)) for plan, grads in ranked]


def best_plan(
    sizes: Sequence[int],
    params: CostParams,
    memory_budget_bytes: float | None,
    max_buffers: int = 4,
    grads_on_device: frozenset[int] = frozenset(),
) -> Plan:
    """The ``auto`` plan: smallest predicted makespan within the memory budget; ties -> fewer device subgroups,
    then fewer buffers. A zero budget gives the all-host plan. ``grads_on_device`` lists the subgroups whose
    gradients may stay on the device through backward (see :func:`grads_for`)."""
    return _ranked(sizes, params, memory_budget_bytes, max_buffers, grads_on_device)[0][0]


def demote_to_fit(
    plan: Plan,
    sizes: Sequence[int],
    free_bytes: float,
    params: CostParams | None = None,
    grads_on_device: frozenset[int] = frozenset(),
) -> tuple[Plan, tuple[int, ...]]:
    """Move device subgroups to the host until ``device_memory_bytes`` fits in ``free_bytes``.

    The largest subgroup goes first (it sets the buffer slot size); among equal sizes, the one processed last
    in ``plan.device_order``. Returns the new plan (the same plan if it already fits) and the demoted ids in the order
    they were demoted. A negative ``free_bytes`` demotes everything.
    """
    sizes = _check_sizes(sizes)
    _check_length(plan, sizes)
    position = {g: k for k, g in enumerate(plan.device_order)}
    queue = sorted(plan.device_order, key=lambda g: (-sizes[g], -position[g]))
    demoted: list[int] = []
    current = plan
    while current.device_order and device_memory_bytes(current, sizes, params, grads_on_device) > free_bytes:
        demoted.append(queue[len(demoted)])
        current = plan.demote(demoted)
    return current, tuple(demoted)


def fewer_slots_to_fit(
    plan: Plan,
    sizes: Sequence[int],
    free_bytes: float,
    params: CostParams | None = None,
    grads_on_device: frozenset[int] = frozenset(),
) -> Plan:
    """``plan`` with as many buffer slots as fit in ``free_bytes``, at least one: its device lane keeps every subgroup
    and pipelines less. ``auto``'s probe is fitted so (it is there to measure both lanes); whatever still does not fit
    is then demoted (:func:`demote_to_fit`)."""
    sizes = _check_sizes(sizes)
    _check_length(plan, sizes)
    while plan.buffers > 1 and device_memory_bytes(plan, sizes, params, grads_on_device) > free_bytes:
        plan = replace(plan, buffers=plan.buffers - 1)
    return plan
