"""Owns the plan sweep's settings: the fixed plans, iterations per plan, the memory budgets (:class:`Budget`), the
order a budget's process runs them in (:func:`sweep_schedule`) and that process as a run, with no torch import.

A budget's process runs every fixed plan for ``steps_per_plan`` iterations and ``auto`` (started cold, with its own
calibration) for ``auto_steps``, interleaved: the host's speed drifts by over 10% in tens of seconds, and plans held in
turn each met another spell of it. A budget is ``unlimited``, ``quarter`` (:func:`resolve_budget`) or a number of GiB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_dos.bench.rows import Row, make_run
from lightning_dos.bench.settings import STRATEGY_ARG, Run, is_count
from lightning_dos.planning.placement import GIB

#: Fixed plans swept by default: fractions 0.0-1.0 by 0.1, then stride:2..6.
DEFAULT_SWEEP_PLANS = tuple(f"{k / 10:.1f}" for k in range(11)) + tuple(f"stride:{k}" for k in range(2, 7))
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


def plan_argument(plan: str) -> str | float | list[str]:
    """The DOS ``plan`` argument for a plan as given: ``"0.5"`` -> 0.5, ``"host,device"`` -> a list of lanes."""
    text = plan.strip()
    if "," in text:
        return [part.strip() for part in text.split(",")]
    try:
        return float(text)
    except ValueError:
        return text


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

    name: str  # as given: ``unlimited``, ``quarter`` or a number of GiB
    gib: float | None  # the DOS ``memory_budget_gib`` it stands for; None: no limit beyond the free device memory

    @property
    def label(self) -> str:
        """E.g. ``unlimited``, ``quarter (7.81 GiB)``, ``12 GiB``."""
        if self.gib is None:
            return self.name
        return f"quarter ({self.gib:.2f} GiB)" if self.name == "quarter" else f"{self.gib:g} GiB"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gib": self.gib, "label": self.label}


def check_budget(text: str) -> str:
    """``text`` normalised (``unlimited``, ``quarter`` or a number of GiB); ``ValueError`` for anything else."""
    value = str(text).strip().lower()
    if value in ("unlimited", "quarter"):
        return value
    try:
        gib = float(value)
    except ValueError:
        raise ValueError(f"--budgets: {text!r} is not a budget; use unlimited, quarter or a number of GiB") from None
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"--budgets: {text!r} must be a number of GiB >= 0")
    return f"{gib:g}"


def resolve_budget(text: str, params: int | None, ranks: int = 1) -> Budget:
    """The budget ``text`` for a model of ``params`` parameters partitioned over ``ranks`` (a budget is per rank, as
    ``memory_budget_gib`` is: ``quarter`` is a quarter of one rank's share of the optimizer state)."""
    name = check_budget(text)
    if name == "unlimited":
        return Budget(name, None)
    if name == "quarter":
        if not params:
            raise ValueError("--budgets quarter needs the model's parameter count, which only the GPT's is known to "
                             "the bench; give the budget in GiB")
        return Budget(name, QUARTER_SHARE * STATE_BYTES_PER_PARAM * params / ranks / GIB)
    return Budget(name, float(name))


@dataclass
class SweepSettings:
    """What a plan sweep runs: per budget, the fixed plans in rounds and ``auto_steps`` iterations of ``auto``."""

    plans: list[str] = field(default_factory=lambda: list(DEFAULT_SWEEP_PLANS))  # fixed plans, in the order run
    steps_per_plan: int = 3  # rounds: iterations of each fixed plan, the first left out
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))  # one process each
    auto_steps: int = 10  # iterations of auto (--steps)
    warmup: int = 3  # auto's leading iterations left out (--warmup), at least AUTO_MIN_EXCLUDED

    @property
    def process_steps(self) -> int:
        """Iterations of one budget's process: the fixed plans' and ``auto``'s."""
        return len(self.plans) * self.steps_per_plan + self.auto_steps

    @property
    def auto_excluded(self) -> int:
        return max(self.warmup, AUTO_MIN_EXCLUDED)

    def to_dict(self) -> dict[str, Any]:
        return {"plans": list(self.plans), "steps_per_plan": self.steps_per_plan, "plan_warmup": PLAN_WARMUP,
                "budgets": list(self.budgets), "auto_steps": self.auto_steps, "auto_excluded": self.auto_excluded}

    def run(self, budget: Budget, overrides: list[tuple[str, Any]], devices: int) -> Run:
        """The process of ``budget``: DOS from the first plan (the sweep switches from there), serial (overlapped, an
        update phase would be recorded one iteration late, under the next plan), with no subgroup resident (a plan
        places every subgroup), every iteration synchronised (its figures are update phases, by iteration)."""
        args = {"plan": plan_argument(self.plans[0]), "overlap": False, "resident_gib": 0,
                "memory_budget_gib": budget.gib}
        row = Row(f"sweep[{budget.name}]", "dos_auto", "deep_optimizer_states",
                  {STRATEGY_ARG + key: value for key, value in args.items()})
        run = make_run(row, overrides, devices=devices, steps=self.process_steps, warmup=PLAN_WARMUP, e2e_steps=0)
        run.plan = self.plans[0]
        run.extra = {"sweep": {"plans": list(self.plans), "steps_per_plan": self.steps_per_plan,
                               "auto_steps": self.auto_steps}}
        return run

    def problems(self) -> list[str]:
        """Every setting the sweep cannot run."""
        from lightning_dos.planning.plan import parse_plan

        problems = [] if self.plans else ["--plans: give at least one fixed plan"]
        for plan in self.plans:
            try:
                if parse_plan(plan_argument(str(plan))).kind == "auto":
                    problems.append("--plans: auto is not a fixed plan; the sweep runs it between them (--steps)")
            except ValueError as err:
                problems.append(f"--plans: {err}")
        if len({str(p).strip().lower() for p in self.plans}) < len(self.plans):
            problems.append("--plans: a plan given more than once")
        if not is_count(self.steps_per_plan, PLAN_WARMUP + 1):
            problems.append(f"--steps-per-plan {self.steps_per_plan!r} must be >= {PLAN_WARMUP + 1} (the first of "
                            "each plan is warm-up)")
        for budget in self.budgets or ["(none)"]:
            try:
                check_budget(budget)
            except ValueError as err:
                problems.append(str(err))
        if self.auto_steps <= self.auto_excluded:
            problems.append(f"--steps: auto's first {self.auto_excluded} iterations are left out (its probe, the "
                            f"first step of its plan, warm-up); set --steps above {self.auto_excluded}")
        return problems
