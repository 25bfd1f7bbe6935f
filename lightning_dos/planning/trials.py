"""Owns ``auto``'s plan trials: plans the model cannot tell apart from the plan in force are measured, the faster kept.

The performance model ranks plans from a handful of fitted rates. Plans predicted within a few percent of each other
differ mostly in what it does not model. Measured on a GPU host (gpt-2.7b, run J, docs/performance-model.md): the
plan ``auto`` chose, with the device lane starting at the largest subgroup, ran 4.8% slower than plan 0.4's lanes,
which its own fitted model ranked 6% ahead; and the same model predicted plan 0.3's lanes 12% short. Neither
trusting the model's small gains nor ignoring them is right, so ``auto`` measures them:

* after the planner chooses a plan (:meth:`PlanTrials.start`), that plan runs for :data:`TRIAL_STEPS` update phases;
* then the best-predicted candidate whose lanes differ from every plan tried so far, and whose prediction is at most
  :data:`TRIAL_WINDOW` above the prediction of the plan in force, runs for :data:`TRIAL_STEPS` update phases;
* it replaces the plan in force if the median of its update phases beats the median of the plan in force's last
  :data:`TRIAL_STEPS` by :data:`TRIAL_MIN_GAIN`; otherwise the plan in force comes back, and runs :data:`TRIAL_STEPS`
  fresh update phases before the next trial (each comparison is between neighbouring update phases: the host's
  speed drifts by 10-20% over tens of seconds);
* at most :data:`MAX_TRIALS` trials follow one choice of the planner; a new choice starts over.

Update phases of any other plan (demoted to fit the free memory, for instance) count for neither side. A challenger
that has not run :data:`TRIAL_STEPS` times in ``2 * TRIAL_STEPS`` update phases is given up.

Pure Python: no torch.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .plan import Lane, Plan

#: A candidate is tried if its prediction is at most this much above the prediction of the plan in force.
TRIAL_WINDOW = 0.05
#: Update phases of a trial, and of the plan in force it is compared with.
TRIAL_STEPS = 3
#: A challenger is kept only if its median update phase is at least this much shorter than the plan in force's.
TRIAL_MIN_GAIN = 0.02
#: Trials after one choice of the planner.
MAX_TRIALS = 3
#: ``Plan.source`` of a plan being tried.
TRIAL_SOURCE = "trial"

LanesKey = tuple[tuple[Lane, ...], tuple[int, ...]]


def lanes_key(plan: Plan) -> LanesKey:
    """What a trial tells apart: the lanes and the device lane's order (not the buffering depth)."""
    return plan.lanes, plan.order


@dataclass(frozen=True)
class TrialVerdict:
    """The outcome of one trial: both medians, and which plan is in force from now on."""

    challenger: Plan
    challenger_s: float
    """Median measured update phase of the challenger (inf: it did not run often enough to be measured)."""
    incumbent: Plan
    incumbent_s: float
    """Median of the plan in force over its last update phases before the trial."""
    kept: Plan
    """The plan in force after the trial (``challenger`` relabelled ``auto`` when it won)."""

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
        min_gain: float = TRIAL_MIN_GAIN,
        max_trials: int = MAX_TRIALS,
    ) -> None:
        self.window = _check_share("window", window, math.inf)
        self.steps = _check_count("steps", steps, 1)
        self.min_gain = _check_share("min_gain", min_gain, 1.0)
        self.max_trials = _check_count("max_trials", max_trials, 0)
        self.incumbent: Plan | None = None
        """The plan in force (None before the planner's first choice)."""
        self.challenger: Plan | None = None
        """The plan being tried, if a trial runs."""
        self.verdicts: list[TrialVerdict] = []
        """Every trial's outcome, oldest first (kept across :meth:`start`)."""
        self._recent: dict[LanesKey, deque[float]] = {}
        self._tried: set[LanesKey] = set()
        self._trials = 0
        self._fresh = 0  # update phases of the plan in force since it came into force or came back
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
        self._recent.clear()
        self._tried = {lanes_key(plan)}
        self._trials = 0
        self._fresh = 0
        self._trial_phases = 0
        self._exhausted = False

    def observe(self, plan: Plan, measured_s: float) -> TrialVerdict | None:
        """An update phase of ``plan`` took ``measured_s`` seconds; returns the verdict when it ends a trial."""
        if self.incumbent is None or not (math.isfinite(measured_s) and measured_s > 0):
            return None
        key = lanes_key(plan)
        self._recent.setdefault(key, deque(maxlen=self.steps)).append(float(measured_s))
        if self.challenger is None:
            if key == lanes_key(self.incumbent):
                self._fresh += 1
            return None
        self._trial_phases += 1
        measured = self._recent.get(lanes_key(self.challenger), ())
        if len(measured) < self.steps and self._trial_phases < 2 * self.steps:
            return None
        return self._verdict(statistics.median(measured) if len(measured) >= self.steps else math.inf)

    def _verdict(self, challenger_s: float) -> TrialVerdict:
        assert self.incumbent is not None and self.challenger is not None
        incumbent_s = statistics.median(self._recent[lanes_key(self.incumbent)])
        won = challenger_s < incumbent_s * (1 - self.min_gain)
        kept = replace(self.challenger, source="auto") if won else self.incumbent
        verdict = TrialVerdict(self.challenger, challenger_s, self.incumbent, incumbent_s, kept)
        self.verdicts.append(verdict)
        self.incumbent = kept
        self.challenger = None
        self._fresh = self.steps if won else 0  # a winner's trial phases are its fresh measurements
        return verdict

    def ready(self) -> bool:
        """Whether the next trial may start now: none runs, trials are left, the plan in force has fresh figures."""
        return (self.incumbent is not None and self.challenger is None and not self._exhausted
                and self._trials < self.max_trials and self._fresh >= self.steps
                and len(self._recent.get(lanes_key(self.incumbent), ())) >= self.steps)

    def next_challenger(self, ranked: Sequence[tuple[Plan, float]], incumbent_predicted_s: float) -> Plan | None:
        """Start a trial of the best candidate of ``ranked`` ((plan, predicted s), best first) within the window.

        Candidates whose lanes were tried since :meth:`start` (the plan in force's included) are skipped. Returns the
        plan to run from the next update phase (``source`` :data:`TRIAL_SOURCE`), or None when no candidate is left:
        then no trial starts until the planner's next choice.
        """
        if not self.ready():
            return None
        limit = incumbent_predicted_s * (1 + self.window)
        for plan, predicted_s in ranked:
            key = lanes_key(plan)
            if key in self._tried or not predicted_s <= limit:
                continue
            self._tried.add(key)
            self._recent.pop(key, None)  # only the trial's own update phases count
            self._trials += 1
            self._trial_phases = 0
            self.challenger = replace(plan, source=TRIAL_SOURCE)
            return self.challenger
        self._exhausted = True
        return None
