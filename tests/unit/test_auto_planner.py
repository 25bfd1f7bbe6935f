"""``auto``'s state machine (lightning_dos.planning.auto) through its public interface, with a scripted model: when
it probes, chooses, re-plans and tries plans, and what it tells the manager to do. No torch, no DeepSpeed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace

from lightning_dos.planning.auto import PROBE_STEPS, REPLAN_PATIENCE, AutoDecision, AutoPlanner
from lightning_dos.planning.calibration import probe_plans
from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.planning.trials import TRIAL_SOURCE

SIZES = [1000] * 6


def _plan(letters: str, buffers: int = 2) -> Plan:
    return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in letters), buffers=buffers, source="auto")


def _letters(plan: Plan) -> str:
    return "".join(lane.letter for lane in plan.lanes)


class Scripted:
    """A performance model whose answers the test sets (a :class:`~lightning_dos.planning.auto.PlanModel`)."""

    def __init__(self, predicted: dict[str, float], choices: Iterable[str], drifting: bool = False,
                 kept: Callable[[Plan], frozenset[int]] | None = None) -> None:
        self.predicted = predicted
        self.choices = iter(choices)
        self.drifting = drifting
        self.kept = kept or (lambda plan: frozenset(plan.device_subgroups()))
        self.drift_checks = 0

    def best_plan(self) -> Plan:
        return _plan(next(self.choices))

    def ranked(self) -> list[tuple[Plan, float]]:
        return [(_plan(x), s) for x, s in sorted(self.predicted.items(), key=lambda kv: kv[1])]

    def predict(self, plan: Plan) -> float:
        return self.predicted[_letters(plan)]

    def kept_grads(self, plan: Plan) -> frozenset[int]:
        return self.kept(plan)

    def fit_slots(self, plan: Plan) -> Plan:
        return plan

    def drifted(self, patience: int) -> bool:
        assert patience == REPLAN_PATIENCE
        self.drift_checks += 1
        return self.drifting


class Run:
    """Update phases of the plan in force, as the manager records them: each takes ``measured(plan)`` seconds, and
    a decision's plan is in force from the next one."""

    def __init__(self, auto: AutoPlanner, measured: Callable[[Plan], float] = lambda plan: 1.0) -> None:
        self.auto = auto
        self.measured = measured
        self.in_force = auto.probes[0]
        self.ran: list[Plan] = []
        self.decisions: list[AutoDecision] = []

    def step(self, n: int = 1) -> list[AutoDecision]:
        out = []
        for _ in range(n):
            plan = self.in_force
            decision = self.auto.record(len(self.ran), plan, self.measured(plan), in_force=plan)
            self.ran.append(plan)
            self.decisions.append(decision)
            out.append(decision)
            if decision.plan is not None:
                self.in_force = decision.plan
        return out


def test_auto_replans_after_fresh_drift_only_and_for_a_real_gain() -> None:
    model = Scripted({"DHDHDH": 1.00, "HDHDHD": 0.97, "DDHHDD": 0.90},  # 3% better: churn; 10% better: a real gain
                     choices=["DHDHDH", "HDHDHD", "DDHHDD"], drifting=True)  # every step drifts
    auto = AutoPlanner(SIZES, 2, lambda: model)
    auto.trials.max_trials = 0  # the drift check alone (a running trial makes it wait)
    run = Run(auto)

    # the probe: the host lane alone, then half the subgroups on each lane
    probe = run.step(PROBE_STEPS)
    assert [_letters(p) for p in run.ran] == ["HHHHHH", "HDHDHD"] and run.ran[0].source == "probe"
    assert probe[0].plan == auto.probes[1] and not probe[0].replanned  # the probe's steps are not re-plans ...
    assert _letters(probe[1].plan) == "DHDHDH" and probe[1].replanned  # ... choosing after it is
    assert probe[1].notes == (f"re-planned at update 1: {probe[1].plan}",)
    assert not auto.probing and auto.steps == PROBE_STEPS and model.drift_checks == 0

    replanned = [d.replanned for d in run.step(7)]
    # 1-2 after the choice: too few fresh steps; 3: weighed, 3% is no gain, kept;
    # 4-5: too few fresh steps since that check; 6: weighed again, 10% better, adopted; 7: too few fresh steps
    assert replanned == [False, False, False, False, False, True, False]
    assert [d.plan is None for d in run.decisions[PROBE_STEPS:]] == [True] * 5 + [False, True]
    assert model.drift_checks == 2  # asked only once REPLAN_PATIENCE fresh steps were in
    assert _letters(run.in_force) == "DDHHDD"


