"""Where each subgroup's state lives (:mod:`lightning_dos.planning.placement`), as arithmetic with exact figures: the
room beside the measured peak, residents in id order, what the host must hold, and the memory plan that refuses a run
the box cannot hold, listing every problem."""

from __future__ import annotations

import pytest

from lightning_dos.planning.placement import (
    GIB,
    HEADROOM_MIN_BYTES,
    HOST_RESERVE_BYTES,
    DeviceMemory,
    DoesNotFit,
    Home,
    HostMemory,
    Placement,
    fill,
    headroom_bytes,
    memory_plan,
    place,
    resident_room,
    residents_to_release,
    slot_bytes,
    start_plan,
)
from lightning_dos.planning.plan import Lane

D, H = Home.DEVICE, Home.HOST
#: A device far larger than any test's subgroups: only a budget decides.
HUGE = DeviceMemory(total=1024 * GIB, peak=0, other=0)


def test_headroom_is_a_share_of_the_device_with_a_floor() -> None:
    assert headroom_bytes(80 * GIB) == int(0.08 * 80 * GIB)
    assert headroom_bytes(10 * GIB) == HEADROOM_MIN_BYTES  # 0.8 GiB would be less than the floor


def test_the_room_is_what_the_peak_the_headroom_and_the_slots_leave() -> None:
    memory = DeviceMemory(total=80 * GIB, peak=40 * GIB, other=1 * GIB)
    # the peak already holds every gradient the first backward kept: nothing is taken for them again
    assert resident_room(memory, slot_bytes=GIB) == 80 * GIB - GIB - 40 * GIB - int(0.08 * 80 * GIB) - GIB
    assert resident_room(memory, budget_bytes=5 * GIB, slot_bytes=GIB) == 4 * GIB
    assert resident_room(memory, budget_bytes=GIB // 2, slot_bytes=GIB) == 0  # never negative
    assert resident_room(DeviceMemory(total=16 * GIB, peak=15 * GIB, other=0)) == 0
    with pytest.raises(ValueError, match="negative"):
        resident_room(memory, budget_bytes=-1)


def test_residents_fill_the_room_in_id_order() -> None:
    assert fill([10, 20, 30, 5], 12 * 30) == (0, 1)
    assert fill([10, 20, 30, 5], 12 * 35) == (0, 1, 3)  # 30 no longer fits; 5 still does
    assert fill([10, 20], 0) == ()
    assert fill([0, 10], 12 * 10) == (1,)  # an empty subgroup is nothing to keep


def test_placement_from_a_reading_a_budget_or_by_hand() -> None:
    sizes = [100, 200, 300, 50]
    slots = slot_bytes(sizes)
    assert slots == 2 * 300 * 16  # two pieces of the largest subgroup, state and gradient row
    by_budget = place(sizes, HUGE, budget_bytes=slots + 12 * 350)
    assert by_budget.homes == (D, D, H, D) and by_budget.resident == (0, 1, 3)
    assert by_budget.params(sizes, D) == 350 and by_budget.params(sizes, H) == 300
    assert place(sizes, HUGE).homes == (D,) * 4  # no budget: everything fits the big device
    assert place(sizes, None).homes == (H,) * 4  # nothing to measure: everything on the host
    tight = DeviceMemory(total=3 * GIB, peak=GIB, other=0)
    assert place(sizes, tight).homes == (H,) * 4  # 3 - 1 - 2 (headroom) leaves nothing
    by_hand = place(sizes, tight, resident_bytes=12 * 300)
    assert by_hand.homes == (D, D, H, H) and by_hand.memory is None  # the reading does not decide then
    assert by_hand.params(sizes, D) == 300 and by_hand.room == 12 * 300


def test_under_pressure_the_newest_residents_go_first_until_the_headroom_is_free() -> None:
    sizes = [100, 100, 100, 100]
    assert residents_to_release((0, 1, 2), sizes, free_bytes=0, needed_bytes=12 * 150) == (2, 1)
    assert residents_to_release((0, 1, 2), sizes, free_bytes=12 * 150, needed_bytes=12 * 150) == ()
    assert residents_to_release((0, 2), sizes, free_bytes=0, needed_bytes=10**9) == (2, 0)  # not enough: all


def test_a_reading_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        DeviceMemory(total=GIB, peak=-1, other=0)
    with pytest.raises(ValueError, match="bad figures"):
        HostMemory(total=GIB, available=GIB, ranks=0)


def test_the_ranks_of_a_host_share_what_it_has_available() -> None:
    host = HostMemory(total=128 * GIB, available=120 * GIB, ranks=4)
    assert host.share == 30 * GIB - HOST_RESERVE_BYTES and host.reserve == HOST_RESERVE_BYTES
    small = HostMemory(total=20 * GIB, available=GIB)  # a small host keeps 5% free, not 4 GiB
    assert small.reserve == GIB and small.share == 0


def test_what_a_rank_holds_on_the_host_already_counts_towards_its_share() -> None:
    """A reading taken after some homes were made on the host: they are in use, so not available, and a plan that keeps
    them there counts them again; they are part of what the rank may take, not a second claim on what is left."""
    host = HostMemory(total=128 * GIB, available=28 * GIB, held=93 * GIB)
    assert host.share == 121 * GIB - HOST_RESERVE_BYTES and host.room == 28 * GIB - HOST_RESERVE_BYTES
    sizes = [GIB // 16] * 100  # 1 GiB of host state each
    plan = memory_plan(sizes, Placement(homes=(Home.HOST,) * 100), host, None, "after the first step")
    assert plan.fits and "93.00 held by this rank's state already" in plan.describe()
    assert not memory_plan(sizes * 2, Placement(homes=(Home.HOST,) * 200), host, None, "after").fits


def test_the_memory_plan_counts_16_bytes_a_parameter_on_the_host_and_splits_it_by_lane() -> None:
    sizes = [1000, 2000, 3000]
    placement = place(sizes, None, resident_bytes=12 * 1000)
    host = HostMemory(total=64 * GIB, available=32 * GIB)
    plan = memory_plan(sizes, placement, host, None, "after the first step", lanes=[Lane.HOST, Lane.DEVICE,
                                                                                      Lane.HOST], host_extra_bytes=7)
    assert plan.fits and plan.host_needed == 16 * 5000 + 7  # 12 of state, 4 of an fp32 gradient (the default)
    rows = {name: (n, params) for name, n, params, _ in plan.rows()}
    assert rows == {"GPU, resident": (1, 1000), "host, streamed (device lane)": (1, 2000),
                    "host, CPU Adam (host lane)": (1, 3000)}
    table = plan.describe()
    assert "memory plan (after the first step)" in table and "32.00 available" in table
    plan.check()  # fits: no error
    assert [name for name, *_ in memory_plan(sizes, placement, host, None, "x").rows()] == ["GPU, resident", "host"]
    # as a report keeps it: the same tiers, the readings, what the host needs
    device = DeviceMemory(total=80 * GIB, peak=30 * GIB, other=GIB)
    kept = memory_plan(sizes, placement, host, device, "after the first step").to_json()
    assert [(t["home"], t["subgroups"], t["params"]) for t in kept["tiers"]] == [("GPU, resident", 1, 1000),
                                                                                 ("host", 2, 5000)]
    assert kept["device"] == {"total_gib": 80.0, "peak_gib": 30.0, "other_gib": 1.0,
                              "headroom_gib": device.headroom / GIB}
    assert kept["host"]["available_gib"] == 32.0 and kept["host"]["may_take_gib"] == host.share / GIB
    assert kept["host_needed_gib"] == 16 * 5000 / GIB and kept["fits"] and kept["when"] == "after the first step"


def test_a_plan_the_host_cannot_hold_raises_with_the_numbers_and_what_to_change() -> None:
    sizes = [GIB // 4] * 8  # 2 GiB-params: 32 GiB on the host, if nothing is resident
    host = HostMemory(total=32 * GIB, available=20 * GIB)
    plan = memory_plan(sizes, place(sizes, None), host, None, "after the first step")
    assert not plan.fits and len(plan.problems) == 1
    with pytest.raises(DoesNotFit) as caught:
        plan.check()
    message = str(caught.value)
    assert "the host needs 32.00 GiB" in message and f"may take {host.share / GIB:.2f} GiB" in message
    assert host.share == 20 * GIB - int(0.05 * 32 * GIB)  # 5% of this host kept free, under the 4 GiB cap
    assert "activation checkpointing" in message and "more GPUs" in message  # what to change
    assert "GPU, resident" in message  # the whole table comes with it
    assert "nothing was allocated for its optimizer state." in message


def test_a_refusal_after_the_first_step_names_the_host_gradients_it_made_at_start() -> None:
    sizes = [GIB // 4] * 8
    held = HostMemory(total=32 * GIB, available=4 * GIB, held=3 * GIB)  # 2 bytes a parameter of 6 subgroups
    plan = memory_plan(sizes, place(sizes, None), held, None, "after the first forward and backward")
    with pytest.raises(DoesNotFit) as caught:
        plan.check()
    message = str(caught.value)
    assert "stops before its first update" in message
    assert ("nothing was allocated for its optimizer state beyond the 3.00 GiB of host gradients made for its first "
            "backward") in message
    assert "3.00 held by this rank's state already" in message


def test_the_plan_at_start_is_the_best_case_each_candidate_with_its_gradient() -> None:
    sizes = [GIB // 8] * 48  # 6 GiB-params
    device = DeviceMemory(total=80 * GIB, peak=12 * GIB, other=GIB)  # 16-bit params, buffers; no activations yet
    host = HostMemory(total=128 * GIB, available=120 * GIB)
    plan = start_plan(sizes, host, device, grad_bytes_per_param=2)
    # room: 80 - 1 - 12 - 6.4 headroom - 1 (two slots of 2^25 params at 16 bytes); a candidate takes 12 + 2 bytes
    room = 80 * GIB - GIB - 12 * GIB - int(0.08 * 80 * GIB) - 2 * 2**25 * 16
    assert plan.placement.room == room and plan.placement.resident == fill(sizes, room, 14)
    candidates = len(plan.placement.resident)
    assert 0 < candidates < len(sizes) and plan.device_needed_bytes == 2 * candidates * (GIB // 8)
    assert plan.host_needed == 16 * (len(sizes) - candidates) * (GIB // 8)
    assert plan.fits and "before the first step" in plan.when
    # the budget counts the candidates' state alone (12 bytes a parameter), after the slots
    budgeted = start_plan(sizes, host, device, 2, budget_bytes=2 * 2**25 * 16 + 12 * 3 * (GIB // 8))
    assert budgeted.placement.resident == (0, 1, 2)
    small_host = HostMemory(total=16 * GIB, available=8 * GIB)
    assert not start_plan(sizes, small_host, device, 2).fits  # the host cannot hold the rest, even at best
