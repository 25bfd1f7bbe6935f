"""``auto``'s plan trials (lightning_dos.planning.trials): exact numbers, and a replay of a GPU host's figures."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from lightning_dos.planning import Calibrator, CostParams, rank_plans
from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.planning.trials import TRIAL_SOURCE, PlanTrials


def _plan(letters: str, buffers: int = 2, source: str = "auto") -> Plan:
    return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in letters), buffers=buffers, source=source)


def _letters(plan: Plan) -> str:
    return "".join(lane.letter for lane in plan.lanes)


A, B, C, D = _plan("DHDH"), _plan("HDHD"), _plan("DDHH"), _plan("HHDD")
RANKED = [(B, 0.98), (A, 1.00), (_plan("HDHD", buffers=1), 1.01), (C, 1.04), (D, 1.06)]


def _run(trials: PlanTrials, plan: Plan, *seconds: float) -> list:
    return [trials.observe(plan, s) for s in seconds]


def test_in_a_row_a_faster_challenger_replaces_the_plan_in_force_and_the_next_one_is_tried_at_once() -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3, interleave=False)
    trials.start(A)
    assert not trials.ready()
    _run(trials, A, 0.50, 0.60, 0.52)  # median 0.52
    assert trials.ready()
    challenger = trials.next_challenger(RANKED, 1.00)
    assert _letters(challenger) == "HDHD" and challenger.source == TRIAL_SOURCE and trials.running
    assert not trials.ready() and trials.next_challenger(RANKED, 1.00) is None  # one trial at a time
    assert _run(trials, B, 0.49, 0.70, 0.50)[:2] == [None, None]
    (verdict,) = trials.verdicts
    assert (verdict.challenger_s, verdict.incumbent_s) == (0.50, 0.52)  # 0.50 < 0.52 * 0.98 = 0.5096: won
    assert verdict.challenger_won and _letters(verdict.kept) == "HDHD" and verdict.kept.source == "auto"
    assert trials.incumbent is verdict.kept and not trials.running
    # the winner's trial phases are its fresh figures: the next trial may start now. HDHD with one buffer has the
    # lanes of a tried plan, so the next candidate within 1.00 * 1.05 is C (1.04); D (1.06) is outside the window
    assert trials.ready()
    assert _letters(trials.next_challenger(RANKED, 1.00)) == "DDHH"


def test_in_a_row_a_challenger_within_the_noise_loses_and_the_plan_in_force_is_measured_afresh() -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3, interleave=False)
    trials.start(A)
    _run(trials, A, 0.50, 0.50, 0.50)
    trials.next_challenger(RANKED, 1.00)
    _run(trials, B, 0.495, 0.49, 0.499)  # median 0.495: 1% faster, not the 2% needed
    (verdict,) = trials.verdicts
    assert not verdict.challenger_won and verdict.kept is A and trials.incumbent is A
    assert not trials.ready()  # A runs three fresh update phases first
    _run(trials, A, 0.51, 0.52)
    assert not trials.ready()
    _run(trials, A, 0.53)
    assert trials.ready()
    assert _letters(trials.next_challenger(RANKED, 1.00)) == "DDHH"
    _run(trials, C, 0.50, 0.50, 0.50)  # 0.50 < 0.52 * 0.98: measured against A's fresh median, 0.52
    assert trials.verdicts[-1].incumbent_s == 0.52 and trials.verdicts[-1].challenger_won


def test_trials_end_when_no_candidate_is_left_or_the_limit_is_reached_and_start_over_with_the_planner() -> None:
    trials = PlanTrials(window=0.0, steps=1, min_gain=0.0, max_trials=1, interleave=False)
    trials.start(A)
    _run(trials, A, 0.5)
    assert trials.next_challenger(RANKED, 0.97) is None  # nothing within 0 % of 0.97 s: no trial until a new choice
    assert not trials.ready()
    trials.start(A)  # the planner chose again
    _run(trials, A, 0.5)
    assert _letters(trials.next_challenger(RANKED, 1.00)) == "HDHD"
    _run(trials, B, 0.6)
    _run(trials, A, 0.5)
    assert not trials.ready()  # max_trials = 1 after this choice of the planner


def test_in_a_row_update_phases_of_other_plans_count_for_neither_side_and_a_starved_trial_is_given_up() -> None:
    trials = PlanTrials(window=0.05, steps=2, min_gain=0.02, max_trials=3, interleave=False)
    trials.start(A)
    _run(trials, D, 0.1, 0.1)  # e.g. A demoted to fit the free memory: not A's figures
    assert not trials.ready()
    _run(trials, A, 0.5, 0.5)
    trials.next_challenger(RANKED, 1.00)
    assert _run(trials, D, 0.1, 0.1, 0.1) == [None, None, None]  # B demoted every time
    verdict = trials.observe(D, 0.1)  # 2 * steps update phases without two of B's: given up
    assert verdict is not None and verdict.challenger_s == math.inf and not verdict.challenger_won
    assert trials.incumbent is A


def _turns(trials: PlanTrials, times: dict[str, list[float]]) -> list[str]:
    """Run a trial with turns to its end: each update phase runs ``trials.next_plan()`` and takes the next of that
    plan's times (by letters); returns the letters in the order they ran."""
    ran: list[str] = []
    left = {letters: list(seconds) for letters, seconds in times.items()}
    while trials.running:
        plan = trials.next_plan()
        ran.append(_letters(plan))
        trials.observe(plan, left[ran[-1]].pop(0))
    return ran


