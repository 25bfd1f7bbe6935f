"""Owns ``auto``'s plan trials: plans the model cannot tell apart from the plan in force are measured, the faster kept.

The performance model ranks plans from a handful of fitted rates; plans predicted within a few percent of each other
differ mostly in what it does not model, so ``auto`` measures them instead of trusting the ranking:

* after the planner chooses a plan (:meth:`PlanTrials.start`), trials may start at once (the manager runs the
  chosen plan for one update phase first);
* the best-predicted candidate whose key (:func:`lanes_key` by default: its lanes) differs from every plan tried
  so far, and whose prediction is at most :data:`TRIAL_WINDOW` above the prediction of the plan in force, is tried:
  it and the plan in force take turns (:meth:`PlanTrials.next_plan`: the candidate first) until each has run
  :data:`TRIAL_STEPS` update phases of the trial, or :data:`TRIAL_EARLY_STEPS` if by then every turn of the candidate
  was faster by :data:`TRIAL_MIN_GAIN` than the plan in force's next to it, or none was faster at all;
* it replaces the plan in force if it is faster by :data:`TRIAL_MIN_GAIN` in the median of its turns paired with the
  plan in force's (its k-th update phase of the trial over the plan in force's k-th, the phase next to it); the next
  trial may start at once;
* at most :data:`MAX_TRIALS` trials follow one choice of the planner; a new choice starts over.

The turns make the comparison fair: the host's speed drifts by 10-20% in spells of a few iterations, so comparing each
update phase with the one next to it puts both sides in the same spell. Update phases of any other plan (demoted to
fit the free memory, for instance) count for neither side. A trial that has not measured both sides
:data:`TRIAL_STEPS` times in ``4 * TRIAL_STEPS`` update phases is given up.

Pure Python: no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .plan import Lane, Plan

#: A candidate is tried if its prediction is at most this much above the prediction of the plan in force.
TRIAL_WINDOW = 0.05
#: Update phases of a trial, and of the plan in force it is compared with.
TRIAL_STEPS = 3
#: Turns of each side after which a trial ends if every pair agrees (all won by the challenger, or none).
TRIAL_EARLY_STEPS = 2
#: A challenger is kept only if it is at least this much faster than the plan in force: the median of its turns' ratios
#: to the plan in force's below ``1 - TRIAL_MIN_GAIN``.
TRIAL_MIN_GAIN = 0.02
#: Trials after one choice of the planner.
MAX_TRIALS = 3
#: ``Plan.source`` of a plan being tried.
TRIAL_SOURCE = "trial"

LanesKey = tuple[tuple[Lane, ...], tuple[int, ...]]


def lanes_key(plan: Plan) -> LanesKey:
    """What a trial tells apart by default: the lanes and the device lane's order (not the buffering depth)."""
    return plan.lanes, plan.device_order


@dataclass(frozen=True)
class TrialVerdict:
    """The outcome of one trial: both medians, and which plan is in force from now on."""

    challenger: Plan
    challenger_s: float
    """Median measured update phase of the challenger (inf: it did not run often enough to be measured)."""
    incumbent: Plan
    incumbent_s: float
    """Median of the plan in force over the trial's turns."""
    kept: Plan
    """The plan in force after the trial (``challenger`` relabelled ``auto`` when it won)."""
    ratio: float
    """What decided: the median of the paired turns' ratios, challenger over plan in force."""

    @property
    def challenger_won(self) -> bool:
        return self.kept is not self.incumbent


