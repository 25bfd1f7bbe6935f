"""The manager on its own (no DeepSpeed): the gradients it keeps on the device, what ``auto`` may choose from, and its
planning state, swapped, saved and restored. Update phases run through the seam's hook on subgroups in host memory
(the host stands in for the device); ``auto``'s own rules are tested in tests/unit/test_auto_planner.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lightning_dos.planning import planner
from lightning_dos.planning.auto import AUTO_MAX_BUFFERS, PROBE_STEPS, AutoPlanner
from lightning_dos.planning.placement import Home
from lightning_dos.planning.plan import Lane, Plan, parse_plan
from lightning_dos.update.manager import GIB, OptimizerStateManager, PlanningState, StepRecord
from lightning_dos.update.subgroup import AdamHyper, Subgroup


class FakeOptimizer:
    """What the manager reads from the seam: subgroup sizes, whether the interleaved update applies, and the
    subgroups of an update phase (their gradients in host memory)."""

    runner: Any = None  # the manager attaches itself here

    def attach(self, runner: Any) -> None:
        self.runner = runner

    @property
    def device_grad_subgroups(self) -> frozenset[int]:
        return self.runner.device_grad_subgroups

    def __init__(self, sizes: tuple[int, ...] = (1000,) * 6) -> None:
        self.sizes = list(sizes)
        g = torch.Generator().manual_seed(0)
        hyper = AdamHyper(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, adamw=True)
        self._subgroups = [Subgroup(index=i, numel=n, master=torch.randn(n, generator=g), exp_avg=torch.zeros(n),
                                    exp_avg_sq=torch.zeros(n), state={"step": 0}, grad=torch.randn(n, generator=g),
                                    param16=torch.zeros(n), hyper=hyper) for i, n in enumerate(self.sizes)]

    def subgroup_sizes(self) -> list[int]:
        return list(self.sizes)

    def device_grad_bytes_per_param(self) -> int:
        return 2

    def host_grad_bytes_per_param(self) -> int:
        return 4  # its host gradients are fp32

    def interleaved_supported(self) -> bool:
        return True

    placed = False  # no prefetch at dispatch

    def ensure_placed(self) -> None:
        """Its subgroups are in host memory from the start."""

    def host_gradient_bytes(self) -> int:
        return 0

    def home_bytes(self) -> dict[Home, int]:
        return {Home.DEVICE: 0, Home.HOST: 16 * sum(self.sizes)}

    def subgroups(self) -> list[Subgroup]:
        return self._subgroups

    def step(self) -> None:
        """The optimizer's step as the seam runs it: the manager's update phase, with a host lane that takes 1 ms
        per subgroup (its rate is then measured, whatever the machine)."""
        self.runner.run_update_phase(self, lambda i: time.sleep(1e-3), 1.0)


def _plan(letters: str, buffers: int = 2, source: str = "auto") -> Plan:
    return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in letters), buffers=buffers, source=source)


def _letters(plan: Plan) -> str:
    return "".join(lane.letter for lane in plan.lanes)


def _step(manager: OptimizerStateManager) -> StepRecord:
    """One update phase of the plan in force, as an optimizer step runs it; its record."""
    manager.optimizer.step()
    return manager.records[-1]


def test_kept_gradients_are_budgeted_in_the_optimizers_gradient_dtype() -> None:
    """The bytes a kept gradient takes come from the optimizer (2: bf16); an override still wins. With 6 subgroups
    of 1000 and a 40,000-byte budget, HDHDHD at 2 slots needs 32,000 B of slots plus 3,000 kept parameters:
    6,000 B in 16 bits fits (gradients kept), 12,000 B in fp32 does not (gradients to the host)."""
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"))
    fp32 = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"),
                                 cost_overrides={"device_grad_bytes_per_param": 4})
    assert (manager.cost.device_grad_bytes_per_param, fp32.cost.device_grad_bytes_per_param) == (2, 4)
    assert manager.cost.grad_bytes_per_param == 4  # the host gradients' dtype, from the optimizer too
    plan = _plan("HDHDHD")
    # the rule the manager applies on a GPU (on the host standing in, no budget applies)
    kept = [planner.grads_for(plan, m.sizes, m.cost, 40_000, m.plan_model.may_keep) for m in (manager, fp32)]
    assert kept == [frozenset({1, 3, 5}), frozenset()]


class _UnevenOptimizer(FakeOptimizer):
    def __init__(self) -> None:
        super().__init__((3000, 1000, 1000, 1000, 1000, 1000))


def test_a_named_plan_that_runs_demoted_keeps_the_gradients_it_still_runs_on_the_device() -> None:
    """``device`` within 50,000 bytes: its 2 slots for the 3000-parameter subgroup (96,000 B) do not fit, dispatch
    demotes subgroup 0, and the other five keep their bf16 gradients (32,000 B of slots + 10,000 B). Decided before
    the backward from the plan as dispatch will run it (up to b73d0c1: none kept, every gradient to the host)."""
    manager = OptimizerStateManager(_UnevenOptimizer(), plan=parse_plan("device"), memory_budget_gib=50_000 / GIB)
    manager.device = torch.device("cuda")  # the budget applies on a GPU only; nothing here touches one
    assert manager.plan_model.kept_grads(manager.plans.in_force) == frozenset({1, 2, 3, 4, 5})
    manager.set_plan(manager.plans.in_force)  # the gradients are planned again for the plan in force
    assert manager.optimizer.device_grad_subgroups == frozenset({1, 2, 3, 4, 5})


def test_auto_considers_two_buffers_at_most_unless_buffers_is_set() -> None:
    auto = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert max(plan.buffers for plan in _candidates(auto)) == AUTO_MAX_BUFFERS == 2
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
        manager.plan_model.best_plan()
    return seen


def test_the_probe_puts_its_plans_in_force_with_their_gradients_and_the_choice_is_a_replan() -> None:
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert manager.plans.in_force.source == "probe" and manager.optimizer.device_grad_subgroups == frozenset()
    probe = [_step(manager)]
    assert manager.optimizer.device_grad_subgroups == frozenset({1, 3, 5})  # decided before the next backward
    probe += [_step(manager) for _ in range(PROBE_STEPS - 1)]
    assert [_letters(r.plan) for r in probe] == ["HHHHHH", "HDHDHD"]
    assert [r.replanned for r in probe] == [False, True]  # the probe's steps are not re-plans; choosing after is
    assert manager.plans.in_force.source == "auto" and not manager.auto.probing
    assert manager.optimizer.device_grad_subgroups == manager.plan_model.kept_grads(manager.plans.in_force)


@pytest.mark.parametrize("budget_bytes", [None, 60_000])
def test_the_probe_measures_the_device_lane_with_the_slots_the_budget_holds(budget_bytes: int | None) -> None:
    """Sizes 3000 and five of 1000; the probe's mixed step puts subgroups 0, 2 and 4 on the device lane, whose slots
    are sized by subgroup 0: 48,000 B each. Within 60,000 B two slots do not fit and one does, so the probe runs its
    device lane with one slot, every device subgroup kept. Demoting for want of a second slot moved subgroup 0 to the
    host here; in run AJ, where (each slot then counted as a whole subgroup) two slots of no subgroup fitted, it moved
    all of them and the planner chose without the device lane's rate. No budget: two slots."""
    gib = None if budget_bytes is None else budget_bytes / GIB
    manager = OptimizerStateManager(_UnevenOptimizer(), plan=parse_plan("auto"), memory_budget_gib=gib)
    probe = [_step(manager) for _ in range(PROBE_STEPS)]
    assert [_letters(r.plan) for r in probe] == ["HHHHHH", "DHDHDH"]
    assert [r.demoted for r in probe] == [(), ()]
    assert probe[1].plan.buffers == (2 if budget_bytes is None else 1)
    assert probe[1].timings.device_params == 5000  # the device lane ran and was measured


