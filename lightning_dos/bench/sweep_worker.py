"""Owns one sweep process: ``python -m lightning_dos.bench.sweep_worker CONFIG RESULT``.

Reads the bench settings, the configuration (``deep_optimizer_states`` with the sweep's first plan) and the
sweep (``{"plans": [...], "steps_per_plan": N, "auto_steps": A}``) from ``CONFIG``, trains ``len(plans) x N``
iterations of the fixed plans in rounds and ``A`` of ``auto`` (started cold) between them, with a
:class:`~lightning_dos.bench.sweep.PlanSweep` switching the plan, and writes the raw measurements to ``RESULT``:
every iteration's plan and DOS update records, phase times, peak memory. The model, data, strategy and Trainer
are built exactly as for a bench configuration (:mod:`lightning_dos.bench.worker`). A failure is written as a
result too, with what was measured before it and the plan in force when it happened; the records so far also go
to ``progress.json`` beside ``CONFIG`` after every iteration, for a run stopped from outside.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import BenchConfig, RunSpec
from lightning_dos.bench.worker import dos_records, exit_now, failure, fit_and_measure, serve

PROGRESS_FILE = "progress.json"


class SweepRun:
    """The parts of one sweep process, kept so that a failure can still report what was measured."""

    def __init__(self, plans: list[str], steps_per_plan: int, workdir: Path, auto_steps: int = 0) -> None:
        from lightning_dos.bench.sweep import PlanSweep

        self.sweep = PlanSweep(plans, steps_per_plan, progress_path=workdir / PROGRESS_FILE, auto_steps=auto_steps)
        self.strategy: Any = None

    def partial(self) -> dict[str, Any]:
        """What ran before a failure: the sweep's records and the plan in force."""
        return {"sweep": self.sweep.raw(), "failed_plan": self.sweep.current_plan,
                "dos": dos_records(self.strategy) if self.strategy is not None else None}


def run(config: BenchConfig, spec: RunSpec, state: SweepRun, workdir: Path) -> dict[str, Any]:
    """Train every plan of the sweep in turn and return the raw measurements."""
    sweep = state.sweep
    if config.steps != sweep.total_steps:
        raise ValueError(f"steps: {config.steps} does not hold {len(sweep.plans)} plans for {sweep.steps_per_plan} "
                         f"iterations each and {sweep.auto_steps} of auto ({sweep.total_steps})")

    def keep(strategy: Any) -> None:
        state.strategy = strategy

    trainer, result = fit_and_measure(config, spec, workdir, callbacks=[sweep], on_strategy=keep)
    return {**result, "sweep": sweep.raw(), "failed_plan": None, "dos": dos_records(trainer.strategy)}


def execute(payload: dict[str, Any], spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """The sweep of ``payload``; a failure still reports the plans measured before it."""
    config = BenchConfig.from_dict(payload["bench"])
    settings = payload["sweep"]
    state = SweepRun(list(settings["plans"]), int(settings["steps_per_plan"]), workdir,
                     auto_steps=int(settings.get("auto_steps", 0)))
    try:
        return run(config, spec, state, workdir)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        return {**failure(spec, err), **state.partial()}


def main(argv: list[str] | None = None) -> int:
    """Run the sweep in ``argv[0]`` and write its result to ``argv[1]``; 0 when every plan ran."""
    return serve(argv, "lightning_dos.bench.sweep_worker", execute)


if __name__ == "__main__":
    exit_now(main())
