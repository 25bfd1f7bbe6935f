"""Owns one worker process: ``python -m lightning_dos.bench.worker CONFIG RESULT``, in either mode.

Reads the bench settings and the configuration from ``CONFIG`` (JSON), trains the model for ``steps`` iterations
under that configuration's strategy with a :class:`~lightning_dos.bench.timing.PhaseTimer`, and writes the raw
measurements to ``RESULT`` (JSON): per-iteration phase times (NaN, written as null, for the iterations timed end
to end), end times and losses, peak host and GPU memory, the last synchronised iteration's timeline, and for DOS
the manager's per-update records. Statistics are computed by the parent, not here. A fresh process per configuration
gives each one a fresh CUDA context and memory peak.

With a ``sweep`` entry in ``CONFIG`` (``{"plans": [...], "steps_per_plan": N, "auto_steps": A}``) the process is a
plan sweep's: ``deep_optimizer_states`` trains ``len(plans) x N`` iterations of the fixed plans in rounds and ``A``
of ``auto`` (started cold) between them, a :class:`PlanSweep` switching the plan, and the result adds every
iteration's plan and DOS update records. Its records so far also go to ``progress.json`` beside ``CONFIG`` after
every iteration, for a run stopped from outside.

With an ``activations`` entry the process is a ROK curve's (``--activations``): one activation placement's run, or
a micro-batch search probe (:mod:`lightning_dos.bench.rok.worker`).

A failure is written as a result too (status ``oom`` or ``failed``, a one-line reason, and in a sweep what was
measured before it and the plan in force), and the exit status is non-zero.

On more than one device (``RunSpec.devices``) this process is rank 0 and ``Trainer(devices=N)`` has Lightning start
the other ranks with the same command (:mod:`~lightning_dos.bench.ranks`). Every rank measures itself; after
training the ranks' measurements are gathered to rank 0, which writes ``RESULT``: its own figures at the top level
(the ranks' iterations are synchronised by the gradient all-reduce) and every rank's under ``per_rank``. The other
ranks write nothing to ``RESULT`` (a failure goes to their own file beside it) and rank 0 waits for them to exit.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_dos.bench import ranks
from lightning_dos.bench.config import AUTO, BenchConfig, sweep_schedule
from lightning_dos.bench.results import write_json
from lightning_dos.bench.rok.worker import ACTIVATIONS_KEY, execute_placement
from lightning_dos.bench.strategies import RunSpec, build_strategy, plan_argument
from lightning_dos.bench.workload import build_data, build_module
from lightning_dos.planning.plan import Plan, parse_plan, resolve_plan

#: Longest failure reason kept in a result (the full traceback is in the worker's log).
MAX_REASON_CHARS = 400
OOM_MARKERS = ("out of memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory")
#: The sweep's records so far, beside the worker's config file.
PROGRESS_FILE = "progress.json"


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
        "device_buffer_gib": t.device_buffer_bytes / 1024**3,
    }


def dos_records(strategy: Any) -> dict[str, Any] | None:
    """The DOS manager's plan and per-update-phase records, or None for other strategies."""
    manager = getattr(strategy, "manager", None)
    if manager is None:
        return None
    return {
        "active": bool(manager.active),
        "subgroups": len(manager.subgroup_sizes),
        "largest_subgroup": max(manager.subgroup_sizes) if manager.subgroup_sizes else 0,
        "resident_subgroups": list(manager.resident),
        "resident_params": sum(manager.subgroup_sizes[i] for i in manager.resident),
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

    from lightning_dos.telemetry.records import timeline_figure

    path = workdir / "timeline.png"
    fig = timeline_figure(manager.records[-1])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def iteration_timeline(timer: Any, strategy: Any) -> dict[str, Any] | None:
    """The last synchronised iteration on one time axis (ms since it started): its phase marks and, for DOS, the
    update phase that ran in it, placed where it began, with every subgroup's stage spans per lane.

    None before any synchronised iteration; ``update`` is None for other strategies, or when the update phase
    cannot be matched to the manager's records (one record per update phase the timer saw begin).
    """
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


def build_trainer(config: BenchConfig, strategy: Any, workdir: Path, callbacks: list[Any], devices: int = 1) -> Any:
    """The bench's Trainer: ``devices`` data-parallel ranks, ``config.steps`` iterations, no validation, logging or
    checkpoints."""
    return pl.Trainer(
        accelerator=config.accelerator,
        devices=devices,
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
    timeline: bool = False,
    phase_memory: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Train ``config.steps`` iterations under ``spec``; the trainer and the measurements every run reports.

    The iterations of ``config.e2e_iterations`` are timed end to end, unsynchronised; the others phase by phase.
    ``on_strategy`` sees the strategy as soon as it exists, so a caller can still report from it if training fails.
    ``timeline`` adds the last synchronised iteration's timeline (:func:`iteration_timeline`). ``phase_memory`` adds
    each synchronised iteration's peak GPU memory per phase (on a GPU; it resets the allocator's peaks at every
    phase boundary, so a callback that reads them itself must not run beside it).
    """
    import lightning_dos  # noqa: F401  (registers the strategies)
    from lightning_dos.bench.timing import PhaseTimer
    from lightning_dos.telemetry.environment import device_info
    from lightning_dos.telemetry.peak_memory import GpuPeakMeter, HostMemorySampler, gpu_peaks

    started = time.perf_counter()
    with HostMemorySampler() as sampler:
        pl.seed_everything(config.seed, verbose=False)
        strategy = build_strategy(config, spec)
        if on_strategy is not None:
            on_strategy(strategy)
        module = build_module(config)
        data = build_data(config, module.config.vocab_size, devices=spec.devices)
        timer = PhaseTimer(e2e_iterations=config.e2e_iterations, memory=GpuPeakMeter() if phase_memory else None)
        trainer = build_trainer(config, strategy, workdir, [timer, *callbacks], devices=spec.devices)
        ranks.watch_children(trainer)
        fit_started = time.perf_counter()
        trainer.fit(module, datamodule=data)
        fit_s = time.perf_counter() - fit_started
    device = trainer.strategy.root_device
    measured_phases = timer.memory is not None and timer.memory.active
    ran = len(timer.samples["iteration_ms"])
    if ran < config.steps:
        raise RuntimeError(f"only {ran} of {config.steps} iterations ran; the data ran out or training stopped early")
    result = {
        "status": "ok",
        "reason": None,
        **spec.to_dict(),
        "rank": trainer.global_rank,
        "device": device_info(device),
        "iterations": {**timer.samples, "end_s": timer.ends, "loss": timer.losses, **timer.host,
                       **(timer.memory_samples if measured_phases else {})},
        **(timer.memory.process_peaks() if measured_phases else gpu_peaks(device)),
        **sampler.summary(),
        "fit_s": fit_s,
        "wall_s": time.perf_counter() - started,
    }
    if timeline:
        result["iteration_timeline"] = iteration_timeline(timer, trainer.strategy)
    return trainer, result


#: What each rank reports of itself under ``per_rank`` (besides its rank).
RANK_KEYS = ("iterations", "peak_host_gib", "peak_host_rss_sampled_gib", "ru_maxrss_gib", "peak_gpu_gib",
             "peak_gpu_reserved_gib", "dos", "iteration_timeline", "device", "fit_s")


def rank_entry(result: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """One rank's own measurements for ``per_rank``: its iterations (phase samples, end times, losses), peak host and
    GPU memory, DOS update records and iteration timeline, and the cores it was bound to, if any."""
    cores = getattr(trainer.strategy, "bound_cores", None)
    return {"rank": trainer.global_rank, "local_rank": trainer.local_rank,
            **{key: result.get(key) for key in RANK_KEYS}, "cores": None if cores is None else list(cores)}


def run(config: BenchConfig, spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """Train ``config.steps`` iterations under ``spec`` and return the raw measurements (every rank's under
    ``per_rank``, gathered to each rank: only rank 0's is written)."""
    trainer, result = fit_and_measure(config, spec, workdir, timeline=True, phase_memory=True)
    result = {
        **result,
        "dos": dos_records(trainer.strategy),
        "timeline": save_timeline(trainer.strategy, workdir) if trainer.global_rank == 0 else None,
    }
    result["per_rank"] = ranks.gather_to_rank0(rank_entry(result, trainer))
    return result


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


# ------------------------------------------------------------------ plan sweep

class PlanSweep(pl.Callback):
    """Runs each of ``plans`` for ``steps_per_plan`` iterations, in rounds, and records what each one did.

    A callback for a run under ``deep_optimizer_states``: it sets the manager's plan in ``on_train_batch_start``
    (before that iteration's backward, so the device lane's gradients stay on the device as the plan says) and
    collects the manager's update records of every iteration under the plan that ran. The fixed plans share one
    calibration: each prediction is made just before its update phase from everything the fixed plans measured so far.
    ``auto``'s iterations (:func:`~lightning_dos.bench.config.sweep_schedule`) start cold (the manager's
    :meth:`~lightning_dos.update.manager.OptimizerStateManager.start_auto`: starting cost values, then the probe) and
    keep their own planning state (calibration, plan, probe and re-plan counts) between them, so ``auto`` learns only
    from its own update phases while sharing the process, its memory placement and the host's slow and fast spells with
    the plans it is compared with.

    Args:
        plans: fixed plans as on the command line: ``host``, ``device``, a fraction, ``stride:K`` or lanes
            joined by commas. ``auto`` is refused here: it re-plans by itself (see ``auto_steps``).
        steps_per_plan: iterations each plan runs (rounds).
        progress_path: if set, the raw records so far are written there (JSON) after every iteration, so a
            run that is stopped from outside still leaves what it measured.
        auto_steps: iterations of ``auto``, started cold, spread over the rounds after the first (0: none).
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
            raise ValueError("plan sweep: 'auto' is not a fixed plan (it probes and re-plans); set auto_steps to "
                             "run it between the fixed plans")
        self.steps_per_plan = steps_per_plan
        if isinstance(auto_steps, bool) or not isinstance(auto_steps, int) or auto_steps < 0:
            raise ValueError(f"plan sweep: auto_steps {auto_steps!r} must be an integer >= 0")
        self.auto_steps = auto_steps
        self.schedule = sweep_schedule(self.plans, steps_per_plan, auto_steps)
        self.progress_path = None if progress_path is None else Path(progress_path)
        self.resolved: list[Plan] = []
        self.iterations: list[dict[str, Any]] = []
        self._first_record = 0
        self._fixed_state: Any = None  # the manager's planning state for the fixed plans, while auto runs
        self._auto_state: Any = None  # auto's, while a fixed plan runs (None: auto has not started)
        self._in_auto = False

    @property
    def fixed_steps(self) -> int:
        """Iterations of the fixed plans: ``steps_per_plan`` each."""
        return len(self.plans) * self.steps_per_plan

    @property
    def total_steps(self) -> int:
        """Iterations of the whole sweep: the fixed plans' and ``auto``'s (the length of its schedule)."""
        return len(self.schedule)

    def plan_at(self, iteration: int) -> str:
        """The plan of ``iteration`` (from 0; :data:`AUTO` for ``auto``'s); the last one past the end."""
        return self.schedule[min(iteration, len(self.schedule) - 1)]

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
        from lightning_dos.update.manager import DEFAULT_BUFFERS

        buffers = manager.buffers or DEFAULT_BUFFERS
        return [resolve_plan(spec, manager.sizes, buffers=buffers) for spec in self.specs]

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        manager = self._manager(trainer)
        if not self.resolved:  # subgroup sizes are known once the engine exists
            self.resolved = self._resolve(manager)
        iteration = len(self.iterations)
        self._first_record = len(manager.records)
        name = self.plan_at(iteration)
        if name == AUTO:
            if not self._in_auto:
                self._fixed_state = manager.planning_state()
                if self._auto_state is None:
                    manager.start_auto()  # cold: starting cost values, then the probe, as a new run
                else:
                    manager.restore(self._auto_state)  # where auto left off: its calibration, plan and counts
                self._in_auto = True
            plan, index = manager.base_plan, None
        else:
            if self._in_auto:
                self._auto_state = manager.planning_state()
                manager.restore(self._fixed_state)
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


class SweepRun:
    """The parts of one sweep process, kept so that a failure can still report what was measured."""

    def __init__(self, plans: list[str], steps_per_plan: int, workdir: Path, auto_steps: int = 0) -> None:
        self.sweep = PlanSweep(plans, steps_per_plan, progress_path=workdir / PROGRESS_FILE, auto_steps=auto_steps)
        self.strategy: Any = None

    def partial(self) -> dict[str, Any]:
        """What ran before a failure: the sweep's records and the plan in force."""
        return {"sweep": self.sweep.raw(), "failed_plan": self.sweep.current_plan,
                "dos": dos_records(self.strategy) if self.strategy is not None else None}


def run_sweep(config: BenchConfig, spec: RunSpec, state: SweepRun, workdir: Path) -> dict[str, Any]:
    """Train every plan of the sweep in turn and return the raw measurements."""
    sweep = state.sweep
    if config.steps != sweep.total_steps:
        raise ValueError(f"steps: {config.steps} does not hold {len(sweep.plans)} plans for {sweep.steps_per_plan} "
                         f"iterations each and {sweep.auto_steps} of auto ({sweep.total_steps})")

    def keep(strategy: Any) -> None:
        state.strategy = strategy

    trainer, result = fit_and_measure(config, spec, workdir, callbacks=[sweep], on_strategy=keep)
    return {**result, "sweep": sweep.raw(), "failed_plan": None, "dos": dos_records(trainer.strategy)}


def execute_sweep(payload: dict[str, Any], spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """The sweep of ``payload``; a failure still reports the plans measured before it."""
    config = BenchConfig.from_dict(payload["bench"])
    settings = payload["sweep"]
    state = SweepRun(list(settings["plans"]), int(settings["steps_per_plan"]), workdir,
                     auto_steps=int(settings.get("auto_steps", 0)))
    try:
        return run_sweep(config, spec, state, workdir)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        return {**failure(spec, err), **state.partial()}


#: A worker's body: (the config file's payload, the run, its run directory) -> the result to write.
Execute = Callable[[dict[str, Any], RunSpec, Path], dict[str, Any]]


def execute(payload: dict[str, Any], spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """The run of ``payload``: a plan sweep's process if it has a ``sweep`` entry, a ROK placement's run or search
    probe if it has an ``activations`` entry, else one configuration."""
    if "sweep" in payload:
        return execute_sweep(payload, spec, workdir)
    if ACTIVATIONS_KEY in payload:  # a ROK placement's run or search probe
        return execute_placement(payload, spec, workdir, fit_and_measure=fit_and_measure, dos_records=dos_records)
    return run(BenchConfig.from_dict(payload["bench"]), spec, workdir)


def serve(argv: list[str] | None, execute: Execute = execute) -> int:
    """The worker's entry: ``python -m lightning_dos.bench.worker CONFIG RESULT``. Reads ``CONFIG``, calls
    ``execute(payload, spec, run directory)`` and writes what it returns, or the failure it raised, to ``RESULT``;
    0 when the status is ok. A rank other than 0 writes nothing to ``RESULT``, only its failure, if any, beside it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m lightning_dos.bench.worker CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    config_path, result_path = Path(args[0]), Path(args[1])
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    spec = RunSpec(**payload["run"])
    try:
        result = execute(payload, spec, config_path.parent)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        result = failure(spec, err)
    ok = result["status"] == "ok"
    rank = ranks.process_rank()
    if rank != 0:
        if not ok:
            ranks.write_failure(result_path, rank, {"status": result["status"], "reason": result.get("reason")})
        return 0 if ok else 1
    write_json(result_path, result)
    return 0 if ok else 1


def exit_now(code: int) -> None:
    """Leave the worker with ``code`` once its result is on disk, skipping interpreter teardown, where a
    library's lingering thread could turn a finished run into a timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the configuration (or sweep process) in ``argv[0]`` and write its result to ``argv[1]``; 0 when it
    succeeded. Rank 0 of a multi-device run returns once the other ranks have exited."""
    code = serve(argv)
    ranks.wait_for_children(succeeded=code == 0)
    return code


if __name__ == "__main__":
    exit_now(main())
