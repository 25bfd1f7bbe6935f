"""Owns the callbacks the ``lightning-dos`` CLI adds to every run: the validation-loss report, the ``perf/*``
metrics every strategy logs, the stop at a non-finite loss, and DOS telemetry.

``ValLossReport`` answers "did it learn?" in one line at the end of fit. ``PerfMetrics`` logs iteration
time, throughput and peak memory under any strategy (vanilla Lightning included), so runs of different
strategies overlay on the same charts. ``DOSMetricsLogger`` forwards the ``dos/*`` numbers the strategy's
optimizer-state manager records for each update phase (device fraction, lane timings, bytes moved) to
Lightning's loggers, so they sit next to ``train/loss`` in CSV or W&B.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dos.planning.placement import GIB
from lightning_dos.telemetry.peak_memory import ru_maxrss_bytes
from lightning_dos.update.host_memory import read_meminfo

__all__ = ["DOSMetricsLogger", "NonFiniteLossGuard", "PerfMetrics", "ValLossReport", "batch_tokens",
           "default_callbacks", "host_in_use_gib", "peak_host_gib"]



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


def _input_tensor(batch: Any) -> Optional[torch.Tensor]:
    """The batch's input: the batch itself, its first element, or a mapping's ``input_ids`` (else first value)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        if "input_ids" in batch:
            return _input_tensor(batch["input_ids"])
        return next((found for found in map(_input_tensor, batch.values()) if found is not None), None)
    if isinstance(batch, (list, tuple)) and batch:
        return _input_tensor(batch[0])
    return None


def batch_tokens(batch: Any) -> tuple[int, Optional[int]]:
    """``(tokens, seq_len)`` of a batch on this rank: ``B * T`` and ``T`` of a ``[B, T, ...]`` input tensor,
    ``(B, None)`` of a 1-D one, ``(0, None)`` when the batch holds no tensor."""
    x = _input_tensor(batch)
    if x is None or x.dim() == 0:
        return 0, None
    if x.dim() == 1:
        return int(x.shape[0]), None
    return int(x.shape[0] * x.shape[1]), int(x.shape[1])


def _precision_dtype(precision: str) -> torch.dtype:
    """The matmul dtype behind a Lightning precision string such as ``"bf16-mixed"``."""
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


def peak_host_gib() -> float:
    """Peak resident set size of this process so far (the kernel's ``ru_maxrss``), in GiB."""
    return ru_maxrss_bytes() / GIB


def host_in_use_gib(meminfo: str = "/proc/meminfo") -> Optional[float]:
    """Memory in use on the whole host now (``MemTotal - MemAvailable``), in GiB; None where there is no meminfo.

    Page-locked buffers the CUDA driver allocates (``cudaHostAlloc``, what torch's ``pin_memory`` uses, e.g.
    DeepSpeed's pinned gradient buffers) are not in a process's resident set: measured at 5.37B parameters, 45 GiB
    of them showed as shared memory beside a 67 GiB RSS. This figure counts them (and any other process's memory).
    """
    reading = read_meminfo(meminfo)
    return None if reading is None else (reading[0] - reading[1]) / GIB


