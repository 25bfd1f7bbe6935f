"""Owns the plan sweep's settings (``--sweep``): the fixed plans, iterations per plan, the memory budgets
(:class:`Budget`) and the order a budget's process runs them in (:func:`sweep_schedule`), with no torch import.

A budget's process runs every fixed plan for ``steps_per_plan`` iterations and ``auto`` (started cold, with its own
calibration) for ``bench.steps``, interleaved: the host's speed drifts by over 10% in tens of seconds, and plans held in
turn each met another spell of it. A budget is ``unlimited``, ``quarter`` (0.25 x 12 bytes x the parameters: a quarter
of the optimizer state; of a rank's share of it on several devices) or a number of GiB.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_dos.bench import checks
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import RunSpec, plan_argument

GIB = 1024**3
#: Fixed plans swept by default: fractions 0.0-1.0 by 0.1, then stride:2..6.
DEFAULT_SWEEP_PLANS = tuple(f"{k / 10:.1f}" for k in range(11)) + tuple(f"stride:{k}" for k in range(2, 7))
#: Budgets swept by default.
DEFAULT_BUDGETS = ("unlimited", "quarter")
#: Share of the optimizer state (fp32 master, m and v: 12 bytes per parameter) the ``quarter`` budget holds.
QUARTER_SHARE = 0.25
STATE_BYTES_PER_PARAM = 12
#: Iterations of each plan left out of its statistics (the first: buffers and gradients change with the plan).
PLAN_WARMUP = 1
#: The plan name of ``auto``'s iterations in a sweep's schedule.
AUTO = "auto"
#: The sweep's records so far, beside a process's config file, written by its worker after every iteration.
PROGRESS_FILE = "progress.json"
#: Leading iterations of an ``auto`` run always left out: its two probe steps (the host lane alone, then half the
#: subgroups on each lane) and the first step of the chosen plan.
AUTO_MIN_EXCLUDED = 3


def sweep_schedule(plans: Sequence[str], rounds: int, auto_steps: int = 0) -> list[str]:
    """The plan of each iteration of a sweep process: ``rounds`` rounds of every fixed plan, the first alone (every
    plan's warm-up), then ``auto_steps`` iterations of ``auto`` spread evenly over the later rounds."""
    first, later = list(plans), list(plans) * (rounds - 1)
    if auto_steps <= 0:
        return first + later
    slots = [k * len(later) // auto_steps for k in range(auto_steps)]
    out = first
    for i, plan in enumerate(later):
        out += [AUTO] * slots.count(i)
        out.append(plan)
    return out + [AUTO] * sum(slot >= len(later) for slot in slots)


@dataclass(frozen=True)
class Budget:
    """One memory budget of the sweep, resolved for the model."""

    name: str  # As given: ``unlimited``, ``quarter`` or a number of GiB.
    gib: float | None  # The DOS ``memory_budget_gib`` it stands for; None for no limit beyond the free device memory.

    @property
    def label(self) -> str:
        """E.g. ``unlimited``, ``quarter (7.81 GiB)``, ``12 GiB``."""
        if self.gib is None:
            return self.name
        if self.name == "quarter":
            return f"quarter ({self.gib:.2f} GiB)"
        return f"{self.gib:g} GiB"

    @property
    def slug(self) -> str:
        """A file-name-safe form of the name."""
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy, with the label."""
        return {"name": self.name, "gib": self.gib, "label": self.label}


def check_budget(text: str) -> str:
    """``text`` normalised (``unlimited``, ``quarter`` or a number of GiB); ``ValueError`` for anything else."""
    value = str(text).strip().lower()
    if value in ("unlimited", "quarter"):
        return value
    try:
        gib = float(value)
    except ValueError:
        raise ValueError(f"budgets: {text!r} is not a budget; use 'unlimited', 'quarter' or a number of GiB") from None
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"budgets: {text!r} must be a number of GiB >= 0")
    return f"{gib:g}"


def resolve_budget(text: str, params: int | None, ranks: int = 1) -> Budget:
    """The budget ``text`` for a model of ``params`` parameters partitioned over ``ranks`` (a budget is per rank, as
    ``memory_budget_gib`` is: ``quarter`` is a quarter of one rank's share of the optimizer state)."""
    name = check_budget(text)
    if name == "unlimited":
        return Budget(name, None)
    if name == "quarter":
        if not params:
            raise ValueError("budgets: quarter needs the model's parameter count, which only the GPT's is known to "
                             "the bench; give the budget in GiB")
        return Budget(name, QUARTER_SHARE * STATE_BYTES_PER_PARAM * params / ranks / GIB)
    return Budget(name, float(name))


@dataclass
class SweepConfig:
    """What a plan sweep runs: per budget, the fixed plans in rounds and ``bench.steps`` iterations of ``auto``."""

    bench: BenchConfig  # the workload, auto's steps and warm-up, the output directory
    plans: list[str] = field(default_factory=lambda: list(DEFAULT_SWEEP_PLANS))  # fixed plans, in the order run
    steps_per_plan: int = 3  # rounds: iterations of each fixed plan, the first left out
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))  # unlimited, quarter, GiB; a process each

    @property
    def fixed_steps(self) -> int:
        """Iterations of the fixed plans in one budget's process."""
        return len(self.plans) * self.steps_per_plan

    @property
    def auto_steps(self) -> int:
        """Iterations of ``auto``, interleaved with the fixed plans' rounds after the first."""
        return self.bench.steps

    @property
    def process_steps(self) -> int:
        """Iterations of one budget's process: the fixed plans' and ``auto``'s."""
        return self.fixed_steps + self.auto_steps

    @property
    def auto_excluded(self) -> int:
        """Leading iterations of ``auto`` left out: its warm-up, at least the probe steps and one more."""
        return max(self.bench.warmup, AUTO_MIN_EXCLUDED)

    def to_dict(self) -> dict[str, Any]:
        """The sweep's own settings (the bench settings are recorded separately)."""
        return {"plans": list(self.plans), "steps_per_plan": self.steps_per_plan, "plan_warmup": PLAN_WARMUP,
                "budgets": list(self.budgets), "auto_steps": self.auto_steps, "auto_excluded": self.auto_excluded}

    def process_config(self, budget: Budget) -> BenchConfig:
        """The bench settings of the process of ``budget`` (every fixed plan and ``auto``, interleaved)."""
        # e2e_steps=0: every iteration synchronised; the sweep's figures are update phases, indexed by iteration
        return dataclasses.replace(self.bench, memory_budget_gib=budget.gib, steps=self.process_steps,
                                   warmup=PLAN_WARMUP, e2e_steps=0, strategies=["deep_optimizer_states"],
                                   plans=[*self.plans, "auto"])

    @property
    def devices(self) -> int:
        """The ranks of every budget's process (``--devices N``): each rank sweeps its own partition's plans."""
        return int(self.bench.devices[0])

    def spec(self, budget: Budget) -> RunSpec:
        """The process of ``budget``: DOS from the first plan (the sweep switches from there), serial (overlapped, an
        update phase would be recorded one iteration late, under the next plan), with no subgroup resident (a plan
        places every subgroup; residents would leave the plans nothing to differ in where the state fits), on
        :attr:`devices` ranks."""
        return RunSpec(f"sweep[{budget.name}]", "deep_optimizer_states", self.plans[0], devices=self.devices,
                       args={"plan": plan_argument(self.plans[0]), "overlap": False, "resident_gib": 0})

    def validate(self) -> None:
        """Raise ``ValueError`` listing every setting the sweep cannot run (the bench settings' own included)."""
        from lightning_dos.planning.plan import parse_plan

        problems = checks.problems_of(self.bench.validate)
        if len(self.bench.devices) != 1:
            problems.append(f"devices: {self.bench.devices!r}; the plan sweep runs at one device count: give "
                            "--devices N once")
        if not self.plans:
            problems.append("sweep plans: give at least one fixed plan")
        for plan in self.plans:
            try:
                spec = parse_plan(plan_argument(str(plan)))
            except ValueError as err:
                problems.append(str(err))
                continue
            if spec.kind == "auto":
                problems.append("sweep plans: 'auto' is not a fixed plan; the sweep runs it between the fixed plans "
                                "(--steps iterations)")
        repeated = checks.repeated([str(p).strip().lower() for p in self.plans])
        if repeated:
            problems.append(f"sweep plans: {repeated} given more than once")
        if not checks.is_count(self.steps_per_plan, PLAN_WARMUP + 1):
            problems.append(f"steps per plan: {self.steps_per_plan!r} must be an integer >= {PLAN_WARMUP + 1} "
                            f"(the first {PLAN_WARMUP} of each plan is warm-up)")
        if not self.budgets:
            problems.append("budgets: give at least one budget")
        for budget in self.budgets:
            problems += checks.problems_of(lambda budget=budget: check_budget(budget))
        if isinstance(self.bench.steps, int) and self.bench.steps <= self.auto_excluded:
            problems.append(f"steps: auto's first {self.auto_excluded} iterations are left out (the "
                            f"probe, the first step of its plan, warm-up); set steps > {self.auto_excluded}")
        checks.raise_problems("sweep: ", problems)
