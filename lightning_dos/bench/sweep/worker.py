"""Owns a plan sweep's worker process: the callback that switches the DOS plan every iteration and records what ran.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_dos.bench import ranks
from lightning_dos.bench.measure import dos_records, failure, fit_and_measure, record_dict
from lightning_dos.bench.results import write_json
from lightning_dos.bench.settings import Run
from lightning_dos.bench.sweep.config import AUTO, PROGRESS_FILE, plan_argument, sweep_schedule
from lightning_dos.planning.plan import Plan, parse_plan, resolve_plan


class PlanSweep(pl.Callback):
    """Runs each of ``plans`` for ``steps_per_plan`` iterations, in rounds, and records what each one did.

    It sets the manager's plan at every batch's start (before the backward, so the device lane's gradients stay on the
    device) and keeps the update records of each iteration under the plan that ran. The fixed plans share one planning
    state; ``auto``'s ``auto_steps`` iterations (:func:`~lightning_dos.bench.sweep.config.sweep_schedule`) start cold
    and keep their own, so ``auto`` learns only from its own update phases. ``progress_path``: where the records so
    far go after every iteration."""

    def __init__(self, plans: Sequence[str], steps_per_plan: int,
                 progress_path: str | Path | None = None, auto_steps: int = 0) -> None:
        if not plans or steps_per_plan < 1 or auto_steps < 0:
            raise ValueError(f"plan sweep: {len(plans)} plans, steps_per_plan {steps_per_plan} (>= 1), auto_steps "
                             f"{auto_steps} (>= 0)")
        self.plans = [str(plan).strip() for plan in plans]
        self.specs = [parse_plan(plan_argument(plan)) for plan in self.plans]
        if any(spec.kind == "auto" for spec in self.specs):
            raise ValueError("plan sweep: 'auto' is not a fixed plan (it probes and re-plans); set auto_steps to "
                             "run it between the fixed plans")
        self.steps_per_plan, self.auto_steps = steps_per_plan, auto_steps
        self.schedule = sweep_schedule(self.plans, steps_per_plan, auto_steps)
        self.progress_path = None if progress_path is None else Path(progress_path)
        self.resolved: list[Plan] = []
        self.iterations: list[dict[str, Any]] = []
        self._first_record = 0
        self._fixed_state: Any = None  # the manager's planning state for the fixed plans, while auto runs
        self._auto_state: Any = None  # auto's, while a fixed plan runs (None: auto has not started)
        self._in_auto = False

    @property
    def total_steps(self) -> int:
        """Iterations of the whole sweep: the fixed plans' and ``auto``'s (the length of its schedule)."""
        return len(self.schedule)

    @property
    def current_plan(self) -> str | None:
        """The plan of the iteration that started last, or None before the first."""
        return self.iterations[-1]["plan"] if self.iterations else None

    @staticmethod
    def _manager(trainer: pl.Trainer) -> Any:
        manager = getattr(trainer.strategy, "manager", None)
        if manager is None:
            raise RuntimeError("plan sweep: the strategy has no optimizer-state manager; run the sweep under "
                               "strategy='deep_optimizer_states'")
        if not manager.active:
            raise RuntimeError("plan sweep: the interleaved update is not active for this configuration (DeepSpeed's "
                               "own host-only update runs), so fixed plans cannot be compared")
        return manager

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        from lightning_dos.update.manager import DEFAULT_BUFFERS

        manager = self._manager(trainer)
        if not self.resolved:  # subgroup sizes are known once the engine exists
            buffers = manager.buffers or DEFAULT_BUFFERS
            self.resolved = [resolve_plan(spec, manager.sizes, buffers=buffers) for spec in self.specs]
        iteration = len(self.iterations)
        self._first_record = len(manager.records)
        name = self.schedule[min(iteration, len(self.schedule) - 1)]  # AUTO for auto's; the last one past the end
        if name == AUTO:
            if not self._in_auto:  # where auto left off (cold the first time), the fixed plans' state set aside
                self._fixed_state = manager.swap_planning(self._auto_state)
                self._in_auto = True
            plan, index = manager.plans.in_force, None
        else:
            if self._in_auto:
                self._auto_state = manager.swap_planning(self._fixed_state)
                self._in_auto = False
            index = self.plans.index(name)
            plan = self.resolved[index]
            manager.set_plan(plan)  # every iteration: whatever ran before, this iteration runs this plan
        self.iterations.append({
            "iteration": iteration,
            "plan": name,
            "plan_index": index,
            "step_in_plan": sum(it["plan"] == name for it in self.iterations),
            "lanes": plan.lane_letters(),
            "device_fraction": plan.device_fraction(manager.sizes),
            "records": [],
        })

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        manager = self._manager(trainer)
        entry = self.iterations[-1]
        entry["records"] = [record_dict(record) for record in manager.records[self._first_record:]]
        if self.progress_path is not None:
            write_json(self.progress_path, self.raw())

    def raw(self) -> dict[str, Any]:
        """What the sweep ran so far, JSON-serialisable: the plans, their lanes, and every iteration's records."""
        return {
            "plans": list(self.plans),
            "steps_per_plan": self.steps_per_plan,
            "auto_steps": self.auto_steps,
            "resolved": [{"plan": name, "lanes": plan.lane_letters(), "buffers": plan.buffers, "source": plan.source}
                         for name, plan in zip(self.plans, self.resolved)],
            "iterations": copy.deepcopy(self.iterations),
        }


