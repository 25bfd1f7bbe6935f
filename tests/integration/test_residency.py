"""``resident_gib="auto"`` (the default): after the first forward and backward, the subgroups that fit beside the
measured peak stay on the device; under memory pressure later they go back to the host, newest first.

The arithmetic (:mod:`lightning_dos.planning.residency`) is checked with exact figures. On this CPU machine there is
no device memory to read, so ``auto`` keeps nothing resident; the runs below hand the manager a device-memory
reading (what ``torch.cuda`` gives on a GPU host) so that the same code chooses residents here, with the host
standing in for the device. Every run has clipping and an lr that changes at every step.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_dos.planning.residency import (
    GIB,
    HEADROOM_MIN_BYTES,
    DeviceMemory,
    choose_residents,
    headroom_bytes,
    resident_room,
    residents_to_release,
)
from lightning_dos.update.manager import OptimizerStateManager
from tests.support.parity import RandomPlanEveryStep, assert_tracks, make_strategy, shared_run, train

CLIP = 0.05
TOL = 1e-5
#: A device far larger than the tiny model: the budget alone decides how many subgroups fit.
HUGE = DeviceMemory(total=1024 * GIB, peak=0, other=0)
RESIDENT = 3


# ---------------------------------------------------------------------------------------------- the arithmetic
def test_headroom_is_a_share_of_the_device_with_a_floor() -> None:
    assert headroom_bytes(80 * GIB) == int(0.08 * 80 * GIB)
    assert headroom_bytes(10 * GIB) == HEADROOM_MIN_BYTES  # 0.8 GiB would be less than the floor


def test_the_room_is_what_the_peak_headroom_gradients_and_slots_leave() -> None:
    memory = DeviceMemory(total=80 * GIB, peak=12 * GIB, other=1 * GIB)
    # 80 - 1 - 12 - 6.4 (headroom) - 2.78e9 params * 2 B (kept gradients) - 1 GiB of slots
    room = resident_room(memory, partition_params=2_780_000_000, grad_bytes_per_param=2, slot_bytes=GIB)
    assert room == 80 * GIB - GIB - 12 * GIB - int(0.08 * 80 * GIB) - 5_560_000_000 - GIB
    assert resident_room(memory, 2_780_000_000, 2, budget_bytes=5 * GIB, slot_bytes=GIB) == 4 * GIB
    assert resident_room(memory, 2_780_000_000, 2, budget_bytes=GIB // 2, slot_bytes=GIB) == 0  # never negative
    full = DeviceMemory(total=16 * GIB, peak=15 * GIB, other=0)
    assert resident_room(full, 1000, 2) == 0


def test_residents_are_chosen_in_id_order_while_they_fit() -> None:
    sizes = [100, 200, 300, 50]
    slots = 2 * 300 * 16  # two pieces of the largest subgroup, state and gradient
    # the budget decides: room for 100 + 200 params' state, then 50 still fits where 300 does not
    budget = slots + 12 * 350
    chosen = choose_residents(sizes, HUGE, grad_bytes_per_param=2, budget_bytes=budget)
    assert chosen.ids == (0, 1, 3) and chosen.params == 350 and chosen.nbytes == 12 * 350
    assert "3 of 4 subgroups (350 params" in chosen.describe(4)
    assert choose_residents(sizes, HUGE, 2).ids == (0, 1, 2, 3)  # no budget: everything fits the big device
    nothing = choose_residents(sizes, None, 2)
    assert nothing.ids == () and "the host stands in" in nothing.describe(4)
    tight = choose_residents(sizes, DeviceMemory(total=3 * GIB, peak=GIB, other=0), 2)
    assert tight.ids == () and "none resident" in tight.describe(4)  # 3 - 1 - 2 (headroom) leaves nothing


def test_under_pressure_the_newest_residents_go_first_until_the_headroom_is_free() -> None:
    sizes = [100, 100, 100, 100]
    assert residents_to_release((0, 1, 2), sizes, free_bytes=0, needed_bytes=12 * 150) == (2, 1)
    assert residents_to_release((0, 1, 2), sizes, free_bytes=12 * 150, needed_bytes=12 * 150) == ()
    assert residents_to_release((0, 2), sizes, free_bytes=0, needed_bytes=10**9) == (2, 0)  # not enough: all


def test_a_reading_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        DeviceMemory(total=GIB, peak=-1, other=0)


# ---------------------------------------------------------------------------------------------- through the engine
@pytest.fixture(scope="module")
def sizes() -> list[int]:
    return train("host", steps=1, clip=CLIP).strategy.manager.subgroup_sizes


@pytest.fixture(scope="module")
def vanilla() -> Any:
    return shared_run(None, steps=6, clip=CLIP)


def _budget_gib(sizes: list[int], n: int) -> float:
    """A ``memory_budget_gib`` with room for the first ``n`` subgroups' state after the device-lane slots."""
    return (2 * max(sizes) * 16 + 12 * sum(sizes[:n])) / GIB