def test_with_turns_the_tried_plan_and_the_plan_in_force_alternate_and_their_turns_are_compared() -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3)
    assert trials.interleave
    assert not trials.ready()  # no plan in force yet
    trials.start(A)
    assert trials.next_plan() is A
    assert trials.ready()  # with turns the first trial may start at once: its turns measure the plan in force
    _run(trials, A, 0.40, 0.40, 0.40)  # the choice's own update phases: fast, but not part of any trial
    assert _letters(trials.next_challenger(RANKED, 1.00)) == "HDHD"
    ran = _turns(trials, {"HDHD": [0.49, 0.70, 0.50], "DHDH": [0.52, 0.60, 0.53]})
    assert ran == ["HDHD", "DHDH"] * 3  # the candidate first, then turns
    (verdict,) = trials.verdicts
    assert (verdict.challenger_s, verdict.incumbent_s) == (0.50, 0.53)  # the trial's own turns, not the 0.40s
    # each turn over the plan in force's turn next to it: 0.49/0.52, 0.70/0.60, 0.50/0.53 -> median 0.50/0.53
    assert verdict.ratio == pytest.approx(0.50 / 0.53) and verdict.ratio < 0.98
    assert verdict.challenger_won and _letters(trials.incumbent) == "HDHD"
    # the next trial starts at once: the plan in force was measured in the trial; C (1.04) is within 5% of 1.00
    assert trials.ready() and _letters(trials.next_challenger(RANKED, 1.00)) == "DDHH"
    _turns(trials, {"DDHH": [0.60, 0.61, 0.62], "HDHD": [0.50, 0.50, 0.50]})
    assert not trials.verdicts[-1].challenger_won and _letters(trials.incumbent) == "HDHD"
    assert trials.next_plan() is trials.incumbent
    assert trials.ready()  # a lost trial needs no fresh update phases either: the next may start at once
    assert trials.next_challenger(RANKED, 1.00) is None  # D (1.06) is outside the window: no candidate left
    assert not trials.ready()