def test_auto_tries_the_plans_its_model_ranks_close_and_keeps_the_faster() -> None:
    """After the probe and one update phase of its choice, ``auto`` tries the next candidate within 5% of it: the
    two take turns (three update phases each, two when every pair agrees), and the candidate is kept if it measured
    faster; then the next one at once; a slower one gives the plan back."""
    model = Scripted({"DHDHDH": 1.00, "HDHDHD": 0.99, "DDHHDD": 1.03, "HHDDHH": 1.20}, choices=["DHDHDH"])
    measured = {"HHHHHH": 0.9, "HDHDHD": 0.40, "DHDHDH": 0.50, "DDHHDD": 0.45}  # the probe's mixed plan is HDHDHD
    auto = AutoPlanner(SIZES, 2, lambda: model)
    run = Run(auto, lambda plan: measured[_letters(plan)])
    run.step(19)
    # every pair of turns agrees (0.40 against 0.50: each a win; 0.45 against 0.40: none), so each trial ends after
    # two turns of each side
    assert [_letters(p) for p in run.ran] == (["HHHHHH", "HDHDHD", "DHDHDH"] + ["HDHDHD", "DHDHDH"] * 2
                                              + ["DDHHDD", "HDHDHD"] * 2 + ["HDHDHD"] * 8)
    # the probe's choice, then the first trial's win; the second trial (0.45 s against 0.40) lost: no change
    assert [k for k, d in enumerate(run.decisions) if d.replanned] == [1, 6]
    assert [p.source == TRIAL_SOURCE for p in run.ran] == [False] * 3 + [True, False] * 4 + [False] * 8
    # HHDDHH is predicted 20% slower: never tried; the winner is the plan in force
    assert [v.challenger_won for v in auto.trials.verdicts] == [True, False]
    assert _letters(run.in_force) == "HDHDHD" and run.in_force.source == "auto"
    assert run.decisions[2].notes == (f"trying for 3 updates from update 3: {run.decisions[2].plan} (predicted 990.0 "
                                      "ms, plan in force 1000.0 ms)",)
    assert run.decisions[6].notes[0].startswith("trial ended at update 6: 400.0 ms against 500.0 ms (paired ratio "
                                                "0.800), the tried plan in force: ")
    assert all(not d.notes for d in run.decisions[11:])  # no candidate left: nothing more to try or log


def test_trials_tell_plans_apart_by_lanes_order_and_where_the_device_lane_keeps_its_gradients() -> None:
    kept = {1: frozenset({1, 3, 5}), 2: frozenset()}  # under a budget the same lanes may run either way
    auto = AutoPlanner(SIZES, 2, lambda: Scripted({}, choices=[], kept=lambda plan: kept[plan.buffers]))
    one, two = _plan("HDHDHD", buffers=1), _plan("HDHDHD", buffers=2)
    assert auto.trials.key(one) != auto.trials.key(two)
    assert auto.trials.key(two) == auto.trials.key(replace(two, source=TRIAL_SOURCE))
    assert auto.trials.key(two) == auto.trials.key(replace(two, host_order=(4, 2, 0)))  # the model orders the host


def test_new_sizes_during_the_probe_remake_its_plans() -> None:
    """Residents taken at the first dispatch: the probe goes on where it was, with plans for the lanes' subgroups."""
    auto = AutoPlanner(SIZES, 2, lambda: Scripted({}, choices=[]))  # the planner is not asked
    Run(auto).step()
    sizes = [0, 0] + SIZES[2:]
    assert auto.resize(sizes) == probe_plans(sizes, buffers=2)[1] and auto.probes == probe_plans(sizes, buffers=2)
    assert auto.probing and auto.steps == 1


def test_new_sizes_after_the_probe_put_the_planners_choice_in_force_and_start_over() -> None:
    """After the probe the planner chooses again for the new sizes; a trial under way is dropped, and the drift check
    waits for REPLAN_PATIENCE update phases measured since."""
    model = Scripted({"DHDHDH": 1.00, "DDHHDD": 1.01, "HHDDHH": 1.20}, choices=["DHDHDH", "HHDDHH", "HHDDHH"],
                     drifting=True)
    auto = AutoPlanner(SIZES, 2, lambda: model)
    run = Run(auto)
    run.step(PROBE_STEPS + 1)
    assert auto.trials.running and _letters(run.in_force) == "DDHHDD"  # a trial of the candidate within 5%
    chosen = auto.resize(SIZES)
    assert _letters(chosen) == "HHDDHH" and auto.trials.incumbent is chosen and not auto.trials.running
    run.in_force = chosen
    auto.trials.max_trials = 0  # from here the drift check alone
    run.step(REPLAN_PATIENCE - 1)
    assert model.drift_checks == 0  # without the new choice the check was due at the second of these
    run.step()
    assert model.drift_checks == 1


def test_its_state_round_trips_through_json_and_drops_a_trial_under_way() -> None:
    model = Scripted({"DDHHHH": 1.00, "DDDHHH": 1.02}, choices=["DDHHHH"])
    auto = AutoPlanner(SIZES, 2, lambda: model)
    run = Run(auto)
    run.step(PROBE_STEPS + 1)
    assert auto.trials.running and _letters(run.in_force) == "DDDHHH"
    state = json.loads(json.dumps(auto.state_dict()))  # what a checkpoint holds survives JSON

    resumed = AutoPlanner(SIZES, 2, lambda: model)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state and resumed.steps == PROBE_STEPS + 1 and not resumed.probing
    assert not resumed.trials.running and _letters(resumed.trials.incumbent) == "DDHHHH"  # the plan in force runs
    decision = resumed.record(3, resumed.trials.incumbent, 1.0, in_force=resumed.trials.incumbent)
    assert resumed.steps == PROBE_STEPS + 2  # auto's next update phase, not a new probe: the dropped trial starts again
    assert _letters(decision.plan) == "DDDHHH" and resumed.trials.state_dict()["trials"] == 2