def _reading_for(sizes: list[int], n: int) -> DeviceMemory:
    """A small device with room for the first ``n`` subgroups' state and no more: the 2 GiB headroom, every fp32
    gradient (4 bytes a parameter here) and two device-lane slots, then exactly their state. (A budget would choose
    the same residents, but under a budget the dispatch demotes device-lane subgroups by the calibrated model, from
    measured timings: two runs would not run the same lanes, so bitwise comparisons use a reading.)"""
    return DeviceMemory(total=HEADROOM_MIN_BYTES + 4 * sum(sizes) + 2 * max(sizes) * 16 + 12 * sum(sizes[:n]),
                        peak=0, other=0)


def _auto(plan: Any, **kwargs: Any) -> Any:
    """The strategy with ``resident_gib="auto"`` (the tests' ``make_strategy`` keeps none resident: its control)."""
    return make_strategy(plan, resident_gib="auto", **kwargs)


def _read_as(memory: DeviceMemory | None) -> Any:
    return lambda self: memory


def test_auto_is_the_default_and_keeps_nothing_where_the_host_stands_in(vanilla: Any) -> None:
    from lightning_dos import DeepOptimizerStatesStrategy

    assert DeepOptimizerStatesStrategy().resident_gib == "auto"
    run = train(0.5, steps=3, clip=CLIP, strategy=make_strategy(0.5, resident_gib="auto"))
    manager = run.strategy.manager
    assert run.strategy.resident_gib == "auto" and manager.resident_auto
    assert manager.residency is not None and manager.residency.memory is None and manager.resident == ()
    assert manager.executor.resident is None


@pytest.mark.parametrize("plan", ["host", "device", 0.5, "auto"], ids=str)
def test_auto_keeps_what_fits_and_runs_exactly_as_residents_set_by_hand(plan: Any, sizes: list[int], vanilla: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    run = train(plan, steps=6, clip=CLIP, strategy=_auto(plan))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT)) and manager.residency.ids == manager.resident
    assert_tracks(run, vanilla, TOL)
    kept = sum(sizes[:RESIDENT])
    assert all(r.timings.resident_params == kept for r in manager.records)  # from the first update phase on
    assert manager.metrics()["dos/resident_gib"] == pytest.approx(12 * kept / GIB)
    if plan == "auto":
        return  # auto's plans follow measured timings: two runs need not choose alike, so no bitwise comparison
    # the same subgroups made resident by hand when the engine is built: the same run, bit for bit
    by_hand = train(plan, steps=6, clip=CLIP, strategy=make_strategy(plan, resident_gib=12 * kept / GIB))
    assert by_hand.strategy.manager.resident == manager.resident
    assert run.losses == by_hand.losses and torch.equal(run.masters, by_hand.masters)


