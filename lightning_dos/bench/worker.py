"""Owns one configuration's run, in its own process: ``python -m lightning_dos.bench.worker CONFIG RESULT``.

Reads the bench settings and the configuration from ``CONFIG`` (JSON), trains the model for ``steps``
iterations under that configuration's strategy with a :class:`~lightning_dos.bench.timing.PhaseTimer`, and
writes the raw measurements to ``RESULT`` (JSON): per-iteration phase times and losses, peak host and GPU
memory, and for DOS the manager's per-update records. Statistics are computed by the parent, not here.
A failure is written as a result too (status ``oom`` or ``failed`` and a one-line reason), and the exit
status is non-zero. A fresh process per configuration gives each one a fresh CUDA context and memory peak.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import BenchConfig, RunSpec, plan_argument
from lightning_dos.bench.data import build_data
from lightning_dos.bench.model import module_kwargs

#: Longest failure reason kept in a result (the full traceback is in the worker's log).
MAX_REASON_CHARS = 400
OOM_MARKERS = ("out of memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory")


def build_strategy(config: BenchConfig, spec: RunSpec) -> Any:
    """The Lightning strategy of ``spec``, with the bench's subgroup size and pinning."""
    from lightning_dos import DeepOptimizerStatesStrategy
    from lightning_dos.baselines import ZeRO3OffloadStrategy, ZeRO3Strategy

    if spec.strategy in ("zero3_offload", "static_split"):
        ratio = 1.0 if spec.plan is None else float(spec.plan)
        return ZeRO3OffloadStrategy(ratio=ratio, sub_group_size=config.sub_group_size, pin_memory=config.pin_memory)
    if spec.strategy == "deep_optimizer_states":
        return DeepOptimizerStatesStrategy(
            plan=plan_argument(str(spec.plan)),
            sub_group_size=config.sub_group_size,
            memory_budget_gib=config.memory_budget_gib,
            pin_memory=config.pin_memory,
        )
    if spec.strategy == "no_offload":
        return ZeRO3Strategy(sub_group_size=config.sub_group_size)
    raise ValueError(f"strategy: {spec.strategy!r} is not a bench strategy kind")


def build_module(config: BenchConfig) -> Any:
    """The GPT LightningModule, initialised from ``config.seed`` whatever ran before it in the process."""
    import torch

    from lightning_dos.models import GPTModule

    class SeededGPTModule(GPTModule):
        def configure_model(self) -> None:
            if self.model is None:
                torch.manual_seed(config.seed)
            super().configure_model()

    return SeededGPTModule(**module_kwargs(config))


def record_dict(record: Any) -> dict[str, Any]:
    """One DOS update record (a ``StepRecord``) as JSON: plan, makespan, prediction, busy times, bytes, demotions."""
    t = record.timings
    return {
        "lanes": record.plan.lane_letters(),
        "host_order": list(record.plan.host_order),
        "source": record.plan.source,
        "buffers": record.plan.buffers,
        "update_ms": t.total_s * 1e3,
        "host_busy_ms": t.host_busy_s * 1e3,
        "host_compute_ms": t.host_compute_s * 1e3,
        "device_busy_ms": t.device_busy_s * 1e3,
        "device_fraction": record.device_fraction,
        "h2d_gb": (t.h2d_bytes + t.upload_bytes) / 1e9,
        "d2h_gb": t.d2h_bytes / 1e9,
        "demoted_subgroups": len(record.demoted),
        "free_device_gib": None if record.free_bytes is None else record.free_bytes / 1024**3,
        "predicted_ms": record.predicted_s * 1e3,
        "replanned": record.replanned,
        "prefetch_busy_ms": t.prefetch_busy_s * 1e3,
        "adam_busy_ms": t.adam_busy_s * 1e3,
        "flush_busy_ms": t.flush_busy_s * 1e3,
        "upload_busy_ms": t.upload_busy_s * 1e3,
        "prefetched_ahead": t.prefetched_ahead,
        "dispatch_lead_ms": t.lead_s * 1e3,
    }


def dos_records(strategy: Any) -> dict[str, Any] | None:
    """The DOS manager's plan and per-update-phase records, or None for other strategies."""
    manager = getattr(strategy, "manager", None)
    if manager is None:
        return None
    return {
        "active": bool(manager.active),
        "subgroups": len(manager.sizes),
        "largest_subgroup": max(manager.sizes) if manager.sizes else 0,
        "plan": str(manager.base_plan),
        "steps": [record_dict(record) for record in manager.records],
        "cost": manager.cost.to_json(),  # the cost parameters calibration ended with
    }