def test_with_turns_a_slow_spell_does_not_decide_the_trial() -> None:
    """The host's slow spells last a few iterations and slow every plan alike (run L). The plan in force takes
    1.00 s, the candidate 0.95 s, and a spell makes three update phases in a row 20% slower: in a row, the candidate
    runs in the spell and loses; with turns, two of its three phases fall in the spell and its median is slower
    than the plan in force's too (1.14 against 1.00), but each phase compared with the one next to it wins."""
    def spell(k: int, seconds: float) -> float:
        return seconds * (1.2 if 3 <= k < 6 else 1.0)

    in_a_row = PlanTrials(interleave=False)
    in_a_row.start(A)
    for k in range(3):
        in_a_row.observe(A, spell(k, 1.00))  # not in the spell
    in_a_row.next_challenger(RANKED, 1.00)
    for k in range(3, 6):
        in_a_row.observe(B, spell(k, 0.95))
    assert not in_a_row.verdicts[-1].challenger_won

    turns = PlanTrials()
    turns.start(A)
    _run(turns, A, 1.00, 1.00, 1.00)
    turns.next_challenger(RANKED, 1.00)
    for k in range(3, 9):
        plan = turns.next_plan()
        turns.observe(plan, spell(k, 0.95 if plan is turns.challenger else 1.00))
    (verdict,) = turns.verdicts
    assert verdict.challenger_s > verdict.incumbent_s  # the medians of the two sides would have kept the old plan
    assert verdict.ratio == pytest.approx(0.95) and verdict.challenger_won


def test_with_turns_other_plans_count_for_neither_side_and_a_starved_trial_is_given_up() -> None:
    trials = PlanTrials(steps=2)
    trials.start(A)
    _run(trials, A, 0.5, 0.5)
    trials.next_challenger(RANKED, 1.00)
    assert trials.next_plan() is trials.challenger
    assert trials.observe(D, 0.1) is None  # the candidate demoted to fit the free memory: counts for no side
    assert trials.next_plan() is trials.challenger  # so it is still the candidate's turn
    trials.observe(trials.challenger, 0.4)
    assert trials.next_plan() is A
    assert _run(trials, D, *[0.1] * 5) == [None] * 5
    verdict = trials.observe(D, 0.1)  # 4 * steps update phases without two turns of each side: given up
    assert verdict is not None and verdict.challenger_s == math.inf and not verdict.challenger_won
    assert trials.incumbent is A


def test_a_key_tells_apart_plans_with_the_same_lanes() -> None:
    """The manager's key adds whether the device lane keeps its gradients on the device: under a budget the same
    lanes run with gradients kept (1 buffer) or on the host (2 buffers), and both may be tried."""
    by_lanes = PlanTrials(steps=1)
    by_buffers = PlanTrials(steps=1, key=lambda plan: (plan.lanes, plan.buffers))
    for trials in (by_lanes, by_buffers):
        trials.start(B)
        trials.observe(B, 0.5)
    assert _letters(by_lanes.next_challenger(RANKED, 1.00)) == "DHDH"  # B's lanes were tried: A is next
    tried = by_buffers.next_challenger(RANKED, 1.00)
    assert _letters(tried) == "DHDH"
    _turns(by_buffers, {"DHDH": [0.6], "HDHD": [0.5]})
    tried = by_buffers.next_challenger(RANKED, 1.00)
    assert (_letters(tried), tried.buffers) == ("HDHD", 1)  # B's lanes with 1 buffer: another key


@pytest.mark.parametrize(("kwargs", "key"), [({"window": -0.1}, "window"), ({"steps": 0}, "steps"),
                                             ({"min_gain": 1.0}, "min_gain"), ({"max_trials": -1}, "max_trials"),
                                             ({"steps": True}, "steps"), ({"interleave": 1}, "interleave")])
def test_bad_settings_name_their_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}:"):
        PlanTrials(**kwargs)


BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
RECORDS_J_27 = BENCHMARKS / "sweep_gpt-2.7b_H200_2026-11-21_runJ_updates.json"


