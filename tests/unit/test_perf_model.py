"""The performance model, the planner and calibration, checked against hand-computed schedules.

Most cases use toy units (a subgroup of 1 parameter, rates of a few bytes per second) so that every duration is
a multiple of 1/16 s and every expected value is exact in binary floating point.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from pathlib import Path

import pytest

from lightning_dos.planning import (
    Calibrator,
    CostParams,
    Lane,
    Plan,
    StepMeasurement,
    best_plan,
    candidate_lanes,
    candidate_plans,
    demote_to_fit,
    device_memory_bytes,
    even_device_lanes,
    fewer_slots_to_fit,
    grads_for,
    kept_grads,
    largest_first,
    predict,
    probe_plan,
    probe_plans,
    rank_plans,
    resolve_plan,
)
from lightning_dos.planning.perf_model import (
    PIECE_PARAMS,
    PREFETCH_WINDOW,
    buffer_slots,
    early_prefetches,
    predicted_makespan_s,
)

H, D = Lane.HOST, Lane.DEVICE


def toy(**changes: float) -> CostParams:
    """Toy rates: prefetch of 1 param (16 B) = 1 s, flush (12 B) = 1 s, GPU Adam = 1 s, CPU Adam = 2 s (contended)."""
    values = dict(
        cpu_adam_params_per_s=1.0,
        cpu_contention=0.5,
        h2d_bytes_per_s=16.0,
        d2h_bytes_per_s=12.0,
        duplex_bytes_per_s=1000.0,  # no duplex cap unless a test lowers it
        gpu_adam_params_per_s=1.0,
        launch_overhead_s=0.0,
        host_upload_bytes_per_param=2,  # the exact-number tests below were worked out for 2 B/param uploads
    )
    values.update(changes)
    return CostParams(**values)


def letters(plan: Plan) -> str:
    return "".join(lane.letter for lane in plan.lanes)


# --- CostParams ---------------------------------------------------------------------------------------------------


def test_cost_params_defaults_are_the_starting_values_docs_performance_model_lists():
    """Every field of ``CostParams`` has a row in the Parameters table of docs/performance-model.md, and its
    default is the value that row gives."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "performance-model.md").read_text()
    table = doc[doc.index("### Parameters"):doc.index("### Effective rates")]
    documented: dict[str, float] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            names = re.findall(r"`(\w+)`", cells[0])
            values = [float(v) for v in cells[2].split(",")]
            documented.update(zip(names, values if len(values) == len(names) else values * len(names)))
    params = CostParams()
    fields = {f.name for f in dataclasses.fields(params)}
    assert set(documented) == fields
    assert {name: float(getattr(params, name)) for name in fields} == documented
    assert params.duplex_scale() == pytest.approx(101.6 / 110.9, rel=1e-15)  # duplex / (h2d + d2h)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cpu_contention": 0.0}, r"^cpu_contention: 0.0 is outside \(0, 1\]; set cpu_contention"),
        ({"cpu_contention": 1.2}, r"^cpu_contention: 1.2 is outside"),
        ({"h2d_bytes_per_s": -1.0}, r"^h2d_bytes_per_s: -1.0 is not a rate; set h2d_bytes_per_s to a positive"),
        ({"gpu_adam_params_per_s": float("nan")}, r"^gpu_adam_params_per_s: nan is not a rate"),
        ({"launch_overhead_s": -1e-6}, r"^launch_overhead_s: -1e-06 must be"),
        ({"dispatch_lead_s": -0.5}, r"^dispatch_lead_s: -0.5 must be a finite number of seconds >= 0"),
        ({"dispatch_lead_s": float("inf")}, r"^dispatch_lead_s: inf must be"),
        ({"ranks_per_host": 0}, r"^ranks_per_host: 0; set ranks_per_host to an integer >= 1"),
        ({"ranks_per_host": True}, r"^ranks_per_host: True; set ranks_per_host to an integer >= 1"),
        ({"state_bytes_per_param": 0}, r"^state_bytes_per_param: must be > 0"),
        ({"grad_bytes_per_param": 4.5}, r"^grad_bytes_per_param: 4.5 is not a byte count"),
        ({"device_grad_bytes_per_param": -2}, r"^device_grad_bytes_per_param: -2 is not a byte count"),
    ],
)
def test_cost_params_validation_names_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        CostParams(**changes)


def test_with_values_converts_and_rejects_unknown_names():
    params = CostParams().with_values({"ranks_per_host": 2.0, "cpu_adam_params_per_s": 4e9})
    assert params.ranks_per_host == 2 and isinstance(params.ranks_per_host, int)
    assert params.cpu_adam_params_per_s == 4e9
    with pytest.raises(ValueError, match=r"^overrides: 'cpu_rate' is not a cost parameter; use one of cpu_adam_"):
        CostParams().with_values({"cpu_rate": 1.0})
    with pytest.raises(ValueError, match=r"^overrides: ranks_per_host must be an integer, got 1.5"):
        CostParams().with_values({"ranks_per_host": 1.5})


# --- predict: the device-lane pipeline ----------------------------------------------------------------------------


@pytest.mark.parametrize(("buffers", "makespan"), [(1, 9.0), (2, 6.0), (3, 5.0), (4, 5.0)])
def test_device_pipeline_depth(buffers, makespan):
    # every stage takes 1 s. 1 slot: fully serial, 3 subgroups * 3 stages = 9.
    # 2 slots: k0 0-1|1-2|2-3, k1 1-2|2-3|3-4, k2 prefetch waits for flush(k0) at 3: 3-4|4-5|5-6 -> 6.
    # 3+ slots: a perfect pipeline, 3 + 2 = 5.
    plan = resolve_plan("device", [1, 1, 1], buffers=buffers)
    prediction = predict(plan, [1, 1, 1], toy())
    assert prediction.makespan_s == makespan == prediction.device_lane_s
    assert prediction.host_lane_s == 0.0


def test_early_prefetches_one_per_slot_at_most_the_window():
    assert PREFETCH_WINDOW == 2
    assert [early_prefetches(b, n) for b, n in [(2, 0), (1, 5), (2, 5), (3, 5), (4, 1)]] == [0, 1, 2, 2, 1]
    assert [buffer_slots(b, n) for b, n in [(2, 0), (1, 5), (3, 5), (4, 1)]] == [1, 1, 3, 1]


