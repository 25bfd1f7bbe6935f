"""Owns what a worker measures of one run: it builds the run's ``lightning-dos fit``, trains it under the timer and
returns every figure raw (phases, end times, losses, peaks, DOS update records, the timeline); the statistics are the
parent's. :func:`fit_and_measure` serves every mode; a failure becomes a result too (:func:`failure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench import ranks
from lightning_dos.bench.results import write_json
from lightning_dos.bench.settings import Run

#: Where a worker writes its measurements as training ends, beside its result (:func:`fit_and_measure`).
TRAINED = "trained.json"
#: Longest failure reason kept in a result (the full traceback is in the worker's log).
MAX_REASON_CHARS = 400
OOM_MARKERS = ("out of memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory")


#: Update-record milliseconds: JSON key -> the ``LaneTimings`` seconds it is.
TIMINGS_MS = {"update_ms": "total_s", "host_busy_ms": "host_busy_s", "host_compute_ms": "host_compute_s",
              "device_busy_ms": "device_busy_s", "prefetch_busy_ms": "prefetch_busy_s", "adam_busy_ms": "adam_busy_s",
              "flush_busy_ms": "flush_busy_s", "upload_busy_ms": "upload_busy_s", "dispatch_lead_ms": "lead_s"}


def record_dict(record: Any) -> dict[str, Any]:
    """One DOS update record (a ``StepRecord``) as JSON: plan, makespan, prediction, busy times, bytes, demotions."""
    t, plan = record.timings, record.plan
    return {"lanes": plan.lane_letters(), "host_order": list(plan.host_order), "source": plan.source,
            "buffers": plan.buffers, "device_fraction": record.device_fraction,
            "demoted_subgroups": len(record.demoted),
            **{key: getattr(t, seconds) * 1e3 for key, seconds in TIMINGS_MS.items()},
            "h2d_gb": (t.h2d_bytes + t.upload_bytes) / 1e9, "d2h_gb": t.d2h_bytes / 1e9,
            "free_device_gib": None if record.free_bytes is None else record.free_bytes / 1024**3,
            "predicted_ms": record.predicted_s * 1e3, "replanned": record.replanned,
            "prefetched_ahead": t.prefetched_ahead, "device_buffer_gib": t.device_buffer_bytes / 1024**3}


def dos_records(strategy: Any) -> dict[str, Any] | None:
    """The DOS manager's plan and per-update-phase records, or None for other strategies."""
    manager = getattr(strategy, "manager", None)
    if manager is None:
        return None
    return {
        "active": bool(manager.active),
        "overlapped": bool(getattr(strategy, "overlapped", False)),  # what ran, whatever overlap asked for
        "subgroups": len(manager.subgroup_sizes),
        "largest_subgroup": max(manager.subgroup_sizes) if manager.subgroup_sizes else 0,
        "resident_subgroups": list(manager.resident),
        "resident_params": sum(manager.subgroup_sizes[i] for i in manager.resident),
        "plan": str(manager.plans.in_force),
        "memory_plans": [plan.to_json() for plan in manager.memory_plans],  # at start, then after the first step
        "steps": [record_dict(record) for record in manager.records],
        "cost": manager.cost.to_json(),  # the cost parameters calibration ended with
    }


def save_timeline(strategy: Any, workdir: Path) -> str | None:
    """A PNG of the last DOS update phase's lanes (where the time went), or None for other strategies."""
    manager = getattr(strategy, "manager", None)
    if manager is None or not manager.records:
        return None
    import matplotlib.pyplot as plt

    from lightning_dos.telemetry.records import timeline_figure

    path = workdir / "timeline.png"
    fig = timeline_figure(manager.records[-1])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def iteration_timeline(timer: Any, strategy: Any) -> dict[str, Any] | None:
    """The last synchronised iteration (ms since it began): its marks and, for DOS, the update phase that ran in it,
    placed where it began, each subgroup's spans per lane; None before any synchronised iteration."""
    last = timer.last_iteration()
    if last is None:
        return None
    index, start_ms = last.pop("update_index"), last.pop("update_start_ms")
    manager = getattr(strategy, "manager", None)
    update = None
    if manager is not None and index is not None and len(manager.records) == len(timer.update_starts):
        record = manager.records[index]
        t = record.timings
        events = [{key: [v * 1e3 for v in value] if isinstance(value, (tuple, list)) else value
                   for key, value in event.items()} for event in t.events]
        update = {"start_ms": start_ms, "total_ms": t.total_s * 1e3, "lanes": record.plan.lane_letters(),
                  "device_fraction": record.device_fraction, "events": events}
    return {**last, "update": update}