def test_swapping_in_a_cold_auto_after_fixed_plans_begins_as_a_new_run() -> None:
    """A fixed-plan run switched to ``auto`` (the plan sweep does this) starts as a new ``auto`` run would: the
    starting cost values (user overrides kept), the two probe steps, then the planner's choice."""
    manager = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5"),
                                    cost_overrides={"gpu_adam_params_per_s": 7e9})
    start = manager.cost
    assert manager.auto is None
    for _ in range(3):  # fixed plans: nothing is re-planned, and calibration moves the rates
        assert not _step(manager).replanned
    assert manager.cost.cpu_adam_params_per_s != start.cpu_adam_params_per_s
    assert manager.calibrator.history

    fixed = manager.swap_planning(None)
    assert manager.plans.asked.kind == "auto" and manager.cost == start and not manager.calibrator.history
    assert manager.cost.gpu_adam_params_per_s == 7e9
    assert _letters(manager.plans.in_force) == "HHHHHH" and manager.optimizer.device_grad_subgroups == frozenset()
    probe = [_step(manager)]
    assert _letters(manager.plans.in_force) == "HDHDHD" and manager.optimizer.device_grad_subgroups == {1, 3, 5}

    # a fixed-plan step between two of auto's (the plan sweep interleaves them): it neither advances auto's probe nor
    # feeds auto's calibration, and auto goes on where it was
    auto = manager.swap_planning(fixed)
    assert auto.auto is not None and auto.auto.steps == 1
    assert manager.plans.asked.kind == "fraction" and _letters(manager.plans.in_force) == _letters(fixed.in_force)
    assert manager.auto is None
    assert manager.optimizer.device_grad_subgroups == {i for i, c in enumerate(_letters(fixed.in_force)) if c == "D"}
    between = _step(manager)
    assert not between.replanned and len(fixed.calibrator.history) == 4 and len(auto.calibrator.history) == 1
    assert manager.swap_planning(auto).calibrator is fixed.calibrator
    probe.append(_step(manager))
    assert [_letters(r.plan) for r in probe] == ["HHHHHH", "HDHDHD"]
    assert [r.replanned for r in probe] == [False, True]  # counted under auto, not from the run's first step
    assert manager.plans.in_force.source not in ("probe", "0.5") and len(manager.records) == 6
    assert len(manager.calibrator.history) == 2
    # a cold start begins afresh: a new state machine, no plan in force yet for its trials
    manager.swap_planning(None)
    assert manager.auto is not auto.auto and manager.auto.steps == 0 and manager.auto.trials.incumbent is None