@pytest.mark.parametrize(
    ("buffers", "lead", "makespan"),
    [
        # 2 slots, lead 2: both early prefetches end by 0: k0 -2..-1|0-1|1-2, k1 -1..0|1-2|2-3,
        # k2 waits for flush(k0): 2-3|3-4|4-5 -> 5 (6 without a head start)
        (2, 2.0, 5.0),
        # lead 0.5: k0 -0.5..0.5|0.5-1.5|1.5-2.5, k1 0.5-1.5|1.5-2.5|2.5-3.5, k2 2.5-3.5|3.5-4.5|4.5-5.5
        (2, 0.5, 5.5),
        # 1 slot, lead 2: one early prefetch, -2..-1|0-1|1-2, then serial: 2-5, 5-8
        (1, 2.0, 8.0),
        # 3 slots, lead 5: two early prefetches (the window), -5..-4 and -4..-3; k2 is issued in the phase: 0-1,
        # its Adam waits for k1's (1-2): 2-3, flush 3-4 -> 4 (5 without)
        (3, 5.0, 4.0),
        # no lead: as without early prefetches
        (2, 0.0, 6.0),
    ],
)
def test_prefetches_issued_at_dispatch_get_a_head_start(buffers, lead, makespan):
    plan = resolve_plan("device", [1, 1, 1], buffers=buffers)
    prediction = predict(plan, [1, 1, 1], toy(dispatch_lead_s=lead))
    assert prediction.makespan_s == makespan
    assert prediction.events[0].h2d_start_s == -lead
    assert prediction.events[0].adam_start_s == max(0.0, 1.0 - lead)  # no Adam before the phase
    assert predicted_makespan_s(plan, [1, 1, 1], toy(dispatch_lead_s=lead)) == makespan


def test_a_head_start_moves_uploads_behind_no_early_prefetch():
    # H D D, 2 slots, CPU Adam 1 s, upload 2 B / 16 B/s = 0.125 s.
    # no lead: prefetches 0-1 and 1-2 (the upload, ready at 1, waits for the second: 2-2.125), flushes end at 3, 4.
    # lead 2: prefetches -2..-1 and -1..0, Adams 0-1 and 1-2, flushes 1-2 and 2-3; the link is free for the upload at 1
    plan = Plan(lanes=(H, D, D), buffers=2)
    slow = predict(plan, [1, 1, 1], toy(cpu_contention=1.0))
    fast = predict(plan, [1, 1, 1], toy(cpu_contention=1.0, dispatch_lead_s=2.0))
    assert (slow.makespan_s, slow.events[0].h2d_start_s, slow.events[0].h2d_end_s) == (4.0, 2.0, 2.125)
    assert (fast.makespan_s, fast.events[0].h2d_start_s, fast.events[0].h2d_end_s) == (3.0, 1.0, 1.125)
    assert fast.host_lane_s == 1.125
    # the host lane alone has no device lane to start early
    host = resolve_plan("host", [1, 1])
    assert predict(host, [1, 1], toy(dispatch_lead_s=2.0)).makespan_s == predict(host, [1, 1], toy()).makespan_s


def test_device_pipeline_unequal_sizes_and_launch_overhead():
    # sizes 2 1 1, 2 slots, Adam = 0.25 + size, prefetch = 16*size/16, flush = 12*size/12
    # k0: prefetch 0-2,     adam 2-4.25,    flush 4.25-6.25
    # k1: prefetch 2-3,     adam 4.25-5.5,  flush 6.25-7.25   (adam waits for adam(k0), flush for flush(k0))
    # k2: prefetch 6.25-7.25 (slot of k0 frees at 6.25), adam 7.25-8.5, flush 8.5-9.5
    prediction = predict(resolve_plan("device", [2, 1, 1]), [2, 1, 1], toy(launch_overhead_s=0.25))
    assert prediction.makespan_s == 9.5
    e = prediction.events
    assert (e[1].h2d_start_s, e[1].h2d_end_s, e[1].adam_start_s, e[1].adam_end_s) == (2.0, 3.0, 4.25, 5.5)
    assert (e[1].d2h_start_s, e[1].d2h_end_s, e[1].start_s, e[1].end_s) == (6.25, 7.25, 2.0, 7.25)
    assert (e[2].h2d_start_s, e[2].adam_start_s, e[2].d2h_end_s) == (6.25, 7.25, 9.5)
    assert all(event.lane is D for event in e)
    # 4 params: 16 B each way in, 12 B out; busy times are the sums of stage durations
    assert (prediction.bytes_h2d, prediction.bytes_d2h) == (64, 48)
    assert (prediction.h2d_busy_s, prediction.d2h_busy_s, prediction.adam_busy_s) == (4.0, 4.0, 4.75)


def test_device_lane_follows_plan_order():
    # sizes 2 1, order (1, 0), 1 slot: subgroup 1 first 0-1|1-2|2-3, then subgroup 0 3-5|5-7|7-9
    plan = Plan(lanes=(D, D), device_order=(1, 0), buffers=1)
    events = predict(plan, [2, 1], toy()).events
    assert (events[1].start_s, events[1].end_s, events[0].start_s, events[0].end_s) == (0.0, 3.0, 3.0, 9.0)


def test_grad_already_on_device_is_not_prefetched():
    # 1 param, grad on the GPU: prefetch 12 B / 16 B/s = 0.75, adam 1, flush 1 -> 2.75
    prediction = predict(resolve_plan("device", [1]), [1], toy(), grads_on_device=frozenset({0}))
    assert prediction.makespan_s == 2.75 and prediction.bytes_h2d == 12


def test_duplex_cap_applies_only_with_a_device_lane():
    params = toy(cpu_adam_params_per_s=2.0, ranks_per_host=2, h2d_bytes_per_s=16.0, d2h_bytes_per_s=16.0,
                 duplex_bytes_per_s=16.0)
    # device lane: both directions scaled by 16 / (16 + 16) = 0.5 -> 8 B/s; prefetch 16/8 = 2, adam 1, flush 12/8
    assert predict(resolve_plan("device", [1]), [1], params).makespan_s == 2 + 1 + 1.5
    # host only: CPU rate 2 / 2 ranks = 1 param/s, no contention -> Adam 4 s; upload 4*2 B at the full 16 B/s = 0.5
    prediction = predict(resolve_plan("host", [4]), [4], params)
    assert (prediction.host_lane_s, prediction.makespan_s, prediction.device_lane_s) == (4.5, 4.5, 0.0)
    event = prediction.events[0]
    assert (event.lane, event.adam_start_s, event.adam_end_s, event.h2d_start_s, event.h2d_end_s) == (H, 0, 4, 4, 4.5)
    assert event.d2h_start_s is None and prediction.bytes_h2d == 8 and prediction.bytes_d2h == 0


