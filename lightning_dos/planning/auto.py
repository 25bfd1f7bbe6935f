"""Owns ``plan="auto"``: the probe, the planner's choice, re-planning on drift and the trials of close plans.

``auto`` is a state machine over the update phases the manager records (:meth:`AutoPlanner.record`):

1. the probe (:func:`~.calibration.probe_plans`): :data:`PROBE_STEPS` update phases, the host lane alone, then half
   the subgroups on each lane, so the calibration has measured every rate before anything is chosen;
2. after the probe, the planner's choice is put in force (a re-plan, ``dos/replanned``), and trials start over;
3. after every later update phase: a trial under way (:mod:`~.trials`) counts it and, until it ends, the tried plan
   and the plan in force take turns; otherwise, once :data:`REPLAN_PATIENCE` update phases, all measured since the
   last (re-)plan, drifted from their predictions, the planner chooses again and its choice is put in force if it is
   predicted at least :data:`REPLAN_MIN_GAIN` faster than the plan in force; otherwise the next trial starts, if one is
   left.

It reads the performance model as calibrated so far through a :class:`PlanModel`: the manager's is a
:class:`CalibratedModel` (the planner over the subgroups the lanes share, within the lane budget, with the calibrator's
costs); a test may script one. Each decision comes back as an :class:`AutoDecision` for the manager to carry out: the
plan to put in force from the next update phase, whether that is a re-plan, and what to log.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .calibration import Calibrator, probe_plans
from .perf_model import CostParams, predicted_makespan_s
from .plan import Plan
from .planner import best_plan, fewer_slots_to_fit, kept_grads, rank_plans
from .trials import PlanTrials

#: ``auto`` starts with two probe steps (:func:`~.calibration.probe_plans`): the host lane alone, then half the
#: subgroups on each lane.
PROBE_STEPS = 2
#: After the probe, ``auto`` re-plans only when this many consecutive update phases, all measured since the last
#: re-plan, drifted from their predictions ...
REPLAN_PATIENCE = 3
#: ... and only adopts a plan predicted to be at least this much faster than the current one (no churn between
#: plans the model cannot tell apart).
REPLAN_MIN_GAIN = 0.05
#: Deepest buffering ``auto`` considers when ``buffers`` is not set. Measured on a GPU host (docs/performance-model.md):
#: more slots let prefetches run further ahead, and the extra DMA slows CPU Adam more than it helps the device lane.
AUTO_MAX_BUFFERS = 2


class PlanModel(Protocol):
    """What ``auto`` asks of the performance model, with the costs calibrated so far."""

    def best_plan(self) -> Plan:
        """The planner's choice."""
        ...

    def ranked(self) -> Sequence[tuple[Plan, float]]:
        """The candidates with their predicted makespans (seconds), best first."""
        ...

    def predict(self, plan: Plan) -> float:
        """The predicted makespan (seconds) of ``plan``, its gradients kept as :meth:`kept_grads` says."""
        ...

    def kept_grads(self, plan: Plan) -> frozenset[int]:
        """The subgroups of ``plan`` whose gradients stay on the device through backward."""
        ...

    def fit_slots(self, plan: Plan) -> Plan:
        """``plan`` with as many buffer slots as the budget holds, at least one (its lanes unchanged)."""
        ...

    def drifted(self, patience: int) -> bool:
        """Whether the last ``patience`` update phases all drifted from their predictions."""
        ...