def _check_share(name: str, value: float, upper: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < upper:
        raise ValueError(f"{name}: {value!r} is outside [0, {upper:g}); set {name} to a share such as 0.05")
    return float(value)


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: {value!r}; set {name} to an integer >= {minimum}")
    return value


class PlanTrials:
    """``auto``'s trials between two choices of the planner (see the module docstring for the rule)."""

    def __init__(
        self,
        window: float = TRIAL_WINDOW,
        steps: int = TRIAL_STEPS,
        early_steps: int = TRIAL_EARLY_STEPS,
        min_gain: float = TRIAL_MIN_GAIN,
        max_trials: int = MAX_TRIALS,
        key: Callable[[Plan], Hashable] = lanes_key,
    ) -> None:
        self.window = _check_share("window", window, math.inf)
        self.steps = _check_count("steps", steps, 1)
        self.early_steps = _check_count("early_steps", early_steps, 1)
        """Pairs after which a unanimous trial ends (``>= steps``: every trial runs ``steps`` pairs)."""
        self.min_gain = _check_share("min_gain", min_gain, 1.0)
        self.max_trials = _check_count("max_trials", max_trials, 0)
        self.key = key
        """What tells two plans apart (a plan whose key was tried is not tried again until the next choice)."""
        self.incumbent: Plan | None = None
        """The plan in force (None before the planner's first choice)."""
        self.challenger: Plan | None = None
        """The plan being tried, if a trial runs."""
        self.verdicts: list[TrialVerdict] = []
        """Every trial's outcome, oldest first (kept across :meth:`start`)."""
        self._turns: dict[Hashable, list[float]] = {}  # the running trial's update phases of each side
        self._tried: set[Hashable] = set()
        self._trials = 0
        self._trial_phases = 0
        self._exhausted = False

    @property
    def running(self) -> bool:
        """Whether a trial is under way (the plan in force must not change meanwhile)."""
        return self.challenger is not None

    def start(self, plan: Plan) -> None:
        """The planner chose ``plan``: it is the plan in force, measurements and tried plans start over."""
        self.incumbent = plan
        self.challenger = None
        self._turns.clear()
        self._tried = {self.key(plan)}
        self._trials = 0
        self._trial_phases = 0
        self._exhausted = False

    def state_dict(self) -> dict[str, Any]:
        """Where the trials stand, JSON-serialisable: the plan in force and how many trials it has had. A trial under
        way is not kept (resumed, it would compare update phases of two processes): the plan in force stays."""
        return {"incumbent": None if self.incumbent is None else self.incumbent.to_json(), "trials": self._trials,
                "exhausted": self._exhausted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output: no trial runs, and only the trials left may still run."""
        incumbent = state["incumbent"]
        if incumbent is None:
            self.incumbent = None
            return
        self.start(Plan.from_json(incumbent))
        self._trials = int(state["trials"])
        self._exhausted = bool(state["exhausted"])

    def next_plan(self) -> Plan | None:
        """The plan for the next update phase: during a trial, the side that has run fewer of the trial's update
        phases (the candidate on a tie); otherwise the plan in force."""
        if self.challenger is None:
            return self.incumbent
        assert self.incumbent is not None
        ran = self._turns.get(self.key(self.challenger), [])
        return self.challenger if len(ran) <= len(self._turns.get(self.key(self.incumbent), [])) else self.incumbent

    def observe(self, plan: Plan, measured_s: float) -> TrialVerdict | None:
        """An update phase of ``plan`` took ``measured_s`` seconds; returns the verdict when it ends a trial."""
        if self.incumbent is None or self.challenger is None or not (math.isfinite(measured_s) and measured_s > 0):
            return None
        key = self.key(plan)
        self._trial_phases += 1
        sides = (self.key(self.challenger), self.key(self.incumbent))
        if key in sides:
            self._turns.setdefault(key, []).append(float(measured_s))
        challenger, incumbent = (self._turns.get(side, []) for side in sides)
        pairs = [c / i for c, i in zip(challenger, incumbent)]
        if len(pairs) < self.steps and not self._unanimous(pairs):
            if self._trial_phases < 4 * self.steps:
                return None
            # starved (demoted most of the time): the trial is given up; the plan in force keeps its figures
            return self._verdict(math.inf, statistics.median(incumbent) if incumbent else math.inf, math.inf)
        n = len(pairs)  # a side's extra turn does not count
        return self._verdict(statistics.median(challenger[:n]), statistics.median(incumbent[:n]),
                             statistics.median(pairs))

    def _unanimous(self, pairs: Sequence[float]) -> bool:
        """Whether the trial's paired ratios so far decide it early: at least :attr:`early_steps` of them, and every
        one a win for the challenger (below ``1 - min_gain``) or every one no faster at all (``>= 1``)."""
        return len(pairs) >= self.early_steps and (all(r < 1 - self.min_gain for r in pairs)
                                                   or all(r >= 1 for r in pairs))

    def _verdict(self, challenger_s: float, incumbent_s: float, ratio: float) -> TrialVerdict:
        assert self.incumbent is not None and self.challenger is not None
        won = ratio < 1 - self.min_gain
        kept = replace(self.challenger, source="auto") if won else self.incumbent
        verdict = TrialVerdict(self.challenger, challenger_s, self.incumbent, incumbent_s, kept, ratio)
        self.verdicts.append(verdict)
        self.incumbent = kept
        self.challenger = None
        self._turns.clear()
        return verdict

    def ready(self) -> bool:
        """Whether the next trial may start now: none runs, and trials are left after the planner's last choice."""
        return (self.incumbent is not None and self.challenger is None and not self._exhausted
                and self._trials < self.max_trials)

    def next_challenger(self, ranked: Sequence[tuple[Plan, float]], incumbent_predicted_s: float) -> Plan | None:
        """Start a trial of the best candidate of ``ranked`` ((plan, predicted s), best first) within the window.

        Candidates whose key was tried since :meth:`start` (the plan in force's included) are skipped. Returns the
        plan to run from the next update phase (``source`` :data:`TRIAL_SOURCE`), or None when no candidate is left:
        then no trial starts until the planner's next choice.
        """
        if not self.ready():
            return None
        limit = incumbent_predicted_s * (1 + self.window)
        for plan, predicted_s in ranked:
            key = self.key(plan)
            if key in self._tried or not predicted_s <= limit:
                continue
            self._tried.add(key)
            self._turns.clear()
            self._trials += 1
            self._trial_phases = 0
            self.challenger = replace(plan, source=TRIAL_SOURCE)
            return self.challenger
        self._exhausted = True
        return None