# --- predict: both lanes --------------------------------------------------------------------------------------------


def test_mixed_plan_contention_and_uploads():
    # lanes H D H D, sizes 2 1 2 1, 1 slot. Host CPU rate 1 * contention 0.5: subgroup 0 Adam 0-4, subgroup 2 4-8.
    # Device (1 s stages): subgroup 1 0-1|1-2|2-3; subgroup 3 waits for the slot: 3-4|4-5|5-6.
    # Uploads (2 B/param at 16 B/s = 0.25 s for 2 params) go on the H2D link after each CPU Adam: 4-4.25, 8-8.25.
    plan = Plan(lanes=(H, D, H, D), buffers=1)
    prediction = predict(plan, [2, 1, 2, 1], toy())
    assert (prediction.host_lane_s, prediction.device_lane_s, prediction.makespan_s) == (8.25, 6.0, 8.25)
    e = prediction.events
    assert (e[0].adam_start_s, e[0].adam_end_s, e[0].h2d_start_s, e[0].h2d_end_s, e[0].end_s) == (0, 4, 4, 4.25, 4.25)
    assert (e[2].adam_start_s, e[2].adam_end_s, e[2].h2d_end_s) == (4, 8, 8.25)
    assert (e[3].h2d_start_s, e[3].d2h_end_s) == (3.0, 6.0)
    # H2D: 2 prefetches of 16 B + uploads of 4 params * 2 B; D2H: 2 flushes of 12 B
    assert (prediction.bytes_h2d, prediction.bytes_d2h) == (40, 24)
    assert (prediction.host_busy_s, prediction.h2d_busy_s, prediction.d2h_busy_s, prediction.adam_busy_s) == (
        8.0, 2.5, 2.0, 2.0)


def test_an_upload_ready_first_delays_the_next_prefetch():
    # lanes H D D, sizes 8 4 4, 1 slot, no contention, uploads of 16 B/param (1 s per param).
    # subgroup 1: prefetch 0-4, adam 4-8, flush 8-12 -> the slot frees at 12.
    # subgroup 0: CPU Adam 0-8, its upload is ready at 8 < 12 and takes the link 8-16.
    # subgroup 2: prefetch waits for the link: 16-20, adam 20-24, flush 24-28.
    params = toy(cpu_contention=1.0, host_upload_bytes_per_param=16)
    prediction = predict(Plan(lanes=(H, D, D), buffers=1), [8, 4, 4], params)
    e = prediction.events
    assert (e[0].h2d_start_s, e[0].h2d_end_s) == (8.0, 16.0)
    assert (e[2].h2d_start_s, e[2].adam_start_s, e[2].d2h_end_s) == (16.0, 20.0, 28.0)
    assert (prediction.host_lane_s, prediction.makespan_s) == (16.0, 28.0)


def test_a_prefetch_wins_a_tie_with_an_upload():
    # lanes H D D, sizes 12 4 4, 1 slot: CPU Adam of subgroup 0 ends at 12, exactly when the slot frees.
    # The prefetch of subgroup 2 goes first (12-16), then the upload (24 B at 16 B/s: 16-17.5).
    prediction = predict(Plan(lanes=(H, D, D), buffers=1), [12, 4, 4], toy(cpu_contention=1.0))
    e = prediction.events
    assert (e[2].h2d_start_s, e[0].h2d_start_s, e[0].h2d_end_s) == (12.0, 16.0, 17.5)
    assert prediction.makespan_s == 24.0  # subgroup 2: adam 16-20, flush 20-24


def test_host_lane_never_waits_for_its_uploads():
    # lanes H H H D, sizes 1 1 1 4, 1 buffer slot, no contention: CPU Adam 1 s per subgroup, uploads of 16 B/param
    # take 1 s each, the device subgroup's prefetch takes 4 s (0-4) and holds the link.
    # The uploads queue behind it (4-5, 5-6, 6-7) but CPU Adam runs back to back (0-1, 1-2, 2-3): the host thread
    # issues uploads and goes on; only the link orders them.
    params = toy(cpu_contention=1.0, host_upload_bytes_per_param=16)
    prediction = predict(Plan(lanes=(H, H, H, D), buffers=1), [1, 1, 1, 4], params)
    e = prediction.events
    assert [(e[j].adam_start_s, e[j].adam_end_s) for j in range(3)] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert [(e[j].h2d_start_s, e[j].h2d_end_s) for j in range(3)] == [(4.0, 5.0), (5.0, 6.0), (6.0, 7.0)]
    assert (prediction.host_busy_s, prediction.host_lane_s) == (3.0, 7.0)


def test_predict_rejects_mismatches():
    with pytest.raises(ValueError, match=r"^plan: has 2 lanes but the partition has 3 subgroups"):
        predict(resolve_plan("host", [1, 1]), [1, 1, 1], toy())
    with pytest.raises(ValueError, match=r"^grads_on_device: subgroups \[5\] do not exist"):
        predict(resolve_plan("host", [1, 1]), [1, 1], toy(), grads_on_device=frozenset({5}))


# --- device memory --------------------------------------------------------------------------------------------------


def test_a_buffer_slot_holds_a_piece_of_a_subgroup_larger_than_a_piece():
    """The device lane streams a subgroup a piece at a time: two slots for gpt-2.7b's largest subgroup (128,778,240
    parameters) take 2 x 32M x 16 B = 1 GiB, not 3.8 GiB; a subgroup smaller than a piece sizes the slot itself."""
    sizes = [128_778_240, 78_676_480, 1000]
    assert device_memory_bytes(Plan(lanes=(D, D, H)), sizes) == 2 * PIECE_PARAMS * 16 == 2**30
    assert device_memory_bytes(Plan(lanes=(H, H, D)), sizes) == 2 * 1000 * 16
    whole = CostParams(slot_params=10**12)  # the device lane before pieces: a slot held the largest subgroup
    assert device_memory_bytes(Plan(lanes=(D, D, H)), sizes, whole) == 2 * 128_778_240 * 16


