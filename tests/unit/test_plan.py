"""Plans: parsing user values, resolving them against subgroup sizes, serialising (the no-torch guarantee, in a fresh
interpreter: tests/system/test_planning_without_torch.py)."""

from __future__ import annotations

import json

import pytest

from lightning_dos.planning import (
    Lane,
    Plan,
    PlanSpec,
    even_device_lanes,
    fraction_lanes,
    parse_plan,
    resolve_plan,
    stride_lanes,
)

H, D = Lane.HOST, Lane.DEVICE


def letters(plan_or_lanes: Plan | tuple[Lane, ...]) -> str:
    lanes = plan_or_lanes.lanes if isinstance(plan_or_lanes, Plan) else plan_or_lanes
    return "".join(lane.letter for lane in lanes)


# --- parse_plan ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", PlanSpec(kind="auto")),
        ("host", PlanSpec(kind="host")),
        (" Device ", PlanSpec(kind="device")),
        (0.5, PlanSpec(kind="fraction", fraction=0.5)),
        (0, PlanSpec(kind="fraction", fraction=0.0)),
        (1, PlanSpec(kind="fraction", fraction=1.0)),
        ("0.25", PlanSpec(kind="fraction", fraction=0.25)),
        ("stride:3", PlanSpec(kind="stride", stride=3)),
        ("stride:1", PlanSpec(kind="stride", stride=1)),
        (["host", "d", "H", "device"], PlanSpec(kind="list", lanes=(H, D, H, D))),
        ((Lane.DEVICE, "h"), PlanSpec(kind="list", lanes=(D, H))),
    ],
)
def test_parse_plan_accepts(value, expected):
    assert parse_plan(value) == expected


@pytest.mark.parametrize(
    "value", ["strid:2", "stride:0", "stride:-1", "stride:1.5", 1.5, -0.1, "2", "nan", float("inf"), True, None, [],
              "", {"lanes": []}]
)
def test_parse_plan_rejects_with_the_key_and_the_accepted_forms(value):
    with pytest.raises(ValueError) as err:
        parse_plan(value)
    assert str(err.value) == (
        f"plan: {value!r} is not a plan; set plan to 'auto', 'host', 'device', a fraction in [0, 1], "
        "'stride:K' (K >= 1) or a list of 'host'/'device' per subgroup"
    )


def test_parse_plan_rejects_a_bad_lane_name_in_a_list():
    with pytest.raises(ValueError, match=r"^plan: element 1: 'gpu' is not a lane; use 'host' or 'device'"):
        parse_plan(["host", "gpu"])


def test_spec_source_labels():
    assert [parse_plan(v).source for v in ("auto", "host", "device", 0.5, "stride:3", ["h"])] == [
        "auto", "host", "device", "fraction:0.5", "stride:3", "list",
    ]


# --- resolve_plan -------------------------------------------------------------------------------------------------


def test_resolve_host_and_device():
    assert letters(resolve_plan("host", [5, 5, 5])) == "HHH"
    device = resolve_plan("device", [5, 5, 5], buffers=3)
    assert letters(device) == "DDD" and device.device_order == (0, 1, 2) and device.buffers == 3
    assert device.source == "device"


def test_fraction_equal_sizes_spreads_device_subgroups_evenly():
    # equal sizes: subgroup i goes to the device iff D + 1/2 < f * (i + 1)  (D = device subgroups so far)
    # f=0.5: targets .5 1 1.5 2 -> H (tie) D H (tie) D
    assert letters(resolve_plan(0.5, [7] * 4)) == "HDHD"
    # f=0.25 over 8: targets .25 .5 .75 1 1.25 1.5 1.75 2 -> device at i=2 (.5<.75) and i=6 (1.5<1.75)
    assert letters(resolve_plan(0.25, [7] * 8)) == "HHDHHHDH"
    # f=1/3 over 6: targets 1/3 2/3 1 4/3 5/3 2 -> device at i=1 (.5<2/3) and i=4 (1.5<5/3)
    assert letters(resolve_plan(1 / 3, [7] * 6)) == "HDHHDH"