class _Scripted:
    """A performance model whose choice and ranking the test sets: after the probe it chooses DDHHHH, and DDDHHH,
    predicted 2% slower, is tried next (a :class:`~lightning_dos.planning.auto.PlanModel`)."""

    predicted = {"DDHHHH": 1.00, "DDDHHH": 1.02}

    def best_plan(self) -> Plan:
        return _plan("DDHHHH")

    def ranked(self) -> list[tuple[Plan, float]]:
        return [(_plan(letters), s) for letters, s in self.predicted.items()]

    def predict(self, plan: Plan) -> float:
        return self.predicted[_letters(plan)]

    def kept_grads(self, plan: Plan) -> frozenset[int]:
        return frozenset(plan.device_subgroups())

    def fit_slots(self, plan: Plan) -> Plan:
        return plan

    def drifted(self, patience: int) -> bool:
        return False


def test_plan_state_round_trips_through_json_and_continues_auto() -> None:
    """A checkpoint's plan state (``state_dict``) puts a new manager where the old one stood: the plan in force, the
    calibration, auto's progress; a trial under way is dropped for the plan in force; another run's state is refused."""
    old = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    scripted = AutoPlanner(old.sizes, 2, _Scripted)
    old.swap_planning(PlanningState(spec=old.plans.asked, calibrator=old.calibrator, in_force=scripted.probes[0],
                                    auto=scripted))
    for _ in range(PROBE_STEPS + 1):
        _step(old)
    assert old.auto.trials.running and _letters(old.plans.in_force) == "DDDHHH"  # a trial under way when it is saved
    state = json.loads(json.dumps(old.state_dict()))  # what a checkpoint holds survives JSON

    new = OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))
    assert new.plans.in_force.source == "probe"
    assert new.load_state_dict(state)
    assert new.plans.in_force.lanes == _plan("DDHHHH").lanes  # the plan in force, not the trial's candidate
    assert not new.auto.trials.running and new.auto.state_dict() == old.auto.state_dict()
    assert new.auto.steps == old.auto.steps == PROBE_STEPS + 1
    assert new.cost == old.cost and new.calibrator.history == old.calibrator.history
    assert new.calibrator.observations == old.calibrator.observations
    assert new.optimizer.device_grad_subgroups == frozenset({0, 1})  # the restored plan keeps its gradients
    # the next update phase is auto's next one, not a new probe
    _step(new)
    assert new.auto.steps == PROBE_STEPS + 2 and new.records[-1].plan.lanes == _plan("DDHHHH").lanes

    for other in (OptimizerStateManager(FakeOptimizer(), plan=parse_plan("0.5")),  # another plan asked for
                  OptimizerStateManager(FakeOptimizer(), plan=parse_plan("auto"))):
        if other.plans.asked.kind == "auto":
            state = dict(state, sizes=[500] * 12)  # other subgroups (a changed sub_group_size)
        before = other.plans.in_force
        assert not other.load_state_dict(state)
        assert other.plans.in_force == before