def test_device_memory_bytes():
    plan = Plan(lanes=(D, H, D, D), buffers=2)
    sizes = [10, 20, 30, 5]
    # 2 slots * 30 params * (12 + 4) B = 960, + 4 B for the params of device subgroups 0 and 3 whose grads stay
    # on the GPU ((10 + 5) * 4 = 60); subgroup 1 is on the host, so its grad does not count.
    assert device_memory_bytes(plan, sizes, CostParams(), frozenset({0, 1, 3})) == 1020
    assert device_memory_bytes(plan, sizes, frozenset({0, 1, 3})) == 1020  # ids in third place read as grads
    assert device_memory_bytes(plan, sizes) == 960
    assert device_memory_bytes(resolve_plan("host", sizes), sizes) == 0
    # gradients kept in 16 bits: 2 B each for the kept ones ((10 + 5) * 2 = 30); the slots keep a 4-byte grad row
    bf16 = CostParams(device_grad_bytes_per_param=2)
    assert device_memory_bytes(plan, sizes, bf16, frozenset({0, 1, 3})) == 990
    assert device_memory_bytes(plan, sizes, bf16) == 960
    # a 16-bit host gradient moves 2 B a parameter on the link, but the slot's gradient row stays fp32-sized
    host16 = CostParams(grad_bytes_per_param=2)
    assert device_memory_bytes(plan, sizes, host16) == 960
    assert device_memory_bytes(plan, sizes, CostParams(slot_grad_bytes_per_param=2)) == 2 * 30 * 14


def test_gradients_kept_in_16_bits_fit_beside_two_slots_where_fp32_ones_do_not():
    """HDHD of 4 equal subgroups, 2 slots: 32 B of slots, + 8 B of kept fp32 gradients or + 4 B of bf16 ones.
    Within 36 B only the bf16 ones are kept; then no gradient is prefetched: 12 B per prefetch instead of 16, at
    32 B/s 0.375 s instead of 0.5, so the device lane (prefetch, Adam 0.5 s, flush 0.5 s per subgroup) ends at
    0.375 + 0.375 + 0.5 + 0.5 + 0.125 = 1.875 s instead of 2.0 (the host lane, 2.5625 s, still ends the step)."""
    params = CostParams(**PLANNER)
    sizes = [1] * 4
    everything = frozenset(range(4))
    hdhd2 = Plan(lanes=(H, D, H, D), buffers=2)
    bf16 = replace(params, device_grad_bytes_per_param=2)
    assert grads_for(hdhd2, sizes, params, 36, everything) == frozenset()
    assert grads_for(hdhd2, sizes, bf16, 36, everything) == frozenset({1, 3})
    kept, via_host = predict(hdhd2, sizes, bf16, frozenset({1, 3})), predict(hdhd2, sizes, params)
    assert (kept.bytes_h2d, via_host.bytes_h2d) == (2 * 12 + 2 * 2, 2 * 16 + 2 * 2)
    # sent to the host in 16 bits, the prefetches move 14 B a parameter
    assert predict(hdhd2, sizes, replace(params, grad_bytes_per_param=2)).bytes_h2d == 2 * 14 + 2 * 2
    assert (max(e.end_s for e in kept.events if e.lane is D), max(e.end_s for e in via_host.events if e.lane is D)) \
        == (1.875, 2.0)
    best = rank_plans(sizes, bf16, 36, grads_on_device=everything)[0][0]
    assert (letters(best), best.buffers) == ("HDHD", 2)
    assert grads_for(best, sizes, bf16, 36, everything) == frozenset({1, 3})


# --- planner --------------------------------------------------------------------------------------------------------

PLANNER = dict(
    cpu_adam_params_per_s=1.0, cpu_contention=0.8, h2d_bytes_per_s=32.0, d2h_bytes_per_s=24.0,
    duplex_bytes_per_s=1000.0, gpu_adam_params_per_s=2.0, launch_overhead_s=0.0,
    host_upload_bytes_per_param=2,  # the tables below were worked out for 2 B/param uploads
)


def test_candidate_plans():
    plans = list(candidate_plans([1] * 4, max_buffers=2))
    # all-host once, then k = 1..4 spread evenly with 1 and 2 slots; k=1: targets (i+1)/4, device at i=2 (.5 < .75);
    # then the named plans' lanes not seen yet: stride:4 HHHD (stride:2, stride:3 are HDHD, HHDH), and the fractions
    # by 1/20: after subgroup i the device holds round_half_down(f (i + 1)) -> 0.3 HDHH, 0.55 DHDH, 0.8 DDHD,
    # 0.85 DDDH (the others repeat lanes already listed)
    assert [(letters(p), p.buffers) for p in plans] == [
        ("HHHH", 1), ("HHDH", 1), ("HHDH", 2), ("HDHD", 1), ("HDHD", 2), ("DHDD", 1), ("DHDD", 2), ("DDDD", 1),
        ("DDDD", 2), ("HHHD", 1), ("HHHD", 2), ("HDHH", 1), ("HDHH", 2), ("DHDH", 1), ("DHDH", 2), ("DDHD", 1),
        ("DDHD", 2), ("DDDH", 1), ("DDDH", 2),
    ]
    assert {p.source for p in plans} == {"auto"}
    assert ["".join(lane.letter for lane in lanes) for lanes in candidate_lanes([5, 1, 1])] == [
        "HHH", "DHH", "DDH", "DDD", "HDH", "HHD", "HDD", "DHD"]  # even k = 0..3, stride:2, stride:3, fractions


def test_best_plan_weighs_the_placements_users_name():
    """A large first subgroup: spread evenly, the device lane takes it and waits on its long transfers; fraction
    0.5 by size keeps it on the host, and is what auto must find (PLANNER rates, 2 slots at most).

    HDDD: host 3 params at 0.8/s = 3.75 s + upload 6 B / 32 B/s = 3.9375; device: three 1-param subgroups through
    2 slots end at 3.0. The best evenly spread plan, DHDH with 2 slots, ends at 5.0 (prefetch of subgroup 0 for
    1.5 s, its Adam 1.5-3, its flush 3-4.5, then subgroup 2's flush 4.5-5).
    """
    sizes = [3, 1, 1, 1]
    params = CostParams(**PLANNER)
    plan = best_plan(sizes, params, None, max_buffers=2)
    assert (letters(plan), plan.buffers, predict(plan, sizes, params).makespan_s) == ("HDDD", 2, 3.9375)
    assert letters(resolve_plan(0.5, sizes)) == "HDDD"
    even = [Plan(lanes=even_device_lanes(sizes, k), buffers=b) for k in range(5) for b in (1, 2)]
    assert min(predict(p, sizes, params).makespan_s for p in even) == 5.0
    for spec in [f"stride:{k}" for k in range(2, 5)] + [j / 10 for j in range(11)]:
        assert predict(plan, sizes, params).makespan_s <= predict(resolve_plan(spec, sizes), sizes, params).makespan_s