class PerfMetrics(Callback):
    """Logs ``perf/*`` after every training batch, under any strategy (nothing here assumes DeepSpeed):

    - ``perf/iteration_ms``: wall time since the previous training batch ended (forward, backward, optimizer
      step and the data loading between). No CUDA synchronisation is added: the host may run a little ahead
      of the GPU, so single values jitter, but the mean over many batches is the true rate. The first batch
      after fit start, a validation or an epoch turnover is not timed (the gap is not training).
    - ``perf/tokens_per_s``: tokens in the batch (``B * T`` of its input tensor, see :func:`batch_tokens`) times
      the world size, over the iteration time.
    - ``perf/tflops_per_s`` and ``perf/mfu``: when the LightningModule has ``flops_per_token(seq_len) -> float``
      (training FLOPs per token, e.g. :class:`~lightning_dos.models.GPTModule`); MFU also needs the device's peak
      FLOP/s: ``peak_flops`` here, else the module's ``peak_flops`` attribute, else Lightning's table of GPUs
      (none on a CPU, so no MFU there).
    - ``perf/peak_gpu_gib``: ``torch.cuda.max_memory_allocated`` of the root device, peak of the process so far;
      only when training on a CUDA device (a CPU run has no GPU memory to report; it logs nothing rather than 0).
    - ``perf/peak_host_gib``: peak resident set size of the process so far (``ru_maxrss``). It includes memory pinned
      in place (``cudaHostRegister``: DOS's optimizer state) but not buffers the CUDA driver allocates page-locked
      (``cudaHostAlloc``), which ``perf/host_in_use_gib`` counts.
    - ``perf/host_in_use_gib``: memory in use on the whole host at this step (``MemTotal - MemAvailable``; Linux).

    Values are rank zero's (only its loggers write); nothing is reduced across ranks, so no collective is added.
    They go straight to the loggers at Lightning's cadence (``log_every_n_steps``, the step Lightning logs
    ``train/loss`` at), as Lightning's own ``LearningRateMonitor`` does, not through ``self.log``: a value
    ``self.log``-ged at one step is logged again at every later step of the epoch that does not log it, which
    would copy an iteration time into the batches that are not timed.

    Args:
        peak_flops: Peak FLOP/s of one device for MFU; None looks it up (see above).
    """

    def __init__(self, peak_flops: Optional[float] = None) -> None:
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(f"peak_flops: {peak_flops} is not a FLOP/s figure; set a positive number or null")
        self.peak_flops = peak_flops
        self._peak: Optional[float] = peak_flops
        self._last_end: Optional[float] = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = None
        self._peak = self.peak_flops or getattr(pl_module, "peak_flops", None)
        if self._peak is None and getattr(pl_module, "device", torch.device("cpu")).type == "cuda":
            self._peak = get_available_flops(pl_module.device, _precision_dtype(str(trainer.precision)))

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = None  # the epoch turnover is not training time

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = None  # nor is validation

    def measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, now: float) -> dict[str, float]:
        """The ``perf/*`` values of the batch that ended at ``now`` (``time.perf_counter()``)."""
        last, self._last_end = self._last_end, now
        metrics: dict[str, float] = {}
        if last is not None and now > last:
            seconds = now - last
            metrics["perf/iteration_ms"] = seconds * 1e3
            tokens, seq_len = batch_tokens(batch)
            if tokens:
                tokens_per_s = tokens * trainer.world_size / seconds
                metrics["perf/tokens_per_s"] = tokens_per_s
                flops_fn = getattr(pl_module, "flops_per_token", None)
                if callable(flops_fn) and seq_len:
                    flops_per_s = tokens_per_s * float(flops_fn(seq_len))
                    metrics["perf/tflops_per_s"] = flops_per_s / 1e12
                    if self._peak:
                        metrics["perf/mfu"] = flops_per_s / (self._peak * trainer.world_size)
        device = getattr(pl_module, "device", torch.device("cpu"))
        if device.type == "cuda":
            metrics["perf/peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        metrics["perf/peak_host_gib"] = peak_host_gib()
        in_use = host_in_use_gib()
        if in_use is not None:
            metrics["perf/host_in_use_gib"] = in_use
        return metrics

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = self.measure(trainer, pl_module, batch, time.perf_counter())
        connector = trainer._logger_connector
        if connector.should_update_logs:
            connector.log_metrics(metrics)  # at the step of this batch's train/loss, with its epoch


class DOSMetricsLogger(Callback):
    """Logs the strategy manager's ``dos/*`` metrics of each update phase to the loggers, at the steps Lightning logs
    (``log_every_n_steps``), each row holding that phase's keys alone; and to loggers that take them (W&B), the plan
    table at every (re-)plan and a lane-timeline image every ``timeline_every_n`` phases.

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
        # straight to the loggers, at the steps Lightning logs (``log_every_n_steps``): through ``self.log`` a key this
        # phase lacks (``dos/d2h_gb_per_s`` without a device lane) would be logged again with an earlier phase's value
        connector = trainer._logger_connector
        self._log_new_phase(trainer, connector.log_metrics if connector.should_update_logs or trainer.fast_dev_run
                            else None)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """With ``overlap`` each phase is recorded when the next step joins it, so the last one is joined and
        recorded only now: log it (the loop's logging is over, so straight to the loggers, a step after the last)."""
        wait = getattr(trainer.strategy, "wait_for_update", None)
        if callable(wait):
            wait()
        self._log_new_phase(trainer, trainer._logger_connector.log_metrics)

    def _log_new_phase(self, trainer: pl.Trainer, log: Optional[Callable[[dict[str, float]], Any]]) -> None:
        """Log the manager's last record through ``log`` (None: not at this step) if an update phase was recorded
        since the last call, and its media; nothing under a strategy without a manager."""
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
        if metrics and log is not None:
            log(metrics)
        if records and getattr(trainer, "is_global_zero", True):
            self._log_media(trainer, manager, records)

    def _log_media(self, trainer: pl.Trainer, manager: Any, records: list) -> None:
        """Plan table at the first phase and at every re-plan; timeline image every n-th phase (W&B only)."""
        from lightning_dos.telemetry.records import PLAN_TABLE_COLUMNS, plan_table_rows, timeline_figure

        loggers = [lg for lg in getattr(trainer, "loggers", []) if hasattr(lg, "log_table") or hasattr(lg, "log_image")]
        if not loggers:
            return
        record = records[-1]
        step = trainer.global_step
        if len(records) == 1 or getattr(record, "replanned", False):
            rows = plan_table_rows(manager.plans.in_force, manager.sizes, manager.cost)
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


class NonFiniteLossGuard(Callback):
    """Stops training at the first non-finite training loss, naming the step, instead of training on NaN weights.

    Under bf16 and fp32 nothing skips an update: a NaN or infinite loss gives NaN gradients, the update of that step
    runs with them, and every later step trains a broken model. Under fp16, DeepSpeed's dynamic loss scaling skips
    the update of a step whose gradients overflow and lowers the scale, so a non-finite loss is only counted here
    (``skipped``). The check reads a loss already computed for the step (one scalar; the update phase has ended by
    then, so it waits for nothing that has not finished).
    """

    def __init__(self) -> None:
        self.skipped = 0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        value = float(loss.detach().float())
        if math.isfinite(value):
            return
        step = trainer.global_step - 1  # the optimizer step this batch belonged to (the counter has moved on)
        if str(trainer.precision).startswith("16"):
            self.skipped += 1
            return
        raise FloatingPointError(
            f"train/loss is {value} at step {step} (batch {batch_idx} of epoch {trainer.current_epoch}); under "
            f"{trainer.precision} no loss scaling skips that update, so the weights are no longer finite. Resume from "
            "the last checkpoint (--ckpt_path last) with a lower learning rate or gradient_clip_val, or look at the "
            "data of this batch"
        )


def default_callbacks() -> list[Callback]:
    """The callbacks every CLI run gets (unless the config already has one of the same type)."""
    return [ValLossReport(), PerfMetrics(), NonFiniteLossGuard(), DOSMetricsLogger()]
