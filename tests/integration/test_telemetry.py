"""Telemetry through a real fit: dos/* metrics every update, the plan table at (re-)plans, lane timelines."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger

from lightning_dos.planning.auto import PROBE_STEPS
from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.telemetry.callbacks import DOSMetricsLogger
from lightning_dos.telemetry.records import PLAN_TABLE_COLUMNS
from tests.support.parity import TinyLM, make_strategy, token_loader
from tests.support.update_records import logged, phase_keys, record_metrics


class RecordingLogger(Logger):
    """A logger with W&B's table/image methods that only records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []
        self.tables: list[tuple[str, list, list, int]] = []
        self.images: list[tuple[str, list, int]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append(dict(metrics))

    def log_table(self, key: str, columns: list, data: list, step: int | None = None) -> None:
        self.tables.append((key, columns, data, step))

    def log_image(self, key: str, images: list, step: int | None = None) -> None:
        self.images.append((key, images, step))


def test_auto_run_logs_metrics_plan_tables_and_timelines() -> None:
    logger = RecordingLogger()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=make_strategy("auto"), max_steps=4, logger=logger,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[DOSMetricsLogger(timeline_every_n=2)],
    )
    trainer.fit(TinyLM(), train_dataloaders=token_loader(4))
    manager = trainer.strategy.manager
    # one dos/* log per update phase, saying what the manager recorded of that phase
    phases = [{k: v for k, v in m.items() if k.startswith("dos/")} for m in logger.metrics
              if any(k.startswith("dos/") for k in m)]
    assert len(phases) == len(manager.records) == 4
    for logged_phase, record in zip(phases, manager.records):
        assert phase_keys(logged_phase) == logged(record_metrics(record))  # no key more, none less
    assert phases[-1] == logged(manager.metrics())  # the last one: every key, the manager-wide ones too
    assert [p["dos/replanned"] for p in phases] == [float(r.replanned) for r in manager.records]
    # a table for the first update phase and for every re-plan (auto re-plans right after its probe steps)
    assert [r.replanned for r in manager.records[:PROBE_STEPS]] == [False] * (PROBE_STEPS - 1) + [True]
    expected = sum(1 for i, r in enumerate(manager.records) if i == 0 or r.replanned)
    assert len(logger.tables) == expected >= 1
    key, columns, rows, _ = logger.tables[-1]
    assert key == "dos/plan" and columns == PLAN_TABLE_COLUMNS
    assert [row[0] for row in rows] == list(range(len(manager.sizes)))
    assert [row[1] for row in rows] == [lane.value for lane in manager.plans.in_force.lanes]  # the plan put in force
    assert [row[2] for row in rows] == manager.sizes
    # a timeline every 2nd update phase, as a matplotlib figure
    assert [k for k, _, _ in logger.images] == ["dos/timeline", "dos/timeline"]
    assert all(hasattr(images[0], "savefig") for _, images, _ in logger.images)


class _PlanPerStep(pl.Callback):
    """Puts ``plans[i]`` in force before step ``i`` (lanes as letters)."""

    def __init__(self, plans: list[str]) -> None:
        self.plans = plans

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, idx: int) -> None:
        lanes = tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in self.plans[idx])
        trainer.strategy.manager.set_plan(Plan(lanes=lanes, buffers=2, source="test"))


def test_a_phase_logs_only_its_own_keys() -> None:
    """A host-only phase after phases with a device lane: its row has no device-lane rate (an earlier phase's value
    logged again would say the link moved bytes it did not), and a device-only phase has no CPU Adam rate."""
    logger = RecordingLogger()
    plans = ["HDHDH", "HHHHH", "DDDDD", "HHHHH"]
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=make_strategy(0.5), max_steps=len(plans),
        logger=logger, log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[_PlanPerStep(plans), DOSMetricsLogger(timeline_every_n=0)],
    )
    trainer.fit(TinyLM(), train_dataloaders=token_loader(len(plans)))
    manager = trainer.strategy.manager
    assert ["".join(lane.letter for lane in r.plan.lanes) for r in manager.records] == plans
    phases = [phase_keys(m) for m in logger.metrics if any(k.startswith("dos/") for k in m)]
    assert len(phases) == len(plans)
    for logged_phase, record in zip(phases, manager.records):
        assert logged_phase == logged(record_metrics(record))
    assert ["dos/d2h_gb_per_s" in p for p in phases] == [True, False, True, False]
    assert ["dos/cpu_adam_gparam_s" in p for p in phases] == [True, True, False, True]