def test_a_plan_that_runs_demoted_keeps_the_gradients_of_its_remaining_device_subgroups():
    """Sizes 3 1 1 1, all on the device, 2 slots, bf16 gradients kept (2 B), budget 40 B: the slots alone need
    2 * 3 * 16 = 96 B, so dispatch demotes subgroup 0 (the largest); then 2 * 1 * 16 = 32 B of slots + 3 * 2 = 6 B
    of kept gradients fit. The gradients kept are those of subgroups 1-3, not none."""
    params = CostParams(device_grad_bytes_per_param=2)
    sizes = [3, 1, 1, 1]
    plan = Plan(lanes=(D, D, D, D), buffers=2)
    everything = frozenset(range(4))
    assert grads_for(plan, sizes, params, 40, everything) is None
    assert letters(demote_to_fit(plan, sizes, 40, params)[0]) == "HDDD"
    assert kept_grads(plan, sizes, params, 40, everything) == frozenset({1, 2, 3})
    assert kept_grads(plan, sizes, params, None, everything) == everything  # no budget: all of them
    assert kept_grads(plan, sizes, params, 31, everything) == frozenset()  # not even one slot pair with gradients
    assert kept_grads(plan, sizes, params, 37, everything) == frozenset()  # 32 + 6 > 37: slots only


def test_the_host_lane_runs_in_its_host_order_and_auto_ends_it_on_small_subgroups():
    """All host, sizes 1 1 4 (PLANNER rates, no contention without a device lane: 1 param/s; uploads 2 B/param at
    32 B/s). In id order the 4-param subgroup ends the lane: Adams 0-1, 1-2, 2-6, its upload 6-6.25. Largest first
    (2, 0, 1): Adams 0-4, 4-5, 5-6, and the last upload is a 1-param one, 6-6.0625. ``auto`` weighs both."""
    params = CostParams(**PLANNER)
    sizes = [1, 1, 4]
    in_ids = Plan(lanes=(H, H, H))
    assert predict(in_ids, sizes, params).makespan_s == 6.25
    assert largest_first(in_ids, sizes) == (2, 0, 1)
    reordered = Plan(lanes=(H, H, H), host_order=(2, 0, 1))
    prediction = predict(reordered, sizes, params)
    assert prediction.makespan_s == 6.0625
    assert [(e.subgroup, e.adam_start_s, e.adam_end_s) for e in sorted(prediction.events, key=lambda e: e.start_s)] \
        == [(2, 0.0, 4.0), (0, 4.0, 5.0), (1, 5.0, 6.0)]
    plan = best_plan(sizes, params, 0)  # no device memory: the host lane alone, largest first
    assert (plan.host_order, plan.source) == ((2, 0, 1), "auto")
    # equal sizes: largest first is id order, weighed once; unequal ones: both orders are weighed
    assert [p.host_order for p in candidate_plans([1] * 3, 1) if not p.device_order] == [(0, 1, 2)]
    assert [p.host_order for p in candidate_plans(sizes, 1) if not p.device_order] == [(0, 1, 2), (2, 0, 1)]


@pytest.mark.parametrize(
    ("budget", "lanes", "buffers", "makespan"),
    [
        # 4 subgroups of 1 param: prefetch 0.5 s, GPU Adam 0.5 s, flush 0.5 s, CPU Adam 1 s alone or 1.25 s
        # contended, upload 0.0625 s. Best plans per number k of device subgroups:
        #   k=0 HHHH: 4 + 0.0625                                         = 4.0625
        #   k=1 HHDH: 3 * 1.25 + 0.0625                                  = 3.8125
        #   k=2 HDHD, 2+ slots: host 2 * 1.25 + 0.0625 = 2.5625 (device ends at 2)       -> 2.5625
        #       1 slot: the second prefetch waits for the first flush (1.5): device ends at 3    -> 3.0
        #   k=3 DHDD, 3+ slots: prefetches 0-1.5, flushes end at 2.5; host 1.25 + upload      -> 2.5
        #       2 slots -> 3.0, 1 slot -> 4.5;  k=4 DDDD: 3+ slots -> 3.0, 2 slots -> 3.5, 1 slot -> 6.0
        # Device memory = slots * 1 param * 16 B.
        (None, "DHDD", 3, 2.5),  # unlimited: k=3 with 3 slots (4 slots ties, fewer wins)
        (40, "HDHD", 2, 2.5625),  # 2 slots at most (32 B): k=2 beats k=3 (3.0)
        (16, "HDHD", 1, 3.0),  # 1 slot: k=2 (3.0) beats k=1 (3.8125), k=3 (4.5), k=4 (6.0)
        (15, "HHHH", 1, 4.0625),  # not even one slot fits
        (0, "HHHH", 1, 4.0625),
    ],
)
def test_best_plan_hand_computed(budget, lanes, buffers, makespan):
    params = CostParams(**PLANNER)
    plan = best_plan([1] * 4, params, budget)
    assert (letters(plan), plan.buffers, plan.source) == (lanes, buffers, "auto")
    assert predict(plan, [1] * 4, params).makespan_s == makespan


def test_rank_plans_orders_ties_by_fewer_device_subgroups_then_fewer_buffers():
    ranked = rank_plans([1] * 4, CostParams(**PLANNER), None)
    table = [(letters(plan), plan.buffers, prediction.makespan_s) for plan, prediction in ranked]
    # the schedules of the table in test_best_plan_hand_computed (DHDD with 1 slot: subgroup 0 0-.5|.5-1|1-1.5,
    # the upload of subgroup 1 takes the link 1.25-1.3125, subgroup 2 1.5-2|2-2.5|2.5-3, subgroup 3 3-3.5|..|4-4.5)
    # With equal sizes, where the device subgroups sit does not change the schedule: the named plans' other placements
    # (HHHD, HDHH; DHDH; DDHD, DDDH) tie with the even spread of the same count and slots, and come after it.
    assert table == [
        ("DHDD", 3, 2.5), ("DDHD", 3, 2.5), ("DDDH", 3, 2.5), ("DHDD", 4, 2.5), ("DDHD", 4, 2.5), ("DDDH", 4, 2.5),
        ("HDHD", 2, 2.5625), ("DHDH", 2, 2.5625), ("HDHD", 3, 2.5625), ("DHDH", 3, 2.5625), ("HDHD", 4, 2.5625),
        ("DHDH", 4, 2.5625),
        ("HDHD", 1, 3.0), ("DHDH", 1, 3.0), ("DHDD", 2, 3.0), ("DDHD", 2, 3.0), ("DDDH", 2, 3.0), ("DDDD", 3, 3.0),
        ("DDDD", 4, 3.0),
        ("DDDD", 2, 3.5),
        ("HHDH", 1, 3.8125), ("HHHD", 1, 3.8125), ("HDHH", 1, 3.8125), ("HHDH", 2, 3.8125), ("HHHD", 2, 3.8125),
        ("HDHH", 2, 3.8125), ("HHDH", 3, 3.8125), ("HHHD", 3, 3.8125), ("HDHH", 3, 3.8125), ("HHDH", 4, 3.8125),
        ("HHHD", 4, 3.8125), ("HDHH", 4, 3.8125),
        ("HHHH", 1, 4.0625),
        ("DHDD", 1, 4.5), ("DDHD", 1, 4.5), ("DDDH", 1, 4.5),
        ("DDDD", 1, 6.0),
    ]


