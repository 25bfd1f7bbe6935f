"""The manager's ``auto`` policy on its own (no DeepSpeed): when it re-plans, and what it may choose."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from lightning_dos.planning import planner
from lightning_dos.planning.plan import Lane, Plan, parse_plan
from lightning_dos.update import manager as manager_module
from lightning_dos.update.executor import LaneTimings
from lightning_dos.update.manager import GIB, OptimizerStateManager, StepRecord


class FakeOptimizer:
    """What the manager reads from the seam: subgroup sizes and whether the interleaved update applies."""

    device_grad_subgroups: frozenset[int] = frozenset()

    def subgroup_sizes(self) -> list[int]:
        return [1000] * 6

    def device_grad_bytes_per_param(self) -> int:
        return 2

    def _dos_supported(self) -> bool:
        return True


def _plan(letters: str, buffers: int = 2) -> Plan:
    return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in letters), buffers=buffers, source="auto")


def _step(manager: OptimizerStateManager) -> StepRecord:
    record = StepRecord(step=len(manager.records), plan=manager.base_plan, timings=LaneTimings(), free_bytes=None,
                        demoted=(), device_fraction=0.0, predicted_s=1.0)
    manager.records.append(record)
    manager._calibrate(record)
    return record


def test_auto_replans_after_fresh_drift_only_and_for_a_real_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert manager.base_plan.source == "probe" and manager.optimizer.device_grad_subgroups == frozenset()
    candidates = iter([_plan("DHDHDH"), _plan("HDHDHD"), _plan("DDHHDD")])
    predicted = {"DHDHDH": 1.00, "HDHDHD": 0.97, "DDHHDD": 0.90}  # 3% better: churn; 10% better: a real gain
    manager.trials.max_trials = 0  # the drift check alone (a running trial makes it wait)
    monkeypatch.setattr(manager, "_resolve", lambda spec: next(candidates))
    monkeypatch.setattr(manager, "_predict", lambda plan: predicted["".join(lane.letter for lane in plan.lanes)])
    monkeypatch.setattr(manager.calibrator, "observe", lambda measurement: None)
    monkeypatch.setattr(manager.calibrator, "should_replan", lambda patience: True)  # every step drifts

    # the probe: the host lane alone, then half the subgroups on each lane (their gradients stay on the device)
    probe = [_step(manager)]
    assert manager.optimizer.device_grad_subgroups == frozenset({1, 3, 5})  # decided before the next backward
    probe += [_step(manager) for _ in range(manager_module.PROBE_STEPS - 1)]
    assert ["".join(lane.letter for lane in r.plan.lanes) for r in probe] == ["HHHHHH", "HDHDHD"]
    assert [r.replanned for r in probe] == [False, True]  # the probe's steps are not re-plans; choosing after is
    replanned = [_step(manager).replanned for _ in range(7)]
    # 1-2 after the choice: too few fresh steps; 3: weighed, 3% is no gain, kept;
    # 4-5: too few fresh steps since that check; 6: weighed again, 10% better, adopted; 7: too few fresh steps
    assert replanned == [False, False, False, False, False, True, False]
    assert "".join(lane.letter for lane in manager.base_plan.lanes) == "DDHHDD"


def test_kept_gradients_are_budgeted_in_the_optimizers_gradient_dtype() -> None:
    """The bytes a kept gradient takes come from the optimizer (2: bf16); an override still wins. With 6 subgroups
    of 1000 and a 40,000-byte budget, HDHDHD at 2 slots needs 32,000 B of slots plus 3,000 kept parameters:
    6,000 B in 16 bits fits (gradients kept), 12,000 B in fp32 does not (gradients to the host)."""
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"))
    fp32 = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"),
                                 cost_overrides={"device_grad_bytes_per_param": 4})
    assert (manager.cost.device_grad_bytes_per_param, fp32.cost.device_grad_bytes_per_param) == (2, 4)
    plan = _plan("HDHDHD")
    # the rule the manager applies on a GPU (on the host standing in, no budget applies)
    kept = [planner.grads_for(plan, m.sizes, m.cost, 40_000, m._all_grads()) for m in (manager, fp32)]
    assert kept == [frozenset({1, 3, 5}), frozenset()]


class _UnevenOptimizer(FakeOptimizer):
    def subgroup_sizes(self) -> list[int]:
        return [3000, 1000, 1000, 1000, 1000, 1000]


def test_a_named_plan_that_runs_demoted_keeps_the_gradients_it_still_runs_on_the_device() -> None:
    """``device`` within 50,000 bytes: its 2 slots for the 3000-parameter subgroup (96,000 B) do not fit, dispatch
    demotes subgroup 0, and the other five keep their bf16 gradients (32,000 B of slots + 10,000 B). Decided before
    the backward from the plan as dispatch will run it (up to b73d0c1: none kept, every gradient to the host)."""
    manager = OptimizerStateManager(_UnevenOptimizer(), plan=parse_plan("device"), memory_budget_gib=50_000 / GIB)
    manager.device = torch.device("cuda")  # the budget applies on a GPU only; nothing here touches one
    assert manager._kept_grads(manager.base_plan) == frozenset({1, 2, 3, 4, 5})
    manager._plan_gradients()
    assert manager.optimizer.device_grad_subgroups == frozenset({1, 2, 3, 4, 5})


def test_auto_considers_two_buffers_at_most_unless_buffers_is_set() -> None:
    auto = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert max(plan.buffers for plan in _candidates(auto)) == manager_module.AUTO_MAX_BUFFERS == 2
    deep = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"), buffers=4)
    assert max(plan.buffers for plan in _candidates(deep)) == 4


def _candidates(manager: OptimizerStateManager) -> list[Plan]:
    """Every plan the planner weighed for ``auto``."""
    seen: list[Plan] = []
    original = planner.candidate_plans

    def spy(sizes: list[int], max_buffers: int = 4) -> Iterator[Plan]:
        plans = list(original(sizes, max_buffers))
        seen.extend(plans)
        return iter(plans)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "candidate_plans", spy)
        manager._resolve(manager.spec)
    return seen


def _letters(plan: Plan) -> str:
    return "".join(lane.letter for lane in plan.lanes)


def _timed_step(manager: OptimizerStateManager) -> StepRecord:
    """One measured update phase (0.5 s, half the parameters on the host lane) of the plan in force."""
    record = StepRecord(step=len(manager.records), plan=manager.base_plan,
                        timings=LaneTimings(total_s=0.5, host_params=3000, host_compute_s=0.5), free_bytes=None,
                        demoted=(), device_fraction=0.5, predicted_s=0.2)
    manager.records.append(record)
    manager._calibrate(record)
    return record


def test_start_auto_begins_cold_after_fixed_plans() -> None:
    """A fixed-plan run switched to ``auto`` (the plan sweep does this) starts as a new ``auto`` run would: the
    starting cost values (user overrides kept), the two probe steps, then the planner's choice."""
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"),
                                    cost_overrides={"gpu_adam_params_per_s": 7e9})
    start = manager.cost
    for _ in range(3):  # fixed plans: nothing is re-planned, and calibration moves the rates
        assert not _timed_step(manager).replanned
    assert manager.cost.cpu_adam_params_per_s != start.cpu_adam_params_per_s
    assert manager.calibrator.history

    fixed = manager.planning_state()
    manager.start_auto()
    assert manager.spec.kind == "auto" and manager.cost == start and not manager.calibrator.history
    assert manager.cost.gpu_adam_params_per_s == 7e9
    assert _letters(manager.base_plan) == "HHHHHH" and manager.optimizer.device_grad_subgroups == frozenset()
    probe = [_timed_step(manager)]
    assert _letters(manager.base_plan) == "HDHDHD" and manager.optimizer.device_grad_subgroups == {1, 3, 5}

    # a fixed-plan step between two of auto's (the plan sweep interleaves them): it neither advances auto's probe nor
    # feeds auto's calibration, and auto goes on where it was
    auto = manager.planning_state()
    manager.restore(fixed)
    assert manager.spec.kind == "fraction" and _letters(manager.base_plan) == _letters(fixed.base_plan)
    assert manager.optimizer.device_grad_subgroups == {i for i, c in enumerate(_letters(fixed.base_plan)) if c == "D"}
    between = _timed_step(manager)
    assert not between.replanned and len(fixed.calibrator.history) == 4 and len(auto.calibrator.history) == 1
    manager.restore(auto)
    probe.append(_timed_step(manager))
    assert [_letters(r.plan) for r in probe] == ["HHHHHH", "HDHDHD"]
    assert [r.replanned for r in probe] == [False, True]  # counted under auto, not from the run's first step
    assert manager.base_plan.source not in ("probe", "0.5") and len(manager.records) == 6
    assert len(manager.calibrator.history) == 2