@dataclass(frozen=True)
class CalibratedModel:
    """The planner over the subgroups the lanes share, with the calibrator's current costs (a :class:`PlanModel`)."""

    calibrator: Calibrator
    sizes: tuple[int, ...]
    """Parameters of each subgroup as the lanes share them (a resident subgroup weighs 0)."""
    budget_bytes: int | None
    """Device memory the device lane may use (None: no budget); a candidate that does not fit is weighed demoted."""
    max_buffers: int
    """Deepest buffering weighed."""
    may_keep: frozenset[int]
    """Subgroups whose gradients may stay on the device through backward."""
    grads_budget_bytes: int | None
    """What kept gradients and buffer slots must fit in (None where the host stands in for the device: no limit)."""

    @property
    def cost(self) -> CostParams:
        return self.calibrator.params

    def best_plan(self) -> Plan:
        return best_plan(self.sizes, self.cost, self.budget_bytes, max_buffers=self.max_buffers,
                         grads_on_device=self.may_keep)

    def ranked(self) -> list[tuple[Plan, float]]:
        return [(plan, prediction.makespan_s) for plan, prediction in rank_plans(
            self.sizes, self.cost, self.budget_bytes, max_buffers=self.max_buffers, grads_on_device=self.may_keep)]

    def kept_grads(self, plan: Plan) -> frozenset[int]:
        """The planner's rule (:func:`~.planner.kept_grads`): those of ``plan`` as dispatch will run it, demoted to
        fit the budget if its buffer slots do not fit."""
        return kept_grads(plan, self.sizes, self.cost, self.grads_budget_bytes, self.may_keep)

    def predict(self, plan: Plan) -> float:
        return predicted_makespan_s(plan, self.sizes, self.cost, grads_on_device=self.kept_grads(plan))

    def fit_slots(self, plan: Plan) -> Plan:
        if self.budget_bytes is None:
            return plan
        return fewer_slots_to_fit(plan, self.sizes, self.budget_bytes, self.cost)

    def drifted(self, patience: int) -> bool:
        return self.calibrator.should_replan(patience)


@dataclass(frozen=True)
class AutoDecision:
    """What ``auto`` decided after an update phase."""

    plan: Plan | None = None
    """The plan to put in force from the next update phase (None: the plan in force stays)."""
    replanned: bool = False
    """Whether the plan in force changed by the planner's choice or a trial won (not a probe step or a trial's turn)."""
    notes: tuple[str, ...] = ()
    """What happened, one line each, for the log."""