def test_fraction_unequal_sizes_follows_the_running_size_target():
    # sizes 4 1 1 2, f=.5: running totals 4 5 6 8, targets 2 2.5 3 4
    # i0: |4-2| = |0-2| tie -> H; i1: |1-2.5| < |0-2.5| -> D (D=1); i2: |2-3| < |1-3| -> D (D=2); i3: |4-4| < 2 -> D
    plan = resolve_plan(0.5, [4, 1, 1, 2])
    assert letters(plan) == "HDDD" and plan.device_fraction([4, 1, 1, 2]) == 0.5
    # sizes 3 1 3 1, f=.5: targets 1.5 2 3.5 4 -> H (tie), D (|1-2|<2), D (|4-3.5|<|1-3.5|), H (|5-4| > |4-4|)
    assert letters(resolve_plan(0.5, [3, 1, 3, 1])) == "HDDH"
    # sizes 10 10 10 10 60, f=.3: targets 3 6 9 12 30 -> H, D (|10-6|<6), H (|20-9|>1), H (8>2), H (40>20)
    assert letters(resolve_plan(0.3, [10, 10, 10, 10, 60])) == "HDHHH"


def test_decimal_fraction_is_read_as_the_decimal_not_its_float():
    # f=0.1 over 10 equal: at i=4 the target 0.1 * 5 is exactly 1/2 -> tie -> host; the float 0.1 is a little above
    # 1/10 and would have put subgroup 4 on the device. First device subgroup: i=5 (target 0.6).
    assert letters(resolve_plan(0.1, [1] * 10)) == "HHHHHDHHHH"


def test_fraction_extremes():
    assert letters(fraction_lanes([3, 0, 4], 0.0)) == "HHH"
    assert letters(fraction_lanes([3, 0, 4], 1.0)) == "DDD"  # the zero-size subgroup too


def test_stride():
    # subgroup i on the device iff (i + 1) % K == 0
    assert letters(resolve_plan("stride:3", [1] * 7)) == "HHDHHDH"
    assert letters(resolve_plan("stride:1", [1] * 3)) == "DDD"
    assert letters(stride_lanes(4, 10)) == "HHHH"


def test_list_must_match_the_subgroup_count():
    assert letters(resolve_plan(["d", "h", "d"], [1, 2, 3])) == "DHD"
    with pytest.raises(ValueError, match=r"^plan: the list has 2 lanes but the partition has 3 subgroups; .*exactly 3"):
        resolve_plan(["d", "h"], [1, 2, 3])


def test_auto_is_not_resolved_here():
    with pytest.raises(ValueError, match=r"^plan: 'auto' is chosen by the planner"):
        resolve_plan("auto", [1, 2])


def test_resolve_rejects_bad_sizes_and_buffers():
    with pytest.raises(ValueError, match=r"^sizes: subgroup 1 has size -3"):
        resolve_plan("host", [1, -3])
    with pytest.raises(ValueError, match=r"^buffers: 0 is not a number of device buffer slots; set buffers"):
        resolve_plan("host", [1], buffers=0)


def test_even_device_lanes_equals_fraction_rule_for_equal_sizes():
    for n in range(1, 10):
        for count in range(n + 1):
            lanes = even_device_lanes([5] * n, count)
            assert lanes == fraction_lanes([5] * n, count / n), (n, count)
            assert lanes.count(D) == count


def test_even_device_lanes_unequal_sizes_gives_exactly_count():
    # sizes 5 1 1 1, count 2: targets 2*T_i/8 = 1.25 1.5 1.75 2 -> D (.5<1.25), H (1.5<1.5 no), D (1.5<1.75), H (full)
    assert letters(even_device_lanes([5, 1, 1, 1], 2)) == "DHDH"
    # sizes 1 100, count 1: target at i0 is 1/101 -> H; i1 is needed to reach the count -> D
    assert letters(even_device_lanes([1, 100], 1)) == "HD"
    assert letters(even_device_lanes([1, 100], 2)) == "DD"
    with pytest.raises(ValueError, match=r"^plan: cannot put 3 of 2 subgroups"):
        even_device_lanes([1, 100], 3)