def test_best_plan_never_exceeds_the_budget():
    sizes = [40_000_000] * 11 + [13_000_000]
    params = CostParams()
    for gib in (0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 8, 16):
        budget = gib * 2**30
        plan = best_plan(sizes, params, budget)
        assert device_memory_bytes(plan, sizes, params) <= budget
    assert best_plan(sizes, params, 0).device_subgroups() == ()


def test_candidates_that_do_not_fit_the_budget_are_weighed_as_dispatch_would_demote_them():
    """stride:2 of [4, 1, 1, 1] puts subgroups 0 and 2 on the device: 2 slots of 4 params (128 B) do not fit 40 B, so
    dispatch would run it demoted (subgroup 0, the largest, to the host): HHDH, 2 slots of 1 param (32 B). The
    planner weighs that plan (and no second all-host plan)."""
    sizes, params = [4, 1, 1, 1], CostParams(**PLANNER)
    ranked = [plan for plan, _ in rank_plans(sizes, params, 40)]
    stride = Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in "DHDH"), buffers=2, source="stride:2")
    demoted, _ = demote_to_fit(stride, sizes, 40, params)
    assert letters(demoted) == "HHDH" and device_memory_bytes(demoted, sizes, params) == 32
    assert any(p.lanes == demoted.lanes and p.buffers == 2 and p.source == "auto" for p in ranked)
    assert sum(not p.device_order for p in ranked) == 1
    assert all(device_memory_bytes(p, sizes, params) <= 40 for p in ranked)


def test_best_plan_rejects_a_negative_budget():
    with pytest.raises(ValueError, match=r"^memory_budget_gib: -1 GiB is not a budget; set memory_budget_gib"):
        best_plan([1], CostParams(), -(2**30))


def test_demote_to_fit_moves_the_largest_last_in_order_first():
    sizes = [10, 30, 30, 20]
    plan = resolve_plan("device", sizes)  # 2 slots * 30 * 16 B = 960
    # 700 B: demote 2 (30, last of the two largest in order) -> still 960; demote 1 -> 2 * 20 * 16 = 640 fits
    fitted, demoted = demote_to_fit(plan, sizes, 700)
    assert demoted == (2, 1) and letters(fitted) == "DHHD" and fitted.source == "device+demoted"
    assert device_memory_bytes(fitted, sizes) == 640
    # with order (3, 2, 1, 0) subgroup 1 is the later of the two 30s
    reordered = Plan(lanes=plan.lanes, device_order=(3, 2, 1, 0), source="list")
    assert demote_to_fit(reordered, sizes, 700)[1] == (1, 2)
    # nothing free: everything goes to the host, largest first
    fitted, demoted = demote_to_fit(plan, sizes, 0)
    assert demoted == (2, 1, 3, 0) and letters(fitted) == "HHHH"
    assert demote_to_fit(plan, sizes, 960) == (plan, ())


def test_fewer_slots_to_fit_keeps_the_lanes_and_takes_slots_down_to_one():
    """Sizes 4 1 1 1 all on the device, 3 slots of 4 * 16 B: 192 B. Within 130 B two slots (128 B) remain; within
    10 B not even one fits, and one is what it keeps (what still does not fit is demote_to_fit's)."""
    sizes = [4, 1, 1, 1]
    plan = Plan(lanes=(D, D, D, D), buffers=3, source="probe")
    assert fewer_slots_to_fit(plan, sizes, 192) is plan
    two = fewer_slots_to_fit(plan, sizes, 130)
    assert (two.buffers, two.lanes, two.source, device_memory_bytes(two, sizes)) == (2, plan.lanes, "probe", 128)
    assert fewer_slots_to_fit(plan, sizes, 10).buffers == 1
    fitted, demoted = demote_to_fit(fewer_slots_to_fit(plan, sizes, 20), sizes, 20)  # one slot of 1 param: 16 B
    assert (letters(fitted), fitted.buffers, demoted) == ("HDDD", 1, (0,))


# --- calibration ----------------------------------------------------------------------------------------------------


def step(**values: float) -> StepMeasurement:
    base = dict(host_params=0, host_busy_s=0.0, host_overlapped=False, device_params=0, h2d_bytes=0, h2d_busy_s=0.0,
                d2h_bytes=0, d2h_busy_s=0.0, adam_busy_s=0.0, predicted_s=0.0, measured_s=0.0)
    base.update(values)
    return StepMeasurement(**base)


def test_calibrator_host_rate_alone_and_contended():
    calibrator = Calibrator(CostParams(cpu_adam_params_per_s=4e9, cpu_contention=1.0), alpha=0.5)
    # alone: 2e9 params in 1 s on 1 rank -> 2e9; the first measurement replaces the starting value
    calibrator.observe(step(host_params=2_000_000_000, host_busy_s=1.0))
    assert calibrator.params.cpu_adam_params_per_s == 2e9
    # the next ones are averaged: 0.5 * 2e9 + 0.5 * 4e9
    calibrator.observe(step(host_params=4_000_000_000, host_busy_s=1.0))
    assert calibrator.params.cpu_adam_params_per_s == 3e9
    # overlapped: 1.5e9 / 3e9 = 0.5, the first contention measured -> 0.5
    calibrator.observe(step(host_params=1_500_000_000, host_busy_s=1.0, host_overlapped=True))
    assert (calibrator.params.cpu_adam_params_per_s, calibrator.params.cpu_contention) == (3e9, 0.5)
    # overlapped but faster than alone (6e9 > 3e9): contention -> 0.5 * 0.5 + 0.5 * 1 = 0.75,
    # rate -> 0.5 * 3e9 + 0.5 * 6e9 / 0.75
    calibrator.observe(step(host_params=6_000_000_000, host_busy_s=1.0, host_overlapped=True))
    assert calibrator.params.cpu_contention == 0.75
    assert calibrator.params.cpu_adam_params_per_s == pytest.approx(1.5e9 + 3e9 / 0.75, rel=1e-15)