class AutoPlanner:
    """``auto``'s state machine (see the module docstring).

    Args:
        sizes: parameters of each subgroup as the lanes share them; the probe's plans are made for them.
        buffers: buffering depth of the probe's plans.
        model: the performance model as calibrated now (called at every decision: the costs move).
    """

    def __init__(self, sizes: Sequence[int], buffers: int, model: Callable[[], PlanModel]) -> None:
        self.model = model
        self.buffers = buffers
        self.probes = self._probes(sizes)
        """The probe's plans, one per update phase."""
        assert len(self.probes) == PROBE_STEPS
        self.steps = 0
        """Update phases recorded so far (the probe's included)."""
        self.trials = PlanTrials(key=self._trial_key)
        """The measured comparisons of plans the model ranks close together."""
        self._replan_checked = 0  # update phases done when it last (re-)planned or weighed a re-plan

    @property
    def probing(self) -> bool:
        """Whether the probe is still under way (the next update phase runs ``probes[steps]``)."""
        return self.steps < PROBE_STEPS

    def _trial_key(self, plan: Plan) -> Hashable:
        """What tells two plans apart in a trial: their lanes and device order, and whether the device lane keeps its
        gradients on the device (under a budget the same lanes may run either way, at different buffering depths).
        Not the host lane's order: the model alone decides it (it moves the step's tail, which the model times)."""
        return plan.lanes, plan.device_order, bool(self.model().kept_grads(plan))

    def record(self, step: int, ran: Plan, measured_s: float, in_force: Plan) -> AutoDecision:
        """An update phase of ``ran`` took ``measured_s`` seconds (the calibration has seen it already) while
        ``in_force`` was the plan in force; returns what to put in force from the next update phase. ``step`` is the
        update phase's index, for the log."""
        self.steps += 1
        done = self.steps
        if done < PROBE_STEPS:  # the next probe step (part of the start-up measurement, not a re-plan)
            return AutoDecision(plan=self.probes[done])
        model = self.model()
        if done == PROBE_STEPS:
            return self._adopt(model.best_plan(), step)
        plan: Plan | None = None
        replanned = False
        notes: list[str] = []
        verdict = self.trials.observe(ran, measured_s)
        if verdict is not None:  # the faster plan is in force: the challenger if it won, else the plan in force
            plan, replanned = verdict.kept, verdict.challenger_won
            notes.append(f"trial ended at update {step}: {verdict.challenger_s * 1e3:.1f} ms against "
                         f"{verdict.incumbent_s * 1e3:.1f} ms (paired ratio {verdict.ratio:.3f}), "
                         f"{'the tried plan' if verdict.challenger_won else 'the previous plan'} in force: "
                         f"{verdict.kept}")
        current = in_force if plan is None else plan
        if self.trials.running:  # the tried plan and the plan in force take turns; the drift check waits
            turn = self.trials.next_plan()
            if turn is not None and turn is not current:
                plan = turn
            return AutoDecision(plan, replanned, tuple(notes))
        if done - self._replan_checked >= REPLAN_PATIENCE and model.drifted(REPLAN_PATIENCE):
            self._replan_checked = done  # the next check needs REPLAN_PATIENCE fresh steps
            candidate = model.best_plan()
            if model.predict(candidate) < model.predict(current) * (1 - REPLAN_MIN_GAIN):
                adopted = self._adopt(candidate, step)
                return AutoDecision(adopted.plan, True, (*notes, *adopted.notes))
        if self.trials.ready():
            challenger, note = self._start_trial(model, step)
            if challenger is not None:
                plan = challenger
                notes.append(note)
        return AutoDecision(plan, replanned, tuple(notes))

    def resize(self, sizes: Sequence[int]) -> Plan:
        """The subgroups the lanes share changed (residents taken or given back; the model weighs ``sizes`` already):
        the plan to put in force now. While the probe runs, its plan for the next update phase made for ``sizes``;
        after it, the planner's choice, from which the re-plan check and the trials start over."""
        if self.probing:
            self.probes = self._probes(sizes)
            return self.probes[self.steps]
        plan = self.model().best_plan()
        self._replan_checked = self.steps
        self.trials.start(plan)
        return plan

    def _probes(self, sizes: Sequence[int]) -> tuple[Plan, ...]:
        """The probe's plans for ``sizes``, each with as many buffer slots as the budget holds: the probe is there to
        measure both lanes, and a mixed step demoted to the host for want of a second slot would leave the planner to
        choose with the device lane unmeasured (dispatch still demotes what one slot cannot hold)."""
        model = self.model()
        return tuple(model.fit_slots(plan) for plan in probe_plans(sizes, buffers=self.buffers))

    def _adopt(self, plan: Plan, step: int) -> AutoDecision:
        """The planner's choice is in force from the next update phase; trials start over from it."""
        self._replan_checked = self.steps
        self.trials.start(plan)
        return AutoDecision(plan, True, (f"re-planned at update {step}: {plan}",))

    def _start_trial(self, model: PlanModel, step: int) -> tuple[Plan | None, str]:
        """Try the next candidate the model ranks close to the plan in force, if one is left."""
        in_force = self.trials.incumbent
        assert in_force is not None
        predicted = model.predict(in_force)
        challenger = self.trials.next_challenger(model.ranked(), predicted)
        if challenger is None:
            return None, ""
        return challenger, (f"trying for {self.trials.steps} updates from update {step + 1}: {challenger} "
                            f"(predicted {model.predict(challenger) * 1e3:.1f} ms, plan in force "
                            f"{predicted * 1e3:.1f} ms)")

    def state_dict(self) -> dict[str, Any]:
        """How far it has come, JSON-serialisable: update phases recorded, the last re-plan check, the trials."""
        return {"auto_steps": self.steps, "replan_checked": self._replan_checked, "trials": self.trials.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict`'s output (a trial under way then was dropped: the plan in force runs)."""
        self.steps = int(state["auto_steps"])
        self._replan_checked = int(state["replan_checked"])
        self.trials.load_state_dict(state["trials"])
