"""Owns switching DOS plans inside one training run, and which update records belong to which plan.

:class:`PlanSweep` is a Lightning callback for a run under ``deep_optimizer_states``: it holds each plan of a
list for ``steps_per_plan`` iterations, setting the manager's plan in ``on_train_batch_start`` (before that
iteration's backward, so the device lane's gradients stay on the device as the plan says), and collects the
manager's update records of every iteration under the plan that ran. The manager's calibrator keeps learning
across plans: each prediction is made just before its update phase from everything measured so far.

After the fixed plans it can run ``auto`` for ``auto_steps`` iterations in the same process, started cold (the
manager's :meth:`~lightning_dos.manager.OptimizerStateManager.start_auto`: starting cost values, then the probe),
so that ``auto`` and the plans it is compared with share the process, its memory placement and its warm state.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_dos.bench.config import plan_argument
from lightning_dos.planning.plan import Plan, parse_plan, resolve_plan


class PlanSweep(pl.Callback):
    """Holds each of ``plans`` for ``steps_per_plan`` iterations, in order, and records what each one did.

    Args:
        plans: fixed plans as on the command line: ``host``, ``device``, a fraction, ``stride:K`` or lanes
            joined by commas. ``auto`` is refused: it re-plans by itself.
        steps_per_plan: iterations each plan is held for.
        progress_path: if set, the raw records so far are written there (JSON) after every iteration, so a
            run that is stopped from outside still leaves what it measured.
        auto_steps: iterations of ``auto`` after the last fixed plan, started cold (0: none).
    """

    def __init__(self, plans: Sequence[str], steps_per_plan: int,
                 progress_path: str | Path | None = None, auto_steps: int = 0) -> None:
        if not plans:
            raise ValueError("plan sweep: give at least one plan")
        if isinstance(steps_per_plan, bool) or not isinstance(steps_per_plan, int) or steps_per_plan < 1:
            raise ValueError(f"plan sweep: steps_per_plan {steps_per_plan!r} must be an integer >= 1")
        self.plans = [str(plan).strip() for plan in plans]
        self.specs = [parse_plan(plan_argument(plan)) for plan in self.plans]
        if any(spec.kind == "auto" for spec in self.specs):
            raise ValueError("plan sweep: 'auto' is not a fixed plan; run it on its own (it probes and re-plans)")
        self.steps_per_plan = steps_per_plan
        if isinstance(auto_steps, bool) or not isinstance(auto_steps, int) or auto_steps < 0:
            raise ValueError(f"plan sweep: auto_steps {auto_steps!r} must be an integer >= 0")
        self.auto_steps = auto_steps
        self.progress_path = None if progress_path is None else Path(progress_path)
        self.resolved: list[Plan] = []
        self.iterations: list[dict[str, Any]] = []
        self._first_record = 0

    @property
    def fixed_steps(self) -> int:
        """Iterations needed to hold every fixed plan for ``steps_per_plan`` iterations."""
        return len(self.plans) * self.steps_per_plan

    @property
    def total_steps(self) -> int:
        """Iterations of the whole sweep: the fixed plans, then ``auto``."""
        return self.fixed_steps + self.auto_steps

    def plan_index(self, iteration: int) -> int:
        """Index into :attr:`plans` of the plan held at ``iteration`` (from 0); the last one past the end."""
        return min(iteration // self.steps_per_plan, len(self.plans) - 1)

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

    def _resolve(self, manager: Any) -> list[Plan]:
        from lightning_dos.manager import DEFAULT_BUFFERS

        buffers = manager.buffers or DEFAULT_BUFFERS
        return [resolve_plan(spec, manager.sizes, buffers=buffers) for spec in self.specs]

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        manager = self._manager(trainer)
        if not self.resolved:  # subgroup sizes are known once the engine exists
            self.resolved = self._resolve(manager)
        iteration = len(self.iterations)
        self._first_record = len(manager.records)
        if self.auto_steps and iteration >= self.fixed_steps:
            if iteration == self.fixed_steps:
                manager.start_auto()  # cold: starting cost values, then the probe, as a new run
            plan = manager.base_plan
            self.iterations.append({
                "iteration": iteration,
                "plan": "auto",
                "plan_index": None,
                "step_in_plan": iteration - self.fixed_steps,
                "lanes": plan.lane_letters(),
                "device_fraction": plan.device_fraction(manager.sizes),
                "records": [],
            })
            return
        index = self.plan_index(iteration)
        plan = self.resolved[index]
        manager.set_plan(plan)  # every iteration: whatever ran before, this iteration runs this plan
        self.iterations.append({
            "iteration": iteration,
            "plan": self.plans[index],
            "plan_index": index,
            "step_in_plan": iteration - index * self.steps_per_plan,
            "lanes": plan.lane_letters(),
            "device_fraction": plan.device_fraction(manager.sizes),
            "records": [],
        })

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        from lightning_dos.bench.worker import record_dict, write_json

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