def test_run_j_the_first_trial_would_have_moved_auto_to_the_plan_that_measured_fastest() -> None:
    """Run J, gpt-2.7b unlimited, 4 rounds, replayed: ``auto`` chose lanes that start the device lane at subgroup 0
    and measured 507.3 ms (median), 5.3% over plan 0.4's lanes (482.0 ms), which its model, after three update phases
    of its choice, predicts 3% faster: no re-plan (5% needed, and its predictions never drifted), but the first
    candidate tried. Fed the update phases the sweep measured for those lanes in the same process, the trial keeps
    them: 482.0 ms against 506.4 ms, the median of auto's three update phases before the trial."""
    data = json.loads(RECORDS_J_27.read_text())
    sizes = data["subgroup_sizes"]
    iterations = data["unlimited_4rounds"]["iterations"]
    auto = [record for it in iterations if it["plan"] == "auto" for record in it["records"]]
    plan_04 = [record for it in iterations if it["plan"] == "0.4" for record in it["records"]][1:]  # after warm-up
    from test_calibration_replay import _sized_measurement

    calibrator = Calibrator(CostParams())
    for record in auto[:2]:  # the probe
        calibrator.observe(_sized_measurement(record, sizes))
    every = frozenset(range(len(sizes)))
    chosen = rank_plans(sizes, calibrator.params, None, 2, every, host_orders=False)[0][0]
    assert _letters(chosen) == auto[2]["lanes"] and chosen.lanes[0] is Lane.DEVICE
    trials = PlanTrials(interleave=False)  # run J ran before the turns
    trials.start(chosen)
    for record in auto[2:5]:  # three update phases of the choice
        calibrator.observe(_sized_measurement(record, sizes))
        trials.observe(chosen, record["update_ms"] / 1e3)
    assert trials.ready() and not calibrator.should_replan(3)
    ranked = [(plan, p.makespan_s)
              for plan, p in rank_plans(sizes, calibrator.params, None, 2, every, host_orders=False)]
    predicted = dict((_letters(plan), s) for plan, s in reversed(ranked))
    challenger = trials.next_challenger(ranked, predicted[_letters(chosen)])
    assert _letters(challenger) == plan_04[0]["lanes"]
    assert 0.95 < predicted[_letters(challenger)] / predicted[_letters(chosen)] < 0.98
    for record in plan_04[:3]:
        trials.observe(challenger, record["update_ms"] / 1e3)
    (verdict,) = trials.verdicts
    assert verdict.challenger_won and _letters(trials.incumbent) == plan_04[0]["lanes"]
    assert round(verdict.challenger_s * 1e3, 1) == round(statistics.median(r["update_ms"] for r in plan_04[:3]), 1)
    assert (round(verdict.challenger_s * 1e3, 1), round(verdict.incumbent_s * 1e3, 1)) == (482.0, 506.4)


GIB = 2**30
#: Run K (commit f4d9e54): each trial's (challenger median ms, kept?) as the sweep ran them.
RUN_K_VERDICTS = {
    ("gpt-1b", "unlimited"): [(205.1, False), (190.8, True), (214.5, False)],
    ("gpt-1b", "quarter"): [(237.7, False)],
    ("gpt-2.7b", "unlimited"): [(513.3, False), (613.8, False), (504.8, False)],
    ("gpt-2.7b", "quarter"): [(475.6, True)],
}