def test_auto_overlapped_with_a_random_plan_every_step_is_exact(sizes: list[int], vanilla: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    runs = [train("host", steps=6, clip=CLIP, every_step=RandomPlanEveryStep(seed=5),
                  strategy=_auto("host", overlap=overlap)) for overlap in (True, False)]
    assert runs[0].strategy.manager.overlap and runs[0].strategy.manager.resident == tuple(range(RESIDENT))
    assert runs[0].losses == runs[1].losses and torch.equal(runs[0].masters, runs[1].masters)
    assert_tracks(runs[0], vanilla, TOL)


def test_every_subgroup_resident_leaves_both_lanes_empty(vanilla: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(HUGE))
    run = train("auto", steps=6, clip=CLIP, strategy=_auto("auto"))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(len(manager.subgroup_sizes)))
    assert all(r.timings.host_params == r.timings.device_params == 0 for r in manager.records)
    assert_tracks(run, vanilla, TOL)


def test_under_memory_pressure_residents_go_back_to_the_host_exactly(sizes: list[int], vanilla: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """At the third dispatch the device has less free than half the headroom: residents go back to the host, newest
    first (their state written to the homes first), until the headroom would be free (here, the tiny model's
    subgroups being far smaller than the 2 GiB headroom, all of them); the run goes on exactly. At the second
    dispatch, just above half the headroom, nothing moves."""
    memory = _reading_for(sizes, RESIDENT)
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(memory))
    free = {1: memory.headroom // 2, 2: memory.headroom // 2 - 1}  # by update phases recorded before the dispatch

    def free_device_bytes(self: OptimizerStateManager) -> int | None:
        return free.get(len(self.records))

    monkeypatch.setattr(OptimizerStateManager, "free_device_bytes", free_device_bytes)
    run = train("host", steps=6, clip=CLIP, strategy=_auto("host"))
    manager = run.strategy.manager
    assert manager.released == tuple(reversed(range(RESIDENT))) and manager.resident == ()
    assert manager.executor.resident is None
    kept = [r.timings.resident_params for r in manager.records]
    assert kept == [sum(sizes[:RESIDENT])] * 2 + [0] * 4
    assert all(r.timings.host_params == sum(sizes) for r in manager.records[2:])  # back in the host lane
    assert_tracks(run, vanilla, TOL)


def test_a_checkpoint_of_auto_residents_resumes_with_and_without_them(tmp_path: Any, sizes: list[int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the device lane, whose fused Adam is the residents' own (bit for bit), a checkpoint written mid-run with
    residents resumes to the uninterrupted run with residents chosen again and with none."""
    from tests.integration.test_resident import _SaveAfter

    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    full = train("device", steps=6, epoch_batches=3, clip=CLIP, strategy=_auto("device"))
    assert full.strategy.manager.resident == tuple(range(RESIDENT))
    path = str(tmp_path / "mid.ckpt")
    train("device", steps=6, epoch_batches=3, clip=CLIP, strategy=_auto("device"), every_step=_SaveAfter(path, 3))
    for resident in ("auto", 0):
        resumed = train("device", steps=6, epoch_batches=3, clip=CLIP, ckpt_path=path,
                        strategy=make_strategy("device", resident_gib=resident))
        assert len(resumed.strategy.manager.resident) == (RESIDENT if resident == "auto" else 0)
        assert resumed.losses == full.losses[3:]
        assert torch.equal(resumed.masters, full.masters)


def test_resident_gib_above_the_budget_is_refused() -> None:
    from lightning_dos import DeepOptimizerStatesStrategy

    with pytest.raises(ValueError, match="resident_gib: 4.0 GiB is more than memory_budget_gib"):
        DeepOptimizerStatesStrategy(resident_gib=4.0, memory_budget_gib=2)


def test_the_budget_covers_the_residents_and_leaves_the_rest_to_the_device_lane(
        sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(HUGE))
    budget = _budget_gib(sizes, RESIDENT)
    run = train("device", steps=4, clip=CLIP, strategy=_auto("device", memory_budget_gib=budget))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT))
    assert manager.lane_budget_bytes == int(budget * GIB) - 12 * sum(sizes[:RESIDENT])
    vanilla4 = shared_run(None, steps=4, clip=CLIP)
    assert_tracks(run, vanilla4, TOL)
