"""Telemetry through a real fit: dos/* metrics every update, the plan table at (re-)plans, lane timelines."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger

from lightning_dos.planning.auto import PROBE_STEPS
from lightning_dos.telemetry.callbacks import DOSMetricsLogger
from lightning_dos.telemetry.records import PLAN_TABLE_COLUMNS
from tests.support.parity import TinyLM, make_strategy, token_loader


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
    keys = set().union(*logger.metrics)
    for key in ("dos/device_fraction", "dos/update_ms", "dos/predicted_update_ms", "dos/replanned", "dos/trial",
                "dos/host_busy_ms", "dos/host_wait_ms", "dos/device_busy_ms", "dos/h2d_gb", "dos/d2h_gb"):
        assert key in keys, key
    # a table for the first update phase and for every re-plan (auto re-plans right after its probe steps)
    assert [r.replanned for r in manager.records[:PROBE_STEPS]] == [False] * (PROBE_STEPS - 1) + [True]
    expected = sum(1 for i, r in enumerate(manager.records) if i == 0 or r.replanned)
    assert len(logger.tables) == expected >= 1
    key, columns, rows, _ = logger.tables[-1]
    assert key == "dos/plan" and columns == PLAN_TABLE_COLUMNS
    assert [row[0] for row in rows] == list(range(len(manager.sizes)))
    assert [row[2] for row in rows] == manager.sizes
    # a timeline every 2nd update phase, as a matplotlib figure
    assert [k for k, _, _ in logger.images] == ["dos/timeline", "dos/timeline"]
    assert all(hasattr(images[0], "savefig") for _, images, _ in logger.images)
