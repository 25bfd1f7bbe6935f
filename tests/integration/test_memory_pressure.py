"""GPU memory pressure: memory taken by something else just before an update phase shrinks the device lane for that
step (demotion, logged as ``dos/demoted_subgroups``), never an OOM, and the plan comes back after. On the CPU tier the
host stands in for the device, so the ballast is a stand-in: the free memory the manager reads is 0 for one step."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_dos.update.manager import OptimizerStateManager
from tests.support.parity import shared_run, train

PRESSED = 2  # the update phase (0-based) before which the memory is taken


class _DosMetrics(pl.Callback):
    """``dos/*`` of each update phase, as DOSMetricsLogger sends them to the loggers."""

    def __init__(self) -> None:
        self.per_step: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.per_step.append(trainer.strategy.manager.metrics())


def test_a_step_without_free_memory_runs_on_the_host_and_the_plan_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}

    def free_device_bytes(self: OptimizerStateManager) -> int | None:
        calls["n"] += 1
        return 0 if calls["n"] == PRESSED + 1 else None  # None: no limit (the host stands in for the device)

    vanilla = shared_run(None, steps=6, clip=0.05)
    monkeypatch.setattr(OptimizerStateManager, "free_device_bytes", free_device_bytes)
    seen = _DosMetrics()
    run = train(0.5, steps=6, clip=0.05, every_step=seen)
    records = run.strategy.manager.records
    planned = set(records[0].plan.device_subgroups())
    assert planned and all(set(r.plan.device_subgroups()) == planned for i, r in enumerate(records) if i != PRESSED)
    assert set(records[PRESSED].demoted) == planned and not records[PRESSED].plan.device_subgroups()
    assert records[PRESSED].plan.source.endswith("+demoted")
    assert [m["dos/demoted_subgroups"] for m in seen.per_step] == [
        float(len(planned)) if i == PRESSED else 0.0 for i in range(6)]
    assert [m["dos/device_fraction"] == 0.0 for m in seen.per_step] == [i == PRESSED for i in range(6)]
    # the same arithmetic on either lane: the losses are vanilla's
    for a, b in zip(run.losses, vanilla.losses):
        assert abs(a - b) <= 1e-5 * abs(b)
