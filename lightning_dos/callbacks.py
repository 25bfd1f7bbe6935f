"""Owns the callbacks the ``lightning-dos`` CLI adds to every run: the validation-loss report and DOS telemetry.

``ValLossReport`` answers "did it learn?" in one line at the end of fit. ``DOSMetricsLogger`` forwards the
``dos/*`` numbers the strategy's optimizer-state manager records for each update phase (device fraction,
lane timings, bytes moved) to Lightning's loggers, so they sit next to ``train/loss`` in CSV or W&B.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["DOSMetricsLogger", "ValLossReport", "default_callbacks"]


class ValLossReport(Callback):
    """Remembers the first and the last validation loss and prints both at the end of fit (rank zero).

    The sanity check before training counts as the first validation when it runs, because it measures the
    untrained model: "first" is then the starting point of the drop, not a value after some training.

    Args:
        monitor: The logged metric to report.
    """

    def __init__(self, monitor: str = "val/loss") -> None:
        self.monitor = monitor
        self.first: Optional[float] = None
        self.last: Optional[float] = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.first = self.last = None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_validation_end runs after the epoch-end metrics reached callback_metrics (on_validation_epoch_end
        # runs for callbacks before the module has logged)
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        loss = float(value)
        if not math.isfinite(loss):
            self.last = loss
            return
        if self.first is None:
            self.first = loss
        self.last = loss

    def summary(self) -> Optional[str]:
        """The report line, or None when no validation ran."""
        if self.first is None or self.last is None:
            return None
        dropped = self.first - self.last
        change = f"dropped {dropped:.2f}" if dropped >= 0 else f"rose {-dropped:.2f}"
        name = self.monitor.replace("val/", "validation ").replace("_", " ")
        return f"{name}: first {self.first:.2f} -> last {self.last:.2f} ({change})"

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        line = self.summary()
        if line is not None and trainer.is_global_zero:
            print(line, flush=True)


class DOSMetricsLogger(Callback):
    """Logs the strategy manager's ``dos/*`` metrics after every update phase (``on_step``), and to loggers that
    take them (W&B), the plan table at every (re-)plan and a lane-timeline image every ``timeline_every_n`` phases.

    Works with any strategy: it does nothing unless ``trainer.strategy.manager.metrics()`` exists and
    returns values. Under gradient accumulation a phase runs every few batches; each phase is logged once.

    Args:
        timeline_every_n: log a timeline image of every n-th update phase (0: never).
    """

    def __init__(self, timeline_every_n: int = 100) -> None:
        if timeline_every_n < 0:
            raise ValueError(f"timeline_every_n: {timeline_every_n} is negative; set 0 (never) or a number of phases")
        self.timeline_every_n = timeline_every_n
        self._logged_phases = -1

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        manager = getattr(trainer.strategy, "manager", None)
        metrics_fn = getattr(manager, "metrics", None)
        if not callable(metrics_fn):
            return
        records = getattr(manager, "records", None)
        if records is not None:
            if len(records) == self._logged_phases:
                return  # no update phase since the last log (accumulating gradients)
            self._logged_phases = len(records)
        metrics = {key: float(value) for key, value in (metrics_fn() or {}).items()}
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)
        if records and getattr(trainer, "is_global_zero", True):
            self._log_media(trainer, manager, records)

    def _log_media(self, trainer: pl.Trainer, manager: Any, records: list) -> None:
        """Plan table at the first phase and at every re-plan; timeline image every n-th phase (W&B only)."""
        from lightning_dos.telemetry import PLAN_TABLE_COLUMNS, plan_table_rows, timeline_figure

        loggers = [lg for lg in getattr(trainer, "loggers", []) if hasattr(lg, "log_table") or hasattr(lg, "log_image")]
        if not loggers:
            return
        record = records[-1]
        step = trainer.global_step
        if len(records) == 1 or getattr(record, "replanned", False):
            rows = plan_table_rows(manager.base_plan, manager.sizes, manager.cost)
            for lg in loggers:
                if hasattr(lg, "log_table"):
                    lg.log_table(key="dos/plan", columns=PLAN_TABLE_COLUMNS, data=rows, step=step)
        if self.timeline_every_n and len(records) % self.timeline_every_n == 0:
            import matplotlib.pyplot as plt

            fig = timeline_figure(record)
            try:
                for lg in loggers:
                    if hasattr(lg, "log_image"):
                        lg.log_image(key="dos/timeline", images=[fig], step=step)
            finally:
                plt.close(fig)


def default_callbacks() -> list[Callback]:
    """The callbacks every CLI run gets (unless the config already has one of the same type)."""
    return [ValLossReport(), DOSMetricsLogger()]