def test_calibrator_fits_the_rate_while_only_contended_steps_were_seen():
    """Contended steps alone cannot separate the uncontended rate from the contention: the starting contention is
    kept and the rate follows the machine, so a host-only plan is not predicted at another host's speed."""
    calibrator = Calibrator(CostParams(cpu_adam_params_per_s=5e9, cpu_contention=0.5), alpha=0.5)
    # overlapped, 1e9 params/s: rate -> 1e9 / 0.5 = 2e9 (first measurement), contention unchanged
    calibrator.observe(step(host_params=1_000_000_000, host_busy_s=1.0, host_overlapped=True))
    assert (calibrator.params.cpu_adam_params_per_s, calibrator.params.cpu_contention) == (2e9, 0.5)
    # 1.5e9 -> 0.5 * 2e9 + 0.5 * 3e9
    calibrator.observe(step(host_params=1_500_000_000, host_busy_s=1.0, host_overlapped=True))
    assert calibrator.params.cpu_adam_params_per_s == 2.5e9
    # the first host-only step measures the uncontended rate itself: it replaces the inferred one
    calibrator.observe(step(host_params=1_800_000_000, host_busy_s=1.0))
    assert calibrator.params.cpu_adam_params_per_s == 1.8e9
    # from now on contended steps fit the contention: 0.99e9 / 1.8e9 = 0.55 (its first measurement), then 0.45
    calibrator.observe(step(host_params=990_000_000, host_busy_s=1.0, host_overlapped=True))
    assert calibrator.params.cpu_adam_params_per_s == 1.8e9
    assert calibrator.params.cpu_contention == pytest.approx(0.55, rel=1e-15)
    calibrator.observe(step(host_params=810_000_000, host_busy_s=1.0, host_overlapped=True))
    assert calibrator.params.cpu_contention == pytest.approx(0.5, rel=1e-15)
    # a pinned uncontended rate makes the contention identifiable from the start
    pinned = Calibrator(CostParams(cpu_adam_params_per_s=5e9, cpu_contention=1.0), alpha=0.5,
                        overrides={"cpu_adam_params_per_s": 4e9})
    pinned.observe(step(host_params=2_000_000_000, host_busy_s=1.0, host_overlapped=True))
    assert (pinned.params.cpu_adam_params_per_s, pinned.params.cpu_contention) == (4e9, 0.5)


def test_calibrator_counts_ranks_and_keeps_overrides_fixed():
    calibrator = Calibrator(CostParams(cpu_adam_params_per_s=4e9, cpu_contention=1.0, ranks_per_host=2),
                            alpha=0.5, overrides={"cpu_contention": 0.5, "gpu_adam_params_per_s": 1e11})
    assert calibrator.params.cpu_contention == 0.5 and calibrator.params.gpu_adam_params_per_s == 1e11
    # overlapped with pinned contention: 1.5e9 params/s per rank * 2 ranks = 3e9 -> rate 3e9 / 0.5 = 6e9
    calibrator.observe(step(host_params=1_500_000_000, host_busy_s=1.0, host_overlapped=True, device_params=10,
                            adam_busy_s=1.0))
    assert calibrator.params.cpu_adam_params_per_s == 6e9
    assert calibrator.params.cpu_contention == 0.5 and calibrator.params.gpu_adam_params_per_s == 1e11
    # the next one is averaged: 1e9 * 2 / 0.5 = 4e9 -> 0.5 * 6e9 + 0.5 * 4e9
    calibrator.observe(step(host_params=1_000_000_000, host_busy_s=1.0, host_overlapped=True))
    assert calibrator.params.cpu_adam_params_per_s == 5e9
    with pytest.raises(ValueError, match=r"^overrides: 'bogus' is not a cost parameter"):
        Calibrator(CostParams(), overrides={"bogus": 1.0})


def test_calibrator_pcie_and_gpu_rates():
    capped = CostParams(h2d_bytes_per_s=64e9, d2h_bytes_per_s=64e9, duplex_bytes_per_s=96e9, launch_overhead_s=0.25,
                        gpu_adam_params_per_s=2e11)
    calibrator = Calibrator(capped, alpha=0.5)
    # duplex cap active (64 + 64 > 96): learn the sum 48e9 + 32e9 = 80e9 (the first measurement: it replaces 96e9),
    # and the split: H2D took 48 / 80 = 0.6 of it -> 0.6 and 0.4 of the rates' sum 128e9 (kept): 76.8e9, 51.2e9
    # GPU: 1e11 params in 1.5 s minus 2 launches * 0.25 s = 1 s -> 1e11
    calibrator.observe(step(device_params=100_000_000_000, h2d_bytes=48_000_000_000, h2d_busy_s=1.0,
                            d2h_bytes=32_000_000_000, d2h_busy_s=1.0, adam_busy_s=1.5, device_subgroups=2))
    p = calibrator.params
    assert p.duplex_bytes_per_s == 80e9
    assert p.h2d_bytes_per_s == pytest.approx(76.8e9, rel=1e-12)
    assert p.d2h_bytes_per_s == pytest.approx(51.2e9, rel=1e-12)
    assert p.duplex_scale() == pytest.approx(80 / 128, rel=1e-12)  # the rates' sum is kept
    assert p.gpu_adam_params_per_s == 1e11
    # again: sum 60e9 + 40e9 = 100e9 -> 90e9; the H2D share is 0.6 again, so the split stays; GPU 2e11 -> 1.5e11
    calibrator.observe(step(device_params=100_000_000_000, h2d_bytes=60_000_000_000, h2d_busy_s=1.0,
                            d2h_bytes=40_000_000_000, d2h_busy_s=1.0, adam_busy_s=1.0, device_subgroups=2))
    p = calibrator.params
    assert (p.duplex_bytes_per_s, p.gpu_adam_params_per_s) == (90e9, 1.5e11)
    assert p.h2d_bytes_per_s == pytest.approx(76.8e9, rel=1e-12)
    # host-only step: uploads alone, 8e9 B in 0.25 s = 32e9, the first direct H2D measurement -> 32e9; then 40e9
    calibrator.observe(step(h2d_bytes=8_000_000_000, h2d_busy_s=0.25))
    assert calibrator.params.h2d_bytes_per_s == pytest.approx(32e9, rel=1e-12)
    calibrator.observe(step(h2d_bytes=8_000_000_000, h2d_busy_s=0.2))
    assert calibrator.params.h2d_bytes_per_s == pytest.approx(36e9, rel=1e-12)
    # an overridden direction pins the split
    pinned = Calibrator(capped, alpha=0.5, overrides={"d2h_bytes_per_s": 64e9})
    pinned.observe(step(device_params=1, h2d_bytes=48_000_000_000, h2d_busy_s=1.0, d2h_bytes=32_000_000_000,
                        d2h_busy_s=1.0))
    assert (pinned.params.h2d_bytes_per_s, pinned.params.d2h_bytes_per_s) == (64e9, 64e9)

    uncapped = Calibrator(CostParams(h2d_bytes_per_s=40e9, d2h_bytes_per_s=40e9, duplex_bytes_per_s=100e9), alpha=0.5)
    uncapped.observe(step(device_params=1, h2d_bytes=30_000_000_000, h2d_busy_s=1.0, d2h_bytes=20_000_000_000,
                          d2h_busy_s=1.0))
    assert (uncapped.params.h2d_bytes_per_s, uncapped.params.d2h_bytes_per_s) == (30e9, 20e9)
    uncapped.observe(step(device_params=1, h2d_bytes=50_000_000_000, h2d_busy_s=1.0, d2h_bytes=40_000_000_000,
                          d2h_busy_s=1.0))
    assert (uncapped.params.h2d_bytes_per_s, uncapped.params.d2h_bytes_per_s) == (40e9, 30e9)
    assert uncapped.params.duplex_bytes_per_s == 100e9


