"""``auto``'s plan trials (lightning_dos.planning.trials), with exact numbers."""

from __future__ import annotations

import math
import statistics

import pytest

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


def test_trials_end_when_no_candidate_is_left_or_the_limit_is_reached_and_start_over_with_the_planner() -> None:
    trials = PlanTrials(window=0.0, steps=1, min_gain=0.0, max_trials=1)
    trials.start(A)
    assert trials.next_challenger(RANKED, 0.97) is None  # nothing within 0 % of 0.97 s: no trial until a new choice
    assert not trials.ready()
    trials.start(A)  # the planner chose again
    assert _letters(trials.next_challenger(RANKED, 1.00)) == "HDHD"
    _turns(trials, {"HDHD": [0.6], "DHDH": [0.5]})
    assert not trials.verdicts[-1].challenger_won
    assert not trials.ready()  # max_trials = 1 after this choice of the planner


def test_with_turns_the_tried_plan_and_the_plan_in_force_alternate_and_their_turns_are_compared() -> None:
    trials = PlanTrials(window=0.05, steps=3, min_gain=0.02, max_trials=3)
    assert not trials.ready()  # no plan in force yet
    trials.start(A)
    assert trials.next_plan() is A
    assert trials.ready()  # with turns the first trial may start at once: its turns measure the plan in force
    _run(trials, A, 0.40, 0.40, 0.40)  # the choice's own update phases: fast, but not part of any trial
    challenger = trials.next_challenger(RANKED, 1.00)
    assert _letters(challenger) == "HDHD" and challenger.source == TRIAL_SOURCE and trials.running
    assert not trials.ready() and trials.next_challenger(RANKED, 1.00) is None  # one trial at a time
    ran = _turns(trials, {"HDHD": [0.49, 0.70, 0.50], "DHDH": [0.52, 0.60, 0.53]})
    assert ran == ["HDHD", "DHDH"] * 3  # the candidate first, then turns
    (verdict,) = trials.verdicts
    assert (verdict.challenger_s, verdict.incumbent_s) == (0.50, 0.53)  # the trial's own turns, not the 0.40s
    # each turn over the plan in force's turn next to it: 0.49/0.52, 0.70/0.60, 0.50/0.53 -> median 0.50/0.53
    assert verdict.ratio == pytest.approx(0.50 / 0.53) and verdict.ratio < 0.98
    assert verdict.challenger_won and _letters(trials.incumbent) == "HDHD" and trials.incumbent.source == "auto"
    # the next trial starts at once: the plan in force was measured in the trial; C (1.04) is within 5% of 1.00
    assert trials.ready() and _letters(trials.next_challenger(RANKED, 1.00)) == "DDHH"
    _turns(trials, {"DDHH": [0.60, 0.61, 0.62], "HDHD": [0.50, 0.50, 0.50]})
    assert not trials.verdicts[-1].challenger_won and _letters(trials.incumbent) == "HDHD"
    assert trials.next_plan() is trials.incumbent
    assert trials.ready()  # a lost trial needs no fresh update phases either: the next may start at once
    assert trials.next_challenger(RANKED, 1.00) is None  # D (1.06) is outside the window: no candidate left
    assert not trials.ready()


def test_with_turns_a_slow_spell_does_not_decide_the_trial() -> None:
    """The host's slow spells last a few iterations and slow every plan alike. The plan in force takes 1.00 s, the
    candidate 0.95 s, and a spell makes three update phases in a row 20% slower: two of the candidate's three phases
    fall in the spell and its median is slower than the plan in force's (1.14 against 1.00), but each phase compared
    with the one next to it wins."""
    def spell(k: int, seconds: float) -> float:
        return seconds * (1.2 if 3 <= k < 6 else 1.0)

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
                                             ({"steps": True}, "steps")])
def test_bad_settings_name_their_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}:"):
        PlanTrials(**kwargs)


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