@pytest.mark.parametrize(("model", "budget"), list(RUN_K_VERDICTS))
def test_run_k_every_choice_and_trial_of_auto_follows_from_its_measurements(model: str, budget: str) -> None:
    """Run K's sweeps on a GPU host, replayed: feeding auto's recorded update phases to a fresh calibrator and
    :class:`PlanTrials`, as the manager does, gives the plan it chose after the probe, every plan it then tried (each
    the lanes that ran next in the records) and every verdict. On gpt-2.7b at the quarter budget the trial decided the
    case: the chosen plan measured 604.7 ms, the tried one 475.6 ms."""
    from test_calibration_replay import _plan as record_plan
    from test_calibration_replay import _sized_measurement

    from lightning_dos.planning import grads_for, predict

    data = json.loads((BENCHMARKS / f"sweep_{model}_H200_2026-11-21_runK_updates.json").read_text())
    report = json.loads((BENCHMARKS / f"sweep_{model}_H200_2026-11-21_runK"
                                      f"{'' if budget == 'unlimited' else '_quarter'}.json").read_text())
    (gib,) = [b["budget"]["gib"] for b in report["budgets"] if b["budget"]["name"] == budget]
    limit = None if gib is None else gib * GIB
    sizes = data["subgroup_sizes"]
    every = frozenset(range(len(sizes)))
    auto = [record for it in data[budget]["iterations"] if it["plan"] == "auto" for record in it["records"]]
    # the rules of run K: trials in a row, candidates that do not fit the budget left out
    calibrator, trials, tried = Calibrator(CostParams()), PlanTrials(interleave=False), []
    for k, record in enumerate(auto):
        calibrator.observe(_sized_measurement(record, sizes))
        if k == 1:  # the probe's last update phase: the planner chooses
            chosen = rank_plans(sizes, calibrator.params, limit, 2, every, demote=False, host_orders=False)[0][0]
            assert _letters(chosen) == auto[2]["lanes"]
            trials.start(chosen)
        if k < 2:
            continue
        trials.observe(record_plan(record), record["update_ms"] / 1e3)
        if trials.ready():
            in_force = trials.incumbent
            predicted = predict(in_force, sizes, calibrator.params,
                                grads_for(in_force, sizes, calibrator.params, limit, every) or frozenset()).makespan_s
            ranked = [(plan, p.makespan_s) for plan, p in
                      rank_plans(sizes, calibrator.params, limit, 2, every, demote=False, host_orders=False)]
            challenger = trials.next_challenger(ranked, predicted)
            if challenger is not None:
                tried.append(_letters(challenger))
                assert [r["lanes"] for r in auto[k + 1:k + 4]] == [tried[-1]] * 3
                assert [r["source"] for r in auto[k + 1:k + 4]] == [TRIAL_SOURCE] * 3
    verdicts = [(round(v.challenger_s * 1e3, 1), v.challenger_won) for v in trials.verdicts]
    assert verdicts == RUN_K_VERDICTS[model, budget]
    assert len(tried) == len(trials.verdicts) and _letters(trials.incumbent) == auto[-1]["lanes"]
    assert sum(r["source"] == TRIAL_SOURCE for r in auto) == 3 * len(tried)
    if (model, budget) == ("gpt-2.7b", "quarter"):
        assert round(trials.verdicts[0].incumbent_s * 1e3, 1) == 604.7


def test_run_m_auto_would_weigh_the_demoted_stride_2_that_measured_fastest_at_the_quarter_budget() -> None:
    """Run M (commit ac2c256), gpt-1b at the quarter budget (2.84 GiB), replayed: after the probe ``auto`` chose the
    lanes it then ran (205.6 ms median); the sweep's fastest plan was stride:2, which does not fit the budget and ran
    demoted to fit (HDHDHDHDHDHDHDHDHHH, 202.9 ms), and which the planner of that commit never weighed. Weighed as
    dispatch runs it, it is predicted ahead of that choice (and so within reach of the trials)."""
    from test_calibration_replay import _sized_measurement

    from lightning_dos.planning.plan import stride_lanes

    data = json.loads((BENCHMARKS / "sweep_gpt-1b_H200_2026-11-21_runM_updates.json").read_text())
    report = json.loads((BENCHMARKS / "sweep_gpt-1b_H200_2026-11-21_runM_quarter.json").read_text())
    ((gib, rows),) = [(b["budget"]["gib"], b["plans"]) for b in report["budgets"]]
    sizes, limit = data["subgroup_sizes"], gib * GIB
    every = frozenset(range(len(sizes)))
    iterations = data["quarter"]["iterations"]
    auto = [record for it in iterations if it["plan"] == "auto" for record in it["records"]]
    stride_2 = [record for it in iterations if it["plan"] == "stride:2" for record in it["records"]]
    demoted = {r["lanes"] for r in stride_2}
    assert demoted == {"HDHDHDHDHDHDHDHDHHH"}
    assert "".join(lane.letter for lane in stride_lanes(len(sizes), 2)) == "HDHDHDHDHDHDHDHDHDH"  # 17 does not fit
    measured = {row["plan"]: row["update_ms"] for row in rows if row.get("update_ms") is not None}
    assert min(measured, key=measured.get) == "stride:2" and round(measured["stride:2"], 1) == 202.9

    calibrator = Calibrator(CostParams())
    for record in auto[:2]:  # the probe (its mixed update had its first prefetches issued at dispatch)
        calibrator.observe(replace(_sized_measurement(record, sizes), lead_s=record["dispatch_lead_ms"] / 1e3))
    before = rank_plans(sizes, calibrator.params, limit, 2, every, demote=False, host_orders=False)
    assert _letters(before[0][0]) == auto[2]["lanes"]  # what ran
    assert "HDHDHDHDHDHDHDHDHHH" not in {_letters(plan) for plan, _ in before}
    now = {(_letters(plan), plan.buffers): prediction.makespan_s
           for plan, prediction in rank_plans(sizes, calibrator.params, limit, 2, every, host_orders=False)}
    # predicted 199.6 ms against the 199.7 of what ran: weighed now, and within the trials' window of the choice
    assert round(now["HDHDHDHDHDHDHDHDHHH", 2] * 1e3, 1) == 199.6 and round(before[0][1].makespan_s * 1e3, 1) == 199.7
    assert now["HDHDHDHDHDHDHDHDHHH", 2] < before[0][1].makespan_s
    # the planner's first choice is now another demoted plan, predicted 198.4 ms (not measured in run M)
    first = min(now, key=now.get)
    assert first[0] not in {_letters(plan) for plan, _ in before} and round(now[first] * 1e3, 1) == 198.4