def test_calibrator_learns_the_dispatch_lead_from_steps_with_early_prefetches():
    calibrator = Calibrator(CostParams(), alpha=0.5)
    calibrator.observe(step(lead_s=0.0))  # no early prefetches: nothing measured
    assert calibrator.params.dispatch_lead_s == 0.0
    calibrator.observe(step(lead_s=0.08))  # the first measurement replaces the start value
    assert calibrator.params.dispatch_lead_s == 0.08
    calibrator.observe(step(lead_s=0.04))
    assert calibrator.params.dispatch_lead_s == pytest.approx(0.06, rel=1e-15)
    pinned = Calibrator(CostParams(), overrides={"dispatch_lead_s": 0.0})
    pinned.observe(step(lead_s=0.08))
    assert pinned.params.dispatch_lead_s == 0.0


def test_calibrator_drift_history_and_replan():
    calibrator = Calibrator(CostParams(), drift_tolerance=0.10)
    assert calibrator.median_relative_error() is None and not calibrator.should_replan()
    assert calibrator.drifted(1.0, 1.25)  # |1 - 1.25| / 1.25 = 0.2
    assert not calibrator.drifted(1.05, 1.0)  # 0.05
    for predicted, measured in ((1.5, 2.0), (2.0, 2.0), (3.0, 2.0)):  # errors 0.25, 0, 0.5
        calibrator.observe(step(predicted_s=predicted, measured_s=measured))
    assert calibrator.history == ((1.5, 2.0), (2.0, 2.0), (3.0, 2.0))
    assert calibrator.median_relative_error() == 0.25
    assert calibrator.observations == 3
    assert not calibrator.should_replan(patience=3)  # the middle step was spot on
    assert calibrator.should_replan(patience=1)
    with pytest.raises(ValueError, match=r"^measured_s: 0.0; a measured step time must be > 0"):
        calibrator.drifted(1.0, 0.0)


def test_calibrator_rejects_bad_settings():
    with pytest.raises(ValueError, match=r"^alpha: 0 is outside \(0, 1\]"):
        Calibrator(CostParams(), alpha=0)
    with pytest.raises(ValueError, match=r"^drift_tolerance: -0.1; set drift_tolerance"):
        Calibrator(CostParams(), drift_tolerance=-0.1)


def test_probe_plans_run_the_host_lane_alone_then_half_on_each_lane():
    host, mixed = probe_plans([7] * 5, buffers=3)
    assert (letters(host), letters(mixed)) == ("HHHHH", "HDHDH")
    assert (host.source, mixed.source, host.buffers, mixed.buffers) == ("probe", "probe", 3, 3)


def test_probe_plan_puts_half_on_each_lane():
    # count 2 of 4 equal: HDHD; 2 of 5: targets 0.4 0.8 1.2 1.6 2 -> device at i=1 (.5<.8) and i=3 (1.5<1.6)
    assert (letters(probe_plan([7] * 4)), probe_plan([7] * 4).source) == ("HDHD", "probe")
    assert letters(probe_plan([7] * 5)) == "HDHDH"
    assert letters(probe_plan([7])) == "H"


def test_best_plan_sends_gradients_to_the_host_when_slots_and_gradients_do_not_fit_together():
    """Within 36 B, HDHD with 2 slots fits only with its gradients on the host (32 B; kept on the GPU: 40 B).

    With gradients on the host it runs as in the hand-computed table (2.5625 s), which beats every plan that
    fits with its gradients kept (HDHD with 1 slot: subgroup 3's prefetch waits for subgroup 1's flush, 2.75 s).
    """
    params = CostParams(**PLANNER)
    sizes = [1] * 4
    everything = frozenset(range(4))
    hdhd2 = Plan(lanes=(H, D, H, D), buffers=2)
    assert grads_for(hdhd2, sizes, params, 40, everything) == frozenset({1, 3})
    assert grads_for(hdhd2, sizes, params, 36, everything) == frozenset()
    assert grads_for(hdhd2, sizes, params, 31, everything) is None
    hdhd1 = Plan(lanes=(H, D, H, D), buffers=1)
    assert predict(hdhd1, sizes, params, frozenset({1, 3})).makespan_s == 2.75
    plan = best_plan(sizes, params, 36, grads_on_device=everything)
    assert (letters(plan), plan.buffers) == ("HDHD", 2)
    ranked = rank_plans(sizes, params, 36, grads_on_device=everything)
    assert ranked[0][1].makespan_s == 2.5625