def save_timeline(strategy: Any, workdir: Path) -> str | None:
    """A PNG of the last DOS update phase's lanes (where the time went), or None for other strategies."""
    manager = getattr(strategy, "manager", None)
    if manager is None or not manager.records:
        return None
    import matplotlib.pyplot as plt

    from lightning_dos.telemetry import timeline_figure

    path = workdir / "timeline.png"
    fig = timeline_figure(manager.records[-1])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def build_trainer(config: BenchConfig, strategy: Any, workdir: Path, callbacks: list[Any]) -> Any:
    """The bench's Trainer: one device, ``config.steps`` iterations, no validation, logging or checkpoints."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator=config.accelerator,
        devices=1,
        strategy=strategy,
        precision=config.precision,
        max_steps=config.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=str(workdir),
    )


def fit_and_measure(
    config: BenchConfig,
    spec: RunSpec,
    workdir: Path,
    callbacks: Sequence[Any] = (),
    on_strategy: Callable[[Any], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Train ``config.steps`` iterations under ``spec``; the trainer and the measurements every run reports.

    ``on_strategy`` sees the strategy as soon as it exists, so a caller can still report from it if training fails.
    """
    import lightning.pytorch as pl

    import lightning_dos  # noqa: F401  (registers the strategies)
    from lightning_dos.bench.environment import device_info
    from lightning_dos.bench.memory import HostMemorySampler, gpu_peaks
    from lightning_dos.bench.timing import PhaseTimer

    started = time.perf_counter()
    with HostMemorySampler() as sampler:
        pl.seed_everything(config.seed, verbose=False)
        strategy = build_strategy(config, spec)
        if on_strategy is not None:
            on_strategy(strategy)
        module = build_module(config)
        data = build_data(config, module.config.vocab_size)
        timer = PhaseTimer()
        trainer = build_trainer(config, strategy, workdir, [timer, *callbacks])
        fit_started = time.perf_counter()
        trainer.fit(module, datamodule=data)
        fit_s = time.perf_counter() - fit_started
    device = trainer.strategy.root_device
    ran = len(timer.samples["iteration_ms"])
    if ran < config.steps:
        raise RuntimeError(f"only {ran} of {config.steps} iterations ran; the data ran out or training stopped early")
    return trainer, {
        "status": "ok",
        "reason": None,
        **spec.to_dict(),
        "device": device_info(device),
        "iterations": {**timer.samples, "loss": timer.losses, **timer.host},
        **gpu_peaks(device),
        **sampler.summary(),
        "fit_s": fit_s,
        "wall_s": time.perf_counter() - started,
    }


def run(config: BenchConfig, spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """Train ``config.steps`` iterations under ``spec`` and return the raw measurements."""
    trainer, result = fit_and_measure(config, spec, workdir)
    return {
        **result,
        "dos": dos_records(trainer.strategy),
        "timeline": save_timeline(trainer.strategy, workdir),
    }


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` reports device or host memory exhaustion."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return any(marker in text for marker in OOM_MARKERS)


def one_line(err: BaseException) -> str:
    """``Type: first line of the message``, cut to :data:`MAX_REASON_CHARS`."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def failure(spec: RunSpec, err: BaseException) -> dict[str, Any]:
    """The result of a configuration that raised ``err``."""
    return {"status": "oom" if is_oom(err) else "failed", "reason": one_line(err), **spec.to_dict()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a reader never sees half a file); NaN becomes null."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_finite(data), fh, indent=2)
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


#: A worker's body: (the config file's payload, the run, its run directory) -> the result to write.
Execute = Callable[[dict[str, Any], RunSpec, Path], dict[str, Any]]


def serve(argv: list[str] | None, module: str, execute: Execute) -> int:
    """A worker's entry: ``python -m MODULE CONFIG RESULT``. Reads ``CONFIG``, calls ``execute(payload, spec, run
    directory)`` and writes what it returns, or the failure it raised, to ``RESULT``; 0 when the status is ok."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {module} CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    config_path, result_path = Path(args[0]), Path(args[1])
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    spec = RunSpec(**payload["run"])
    try:
        result = execute(payload, spec, config_path.parent)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        result = failure(spec, err)
    write_json(result_path, result)
    return 0 if result["status"] == "ok" else 1


def exit_now(code: int) -> None:
    """Leave the worker with ``code`` once its result is on disk, skipping interpreter teardown, where a
    library's lingering thread could turn a finished run into a timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the configuration in ``argv[0]`` and write its result to ``argv[1]``; 0 when it succeeded."""
    return serve(argv, "lightning_dos.bench.worker",
                 lambda payload, spec, workdir: run(BenchConfig.from_dict(payload["bench"]), spec, workdir))


if __name__ == "__main__":
    exit_now(main())