@pytest.mark.parametrize(
    ("challenger", "incumbent", "turns", "won"),
    [
        ([0.45, 0.48], [0.50, 0.50], 2, True),  # 0.90, 0.96: both below 0.98, a clear win
        ([0.50, 0.55], [0.50, 0.50], 2, False),  # 1.00, 1.10: neither faster at all, a clear loss
        ([0.45, 0.50, 0.45], [0.50, 0.50, 0.50], 3, True),  # 0.90 then 1.00: a third pair decides, median 0.90
        ([0.49, 0.45, 0.51], [0.50, 0.50, 0.50], 3, False),  # 0.98 is no win, 0.90 is: mixed; median 0.98 loses
    ],
)
def test_with_turns_a_trial_whose_pairs_all_agree_ends_after_two_turns_each(
        challenger: list[float], incumbent: list[float], turns: int, won: bool) -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3)
    assert trials.early_steps == 2
    trials.start(A)
    trials.next_challenger(RANKED, 1.00)
    ran = _turns(trials, {"HDHD": list(challenger), "DHDH": list(incumbent)})
    assert ran == ["HDHD", "DHDH"] * turns
    (verdict,) = trials.verdicts
    pairs = [c / i for c, i in zip(challenger, incumbent)]
    assert verdict.ratio == pytest.approx(statistics.median(pairs)) and verdict.challenger_won is won
    assert verdict.challenger_s == statistics.median(challenger) and verdict.incumbent_s == statistics.median(incumbent)


def test_early_steps_at_steps_or_more_runs_trials_to_their_full_turns_and_a_starved_trial_is_still_given_up() -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3, early_steps=3)
    trials.start(A)
    trials.next_challenger(RANKED, 1.00)
    assert _turns(trials, {"HDHD": [0.40] * 3, "DHDH": [0.50] * 3}) == ["HDHD", "DHDH"] * 3
    assert trials.verdicts[-1].challenger_won
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3)
    trials.start(A)
    trials.next_challenger(RANKED, 1.00)
    trials.observe(B, 0.40)
    trials.observe(A, 0.50)  # one pair, a win: fewer than two pairs decide nothing
    assert trials.running
    verdicts = _run(trials, D, *[0.1] * 10)  # demoted since: given up at the trial's 12th update phase
    assert verdicts[:-1] == [None] * 9 and verdicts[-1].challenger_s == math.inf and not verdicts[-1].challenger_won
    with pytest.raises(ValueError, match="early_steps"):
        PlanTrials(early_steps=0)