# --- Plan ---------------------------------------------------------------------------------------------------------


def test_plan_queries():
    plan = Plan(lanes=(D, H, D, H), device_order=(2, 0), buffers=3, source="list")
    assert plan.device_subgroups() == (0, 2)
    assert plan.host_subgroups() == (1, 3)
    assert plan.device_order == (2, 0)
    # by parameters: (10 + 30) / (10 + 20 + 30 + 40)
    assert plan.device_fraction([10, 20, 30, 40]) == 0.4
    assert Plan(lanes=(H, D, D)).device_order == (1, 2)  # default order: ascending ids
    assert plan.host_order == (1, 3) and Plan(lanes=(H, D, H), host_order=(2, 0)).host_order == (2, 0)


def test_plan_coerces_lane_names_and_rejects_a_bad_order():
    assert Plan(lanes=("device", "h")).lanes == (D, H)
    with pytest.raises(ValueError, match=r"^plan: device_order \[1\] must list each device-lane subgroup \[0, 1\]"):
        Plan(lanes=(D, D), device_order=(1,))
    with pytest.raises(ValueError, match=r"^plan: device_order \[0, 1\] must list"):
        Plan(lanes=(D, H), device_order=(0, 1))
    with pytest.raises(ValueError, match=r"^plan: host_order \[0, 1\] must list each host-lane subgroup \[0\] "
                                         r"exactly once; set host_order to a permutation of the host-lane subgroup"):
        Plan(lanes=(H, D), host_order=(0, 1))


def test_plan_json_round_trip():
    plan = Plan(lanes=(H, D, D, H), device_order=(2, 1), buffers=4, source="auto", host_order=(3, 0))
    data = plan.to_json()
    assert data == {"lanes": ["host", "device", "device", "host"], "order": [2, 1], "buffers": 4, "source": "auto",
                    "host_order": [3, 0]}
    assert Plan.from_json(json.loads(json.dumps(data))) == plan
    # a plan saved before the host order was part of it: the host lane in id order
    del data["host_order"]
    assert Plan.from_json(data).host_order == (0, 3)
    with pytest.raises(ValueError, match=r"^plan: \[1\] is not a saved plan"):
        Plan.from_json([1])


def test_plan_str():
    assert str(resolve_plan(0.5, [3] * 4)) == "plan fraction:0.5 [HDHD] 2 buffers, 50.0% on device"
    assert str(resolve_plan("host", [3] * 2, buffers=1)) == "plan host [HH] 1 buffer, 0.0% on device"
    long = str(resolve_plan("stride:2", [1] * 70))
    assert long == "plan stride:2 [" + "HD" * 32 + "...] 2 buffers, 50.0% on device"
    reordered = Plan(lanes=(H, D, H), host_order=(2, 0), source="auto")
    assert str(reordered) == "plan auto [HDH] 2 buffers, 33.3% on device, host lane in order 2 0"
    assert str(Plan(lanes=(H,) * 10, host_order=tuple(range(9, -1, -1)))).endswith("in order 9 8 7 6 5 4 3 2 ...")


def test_demote():
    plan = Plan(lanes=(D, D, H, D), device_order=(3, 1, 0), buffers=2, source="fraction:0.75")
    demoted = plan.demote([1, 2])  # 2 is already on the host
    assert letters(demoted) == "DHHD" and demoted.device_order == (3, 0) and demoted.source == "fraction:0.75+demoted"
    assert demoted.demote([0]).source == "fraction:0.75+demoted"  # not suffixed twice
    assert plan.demote([2]) is plan
    assert demoted.host_order == (1, 2)  # the host lane in id order stays so
    # a chosen host order takes the demoted subgroups first
    chosen = Plan(lanes=(D, H, D, H), host_order=(3, 1), source="auto")
    assert chosen.demote([2, 0]).host_order == (0, 2, 3, 1)
    with pytest.raises(ValueError, match=r"^plan: cannot demote subgroups \[4\]"):
        plan.demote([4])


# --- no torch -----------------------------------------------------------------------------------------------------