def slowest_rank(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One sweep from every rank's (:meth:`PlanSweep.raw`, in rank order): each iteration with the update records of
    the rank whose update phase took longest (the ranks meet at the next collective, so the slowest sets the pace),
    and that rank under ``rank``. One rank's is returned as it is."""
    if len(per_rank) == 1:
        return per_rank[0]
    merged = copy.deepcopy(per_rank[0])
    for index, iteration in enumerate(merged["iterations"]):
        took = [sum(r["update_ms"] for r in sweep["iterations"][index]["records"]) for sweep in per_rank]
        rank = max(range(len(per_rank)), key=took.__getitem__)
        iteration.update(records=copy.deepcopy(per_rank[rank]["iterations"][index]["records"]), rank=rank)
    return merged


def execute_sweep(payload: dict[str, Any], spec: Run, workdir: Path) -> dict[str, Any]:
    """Train every plan of ``payload``'s sweep in turn and return the raw measurements; a failure still reports the
    plans measured before it and the plan in force."""
    settings = spec.extra["sweep"]
    progress = workdir / PROGRESS_FILE if ranks.process_rank() == 0 else None  # one writer on several ranks
    sweep = PlanSweep(list(settings["plans"]), int(settings["steps_per_plan"]), progress_path=progress,
                      auto_steps=int(settings.get("auto_steps", 0)))
    strategies: list[Any] = []  # the strategy once built, to report its records should training fail
    try:
        if spec.steps != sweep.total_steps:
            raise ValueError(f"steps: {spec.steps} does not hold {len(sweep.plans)} plans for {sweep.steps_per_plan} "
                             f"iterations each and {sweep.auto_steps} of auto ({sweep.total_steps})")
        trainer, result = fit_and_measure(payload, spec, callbacks=[sweep], on_strategy=strategies.append)
        gathered = ranks.gather_to_rank0({"rank": trainer.global_rank, "sweep": sweep.raw()})
        per_rank = [entry["sweep"] for entry in gathered]
        return {**result, "sweep": slowest_rank(per_rank), "sweep_per_rank": per_rank if len(per_rank) > 1 else None,
                "failed_plan": None, "dos": dos_records(trainer.strategy)}
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        return {**failure(spec, err), "sweep": sweep.raw(), "failed_plan": sweep.current_plan,
                "dos": dos_records(strategies[0]) if strategies else None}