def fit_and_measure(
    payload: dict[str, Any],
    spec: Run,
    callbacks: Sequence[Any] = (),
    on_strategy: Callable[[Any], None] | None = None,
    timeline: bool = False,
    phase_memory: bool = False,
    trained_to: Path | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Build what ``payload``'s ``lightning-dos fit`` builds, with a :class:`~lightning_dos.bench.timing.PhaseTimer`
    and ``callbacks`` added, train it and return the trainer and the raw measurements. ``on_strategy`` sees the
    strategy first (to report from it should training fail); ``timeline`` adds the last synchronised iteration's;
    ``phase_memory`` each synchronised phase's GPU peak (it resets the allocator's peaks: nothing else may read them);
    ``trained_to`` gets the measurements (DOS's records with them) as training ends, before Lightning's teardown, which
    the kernel may yet kill the process in (the launcher then reports them, :data:`TRAINED`).
    """
    from lightning.pytorch import Callback

    from lightning_dos.bench.compose import build
    from lightning_dos.bench.timing import PhaseTimer
    from lightning_dos.telemetry.environment import device_info
    from lightning_dos.telemetry.host_census import HostCensusLog
    from lightning_dos.telemetry.peak_memory import GpuPeakMeter, HostMemorySampler, gpu_peaks

    started = time.perf_counter()
    with HostMemorySampler() as sampler:
        timer = PhaseTimer(e2e_iterations=spec.e2e_iterations, memory=GpuPeakMeter() if phase_memory else None)
        # its lines in the worker's log outlive a run the kernel kills; its censuses (a walk of the Python heap) fall in
        # warm-up iterations only, which no figure reads
        census = HostCensusLog(at=tuple(sorted({1, spec.warmup - 1} - {0})) if spec.warmup >= 2 else ())

        def measured(trainer: Any) -> dict[str, Any]:
            device = trainer.strategy.root_device
            phases = timer.memory is not None and timer.memory.active
            return {"status": "ok", "reason": None, **spec.to_dict(), "rank": trainer.global_rank,
                    "device": device_info(device),
                    "iterations": {**timer.samples, "end_s": timer.ends, "loss": timer.losses,
                                   "host_in_use_gib": timer.host_in_use, **timer.host,
                                   **(timer.memory_samples if phases else {})},
                    **(timer.memory.process_peaks() if phases else gpu_peaks(device)), **sampler.summary(),
                    "host_census": census.censuses, "wall_s": time.perf_counter() - started,
                    **({"iteration_timeline": iteration_timeline(timer, trainer.strategy)} if timeline else {})}

        class Trained(Callback):
            def on_train_end(self, trainer: Any, pl_module: Any) -> None:
                done = len(timer.samples["iteration_ms"]) >= spec.steps  # else fit_and_measure raises after fit
                if trainer.global_rank == 0 and done:
                    write_json(trained_to, {**measured(trainer), "dos": dos_records(trainer.strategy)})

        cli = build(payload["fit"]["args"], callbacks=[timer, census, *callbacks, *([Trained()] if trained_to else [])])
        trainer = cli.trainer
        if on_strategy is not None:
            on_strategy(trainer.strategy)
        ranks.watch_children(trainer)
        fit_started = time.perf_counter()
        trainer.fit(cli.model, datamodule=cli.datamodule)
        fit_s = time.perf_counter() - fit_started
        census.record(trainer, "after fit")
    if len(timer.samples["iteration_ms"]) < spec.steps:
        raise RuntimeError(f"only {len(timer.samples['iteration_ms'])} of {spec.steps} iterations ran; the data ran "
                           "out or training stopped early")
    return trainer, {**measured(trainer), "fit_s": fit_s}


#: What each rank reports of itself under ``per_rank`` (besides its rank).
RANK_KEYS = ("iterations", "peak_host_gib", "peak_host_rss_sampled_gib", "ru_maxrss_gib", "peak_gpu_gib",
             "peak_gpu_reserved_gib", "dos", "iteration_timeline", "device", "fit_s")


def rank_entry(result: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """One rank's own measurements for ``per_rank`` (:data:`RANK_KEYS`) and the cores it was bound to, if any."""
    cores = getattr(trainer.strategy, "bound_cores", None)
    return {"rank": trainer.global_rank, "local_rank": trainer.local_rank,
            **{key: result.get(key) for key in RANK_KEYS}, "cores": None if cores is None else list(cores)}


def run(payload: dict[str, Any], spec: Run, workdir: Path) -> dict[str, Any]:
    """Train the configuration of ``payload`` and return the raw measurements (every rank's under ``per_rank``,
    gathered to each rank: only rank 0's is written)."""
    trainer, result = fit_and_measure(payload, spec, timeline=True, phase_memory=True, trained_to=workdir / TRAINED)
    result["dos"] = dos_records(trainer.strategy)
    result["timeline"] = save_timeline(trainer.strategy, workdir) if trainer.global_rank == 0 else None
    result["per_rank"] = ranks.gather_to_rank0(rank_entry(result, trainer))
    return result


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` reports device or host memory exhaustion."""
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or any(marker in str(err).lower() for marker in OOM_MARKERS))


def one_line(err: BaseException) -> str:
    """``Type: first line of the message``, cut to :data:`MAX_REASON_CHARS`."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def failure(spec: Run, err: BaseException) -> dict[str, Any]:
    """The result of a configuration that raised ``err``."""
    return {"status": "oom" if is_oom(err) else "failed", "reason": one_line(err), **spec.to_dict()}