def test_auto_tries_the_plans_its_model_ranks_close_and_keeps_the_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the probe and one update phase of its choice, ``auto`` tries the next candidate within 5% of it: the
    two take turns (three update phases each, two when every pair agrees), and the candidate is kept if it measured
    faster; then the next one at once; a slower one gives the plan back."""
    from lightning_dos.planning.trials import TRIAL_SOURCE

    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    predicted = {"DHDHDH": 1.00, "HDHDHD": 0.99, "DDHHDD": 1.03, "HHDDHH": 1.20}
    measured = {"HHHHHH": 0.9, "HDHDHD": 0.40, "DHDHDH": 0.50, "DDHHDD": 0.45}  # the probe's mixed plan is HDHDHD
    monkeypatch.setattr(manager, "_resolve", lambda spec: _plan("DHDHDH"))
    monkeypatch.setattr(manager, "_ranked", lambda: [(_plan(x), s) for x, s in sorted(predicted.items(),
                                                                                      key=lambda kv: kv[1])])
    monkeypatch.setattr(manager, "_predict", lambda plan: predicted[_letters(plan)])
    monkeypatch.setattr(manager.calibrator, "observe", lambda measurement: None)
    monkeypatch.setattr(manager.calibrator, "should_replan", lambda patience: False)

    def step() -> StepRecord:
        record = StepRecord(step=len(manager.records), plan=manager.base_plan,
                            timings=LaneTimings(total_s=measured[_letters(manager.base_plan)]), free_bytes=None,
                            demoted=(), device_fraction=0.5, predicted_s=1.0)
        manager.records.append(record)
        manager._calibrate(record)
        return record

    records = [step() for _ in range(19)]
    ran = [_letters(r.plan) for r in records]
    # every pair of turns agrees (0.40 against 0.50: each a win; 0.45 against 0.40: none), so each trial ends after
    # two turns of each side
    assert ran == (["HHHHHH", "HDHDHD", "DHDHDH"] + ["HDHDHD", "DHDHDH"] * 2 + ["DDHHDD", "HDHDHD"] * 2
                   + ["HDHDHD"] * 8)
    # the probe's choice, then the first trial's win; the second trial (0.45 s against 0.40) lost: no change
    assert [r.step for r in records if r.replanned] == [1, 6]
    assert [r.plan.source == TRIAL_SOURCE for r in records] == [False] * 3 + [True, False] * 4 + [False] * 8
    assert manager.metrics()["dos/trial"] == 0.0
    # HHDDHH is predicted 20% slower: never tried; the winner is the plan in force, its gradients planned
    assert [v.challenger_won for v in manager.trials.verdicts] == [True, False]
    assert _letters(manager.base_plan) == "HDHDHD" and manager.base_plan.source == "auto"
    assert manager.optimizer.device_grad_subgroups == {1, 3, 5}
    # the plan sweep swaps auto's state out and back: the trials go with it, and a cold start begins afresh
    state = manager.planning_state()
    # the trials tell plans apart by their lanes and by where the device lane's gradients live
    kept = {1: frozenset({1, 3, 5}), 2: frozenset()}
    monkeypatch.setattr(manager, "_kept_grads", lambda plan: kept[plan.buffers])
    one, two = _plan("HDHDHD", buffers=1), _plan("HDHDHD", buffers=2)
    assert manager.trials.key(one) != manager.trials.key(two) and manager.trials.key(two) == manager.trials.key(
        replace(two, source="trial"))
    assert state.trials is manager.trials
    manager.start_auto()
    assert manager.trials is not state.trials and manager.trials.incumbent is None


def test_plan_state_round_trips_through_json_and_continues_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's plan state (``state_dict``) puts a new manager where the old one stood: the plan in force, the
    calibration, auto's progress; a trial under way is dropped for the plan in force; another run's state is refused."""
    import json

    from lightning_dos.planning.calibration import StepMeasurement

    old = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    for _ in range(manager_module.PROBE_STEPS):
        _step(old)
    old.calibrator.observe(StepMeasurement(host_params=6000, host_busy_s=1e-3, host_overlapped=False, device_params=0,
                                           h2d_bytes=0, h2d_busy_s=0.0, d2h_bytes=0, d2h_busy_s=0.0, adam_busy_s=0.0,
                                           predicted_s=1.0, measured_s=1.3))
    old.set_plan(_plan("DDHHHH"))
    old.trials.start(_plan("DDHHHH"))
    old.trials._trials = 1
    old.trials.challenger = _plan("DDDHHH")  # a trial under way when the checkpoint is saved
    state = json.loads(json.dumps(old.state_dict()))  # what a checkpoint holds survives JSON

    new = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert new.base_plan.source == "probe"
    assert new.load_state_dict(state)
    assert new.base_plan.lanes == _plan("DDHHHH").lanes  # the plan in force, not the trial's candidate
    assert not new.trials.running and new.trials._trials == 1
    assert new._auto_steps == old._auto_steps == manager_module.PROBE_STEPS
    assert new.cost == old.cost and new.calibrator.history == old.calibrator.history
    assert new.calibrator.observations == old.calibrator.observations
    assert new.optimizer.device_grad_subgroups == frozenset({0, 1})  # the restored plan keeps its gradients
    # the next update phase is auto's next one, not a new probe
    monkeypatch.setattr(new.calibrator, "observe", lambda measurement: None)
    _step(new)
    assert new._auto_steps == manager_module.PROBE_STEPS + 1

    for other in (OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5")),  # another plan asked for
                  OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))):
        if other.spec.kind == "auto":
            state = dict(state, sizes=[500] * 12)  # other subgroups (a changed sub_group_size)
        before = other.base_plan
        assert not other.load_state_dict(state)
        assert other.base_plan == before
