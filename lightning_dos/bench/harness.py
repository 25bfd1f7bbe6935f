"""Owns one invocation end to end, in either mode: worker processes in; a JSON document, a report and a chart out.

Both modes describe the host and the model, prepare text data once if asked for, and run their worker processes
(:mod:`~lightning_dos.bench.worker`, through :func:`~lightning_dos.bench.launcher.launch`: time limit, failure
classification, a log each) one at a time under a progress bar with a one-line summary per process. Ctrl-C or
SIGTERM stops the process running; the ones after it are reported as not run, and the outputs cover what ran.

* **Strategy comparison** (:func:`run_bench`): every configuration of every strategy kind, each repeat in its own
  process, round-robin; the repeats are aggregated and compared against vanilla ``zero3_offload`` (ratios), and
  results.json, report.md (and its dated copy), chart.png and iteration_timeline.png written.
  ``no_offload`` is not run when the model states clearly cannot fit on the GPU; ``--resume`` reuses the
  configurations an earlier invocation finished. With ``--devices``, every configuration runs at each device count
  (data parallel, one rank per device), compared with vanilla at the same count; a single-device kind, or a count
  above the host's GPUs, gets a ``skipped`` row at N > 1; the scaling section and rank_timelines.png (every rank's
  iteration of DOS ``auto`` at the largest count) are added.
* **Plan sweep** (:func:`run_sweep`): one process per memory budget runs every fixed plan in rounds and ``auto``
  started cold between them (:func:`~lightning_dos.bench.config.sweep_schedule`); ``auto`` shares the process and
  the time with the plans it is compared with. sweep.json, sweep.md and sweep.png are written after every budget,
  and a process stopped from outside still contributes the plans it finished (its ``progress.json``).

The ROK curve (``--activations``, :mod:`lightning_dos.bench.rok.harness`) runs its processes with the same helpers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lightning_dos.bench import chart, report
from lightning_dos.bench.config import BenchConfig, Budget, SweepConfig, resolve_budget
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.results import (
    aggregate,
    bench_document,
    compare_to_baseline,
    e2e_samples,
    run_peaks,
    scaling,
    skipped,
    summarize_budget,
    sweep_document,
    write_json,
)
from lightning_dos.bench.stats import median
from lightning_dos.bench.strategies import KINDS, RunSpec, expand, schedule, single_device_reason
from lightning_dos.bench.worker import PROGRESS_FILE
from lightning_dos.bench.workload import NO_OFFLOAD_BYTES_PER_PARAM, describe_model, prepare_text
from lightning_dos.telemetry.environment import hardware_info, merge_worker_device, versions

GPU_TIMING = ("GPU: torch.cuda.synchronize() is called at every phase boundary (bench mode), so each phase's "
              "kernels are charged to it; this costs a little and removes overlap across boundaries, so these "
              "iteration times are slightly above the unsynchronised end-to-end ones.")
CPU_TIMING = "CPU: no device to synchronise; phase times are host wall-clock between the Lightning hooks."

#: ``launcher(config, spec, run_dir)`` (a sweep's also gets ``extra=``): :func:`~lightning_dos.bench.launcher.launch`.
Launcher = Callable[..., dict[str, Any]]


def default_out_dir(config: BenchConfig, now: datetime, sweep: bool = False) -> Path:
    """``runs/bench/<model>_<YYYYmmdd-HHMMSS>`` (``runs/sweep/...`` for a sweep) under the current directory."""
    return Path("runs") / ("sweep" if sweep else "bench") / f"{config.model}_{now:%Y%m%d-%H%M%S}"


def uses_gpu(config: BenchConfig, hardware: dict[str, Any]) -> bool:
    """Whether the workers will run on a GPU."""
    if config.accelerator in ("gpu", "cuda"):
        return True
    return config.accelerator == "auto" and bool(hardware.get("gpu_count"))


def phase_timing_note(config: BenchConfig, hardware: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """How phases were timed, from the devices the workers reported (merged into ``hardware``)."""
    merge_worker_device(hardware, devices[0] if devices else None)
    on_gpu = any(d.get("type") == "cuda" for d in devices) or (not devices and uses_gpu(config, hardware))
    return GPU_TIMING if on_gpu else CPU_TIMING


def prepare_invocation(config: BenchConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The host and the model of an invocation, text data tokenised once first if it uses any."""
    hardware = hardware_info()
    if config.data == "text":
        prepare_text(config)
    return hardware, describe_model(config)


def relative_path(path: str | None, root: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def elapsed_note(result: dict[str, Any]) -> str:
    return f" ({result['elapsed_s']:.0f} s)" if result.get("elapsed_s") is not None else ""


class WorkerProcesses:
    """An invocation's worker processes, one at a time: after an interruption the rest are not run."""

    def __init__(self, bar: Any, out_dir: Path, mode: str) -> None:
        self.bar, self.out_dir, self.mode = bar, out_dir, mode
        self.interrupted = False

    def begin(self, spec: RunSpec) -> None:
        self.bar.set_postfix_str(spec.label)

    def run(self, spec: RunSpec, launch_it: Callable[[], dict[str, Any]],
            complete: Callable[[dict[str, Any]], dict[str, Any]] = lambda result: result) -> dict[str, Any]:
        """``launch_it()``'s result (``complete``d), or a ``skipped`` one once the invocation was interrupted."""
        if self.interrupted:
            result = skipped(spec, f"not run: the {self.mode} was interrupted")
        else:
            try:
                result = complete(launch_it())
            except KeyboardInterrupt:  # the worker is already stopped; report what ran
                self.interrupted = True
                result = complete(skipped(spec, "interrupted while running"))
        result["log"] = relative_path(result.get("log"), self.out_dir)
        return result

    def done(self, line: str) -> None:
        self.bar.write(line)
        self.bar.update(1)


@contextmanager
def worker_processes(total: int, mode: str, unit: str, out_dir: Path, progress: bool) -> Iterator[WorkerProcesses]:
    with tqdm(total=total, desc=mode, unit=unit, disable=not progress, dynamic_ncols=True) as bar:
        yield WorkerProcesses(bar, out_dir, mode)


# ------------------------------------------------------------------ strategy comparison

def no_offload_skip_reason(config: BenchConfig, model: dict[str, Any], hardware: dict[str, Any],
                           devices: int = 1) -> str | None:
    """Why a kind that keeps every state on the GPU (no_offload) cannot fit (so it is not run), or None to run it.

    On ``devices`` GPUs ZeRO-3 shards the states: each holds its share.
    """
    total = hardware.get("gpu_memory_gib")
    if config.force_no_offload or not uses_gpu(config, hardware) or not total:
        return None
    need = model["no_offload_state_gib_lower_bound"] / devices
    if need <= total:
        return None
    share = "" if devices == 1 else f" (its share of {devices} GPUs)"
    return (f"does not fit: model and optimizer state alone need >= {need:.1f} GiB{share} "
            f"({NO_OFFLOAD_BYTES_PER_PARAM} B/param) but the GPU has {total:.1f} GiB (--force-no-offload runs it)")


def devices_skip_reason(spec: RunSpec, config: BenchConfig, hardware: dict[str, Any]) -> str | None:
    """Why ``spec`` is not run at its device count: a single-device kind on several, or more GPUs than the host
    has; None to run it."""
    reason = single_device_reason(spec)
    if reason is not None:
        return reason
    gpus = hardware.get("gpu_count")
    if spec.devices > 1 and uses_gpu(config, hardware) and gpus and spec.devices > gpus:
        return f"needs {spec.devices} GPUs; this host has {gpus} (set --devices to at most {gpus})"
    return None


def run_line(index: int, total: int, result: dict[str, Any], config: BenchConfig) -> str:
    """One line summarising a finished run, printed as it completes."""
    head = f"[{index}/{total}] {result['label']}"
    if config.repeats > 1:
        head += f" (repeat {result.get('repeat', 0) + 1})"
    if result.get("reused"):
        head += " (reused from an earlier invocation)"
    if result["status"] != "ok":
        return f"{head}: {result['status'].upper()}: {result.get('reason')}{elapsed_note(result)}"
    iterations = result["iterations"]
    it = {k: median([iterations[k][i] for i in config.phase_iterations if i < len(iterations[k])])
          for k in ("fwd_ms", "bwd_ms", "step_ms", "iteration_ms")}
    e2e = median(e2e_samples(iterations, config))
    headline = it["iteration_ms"] if e2e is None else e2e
    tokens = config.global_tokens_per_iteration(result.get("devices") or 1)
    tokens_per_s = tokens / (headline / 1e3) if headline else None
    peaks = run_peaks(result)  # over the ranks: the largest GPU's, the host's sum
    gpu, host = peaks["peak_gpu_gib"], peaks["peak_host_gib"]
    memory = (f"peak GPU {gpu:.2f} GiB, " if gpu is not None else "") + f"host {_num(host, 2)} GiB"
    e2e_text = f"e2e {e2e:.1f} ms/iteration, " if e2e is not None else ""
    return (f"{head}: ok  {e2e_text}{tokens_per_s or 0:,.0f} tokens/s  synchronised {_num(it['iteration_ms'])} ms "
            f"(fwd {_num(it['fwd_ms'])} | bwd {_num(it['bwd_ms'])} | step {_num(it['step_ms'])})  {memory}  "
            f"loss {iterations['loss'][-1]:.4f}{elapsed_note(result)}")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


#: BenchConfig fields that choose which configurations run or how long they may take, not what they measure:
#: a finished configuration is reused by ``--resume`` whatever these say.
NOT_MEASUREMENT = ("strategies", "ratios", "plans", "repeats", "force_no_offload", "timeout_s", "out", "recipe",
                   "devices")


def reusable_result(config: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """The result a finished earlier run left in ``run_dir``, if it measured ``spec`` under the same settings.

    Only a result with status ``ok`` counts, and only when its ``config.json`` names the same configuration and
    the same measurement settings (every field but :data:`NOT_MEASUREMENT`) and it has the end times its end-to-end
    figures need; anything else is run again.
    """
    try:
        payload = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if result.get("status") != "ok" or {"devices": 1, **(payload.get("run") or {})} != spec.to_dict():
        return None
    if config.e2e_count and "end_s" not in (result.get("iterations") or {}):
        return None  # measured before end-to-end timing existed: it has no headline
    earlier, now = payload.get("bench", {}), config.to_dict()
    if any(earlier.get(key) != value for key, value in now.items() if key not in NOT_MEASUREMENT):
        return None
    return {**result, "reused": True, "log": str(run_dir / "worker.log")}


def run_bench(config: BenchConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
              now: datetime | None = None, resume: bool = False) -> dict[str, Any]:
    """Run every configuration of ``config``, write the outputs under ``out_dir`` and return results.json's data.

    With ``resume``, a configuration that already finished in ``out_dir`` under the same measurement settings
    (:func:`reusable_result`) is not run again; its earlier result is used and marked ``reused``.
    """
    now = now or datetime.now(timezone.utc)
    out_dir.mkdir(parents=True, exist_ok=True)
    hardware, model = prepare_invocation(config)
    specs = expand(config)
    runs = schedule(specs, config.repeats)
    raw: dict[str, list[dict[str, Any]]] = {spec.label: [] for spec in specs}
    with worker_processes(len(runs), "bench", "config", out_dir, progress) as processes:
        for index, spec in enumerate(runs, start=1):
            processes.begin(spec)
            run_dir = out_dir / "runs" / f"{spec.slug}_r{spec.repeat}"
            too_big = no_offload_skip_reason(config, model, hardware, spec.devices)
            not_here = devices_skip_reason(spec, config, hardware)
            if resume and (prior := reusable_result(config, spec, run_dir)):
                result = {**prior, "log": relative_path(prior["log"], out_dir)}  # on disk: reused even after Ctrl-C
            elif not_here and not processes.interrupted:
                result = {**skipped(spec, not_here), "log": None}
            elif too_big and KINDS[spec.strategy].keeps_states_on_device and not processes.interrupted:
                result = {**skipped(spec, too_big), "log": None}
            else:
                result = processes.run(spec, lambda spec=spec, run_dir=run_dir: launcher(config, spec, run_dir))
            raw[spec.label].append(result)
            processes.done(run_line(index, len(runs), result, config))
    results = [aggregate(spec, raw[spec.label], config, model) for spec in specs]
    base = compare_to_baseline(results)
    timing = phase_timing_note(config, hardware, [r["device"] for r in results if r.get("device")])
    doc = bench_document(hardware, versions(), config, model, results, now.isoformat(timespec="seconds"), timing)
    doc["interrupted"] = processes.interrupted
    doc["reused"] = sorted({r["label"] for runs_ in raw.values() for r in runs_ if r.get("reused")})
    if (section := scaling(results)) is not None:  # more than one device count ran
        doc["scaling"] = section
    write_bench_outputs(doc, base, out_dir)
    return doc


def write_bench_outputs(doc: dict[str, Any], base: dict[str, Any] | None, out_dir: Path) -> dict[str, Path]:
    """results.json, chart.png, iteration_timeline.png (when a configuration recorded one), rank_timelines.png (when
    DOS auto ran on several devices), report.md and its dated copy; returns their paths by kind."""
    paths = {"results": out_dir / "results.json", "chart": out_dir / "chart.png", "report": out_dir / "report.md"}
    write_json(paths["results"], doc)
    chart.render(doc, paths["chart"])
    figures = {"timeline": (out_dir / "iteration_timeline.png", chart.render_timeline),
               "rank_timelines": (out_dir / "rank_timelines.png", chart.render_rank_timelines)}
    for kind, (path, render) in figures.items():
        path.unlink(missing_ok=True)  # an earlier invocation's, in the same --out: never linked for this one
        if render(doc, path) is not None:
            paths[kind] = path
    text = report.render(doc, base, chart=paths["chart"].name,
                         timeline=paths["timeline"].name if "timeline" in paths else None,
                         rank_timelines=paths["rank_timelines"].name if "rank_timelines" in paths else None)
    paths["report"].write_text(text, encoding="utf-8")
    paths["named_report"] = out_dir / report.report_name(doc)
    paths["named_report"].write_text(text, encoding="utf-8")
    return paths


def dry_run_text(config: BenchConfig) -> str:
    """The resolved configuration and the configurations it expands to, for ``--dry-run``."""
    specs = expand(config)
    lines = ["resolved configuration:", json.dumps(config.to_dict(), indent=2), "",
             f"model: {json.dumps(describe_model(config))}", "",
             f"iterations of each run: {config.warmup} warm-up, then {config.e2e_count} end to end (unsynchronised), "
             f"then {len(config.phase_iterations)} phase by phase (synchronised)", "",
             f"{len(specs)} configurations x {config.repeats} repeat(s), device counts "
             f"{', '.join(str(d) for d in config.devices)}:"]
    hardware = hardware_info() if any(d > 1 for d in config.devices) else {}
    for spec in specs:
        line = f"  {spec.label:<28} strategy={spec.strategy} plan={spec.plan} devices={spec.devices}"
        reason = devices_skip_reason(spec, config, hardware)
        lines.append(line + (f"  (skipped: {reason})" if reason else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------ plan sweep

def budgets_of(sweep: SweepConfig) -> list[Budget]:
    """The sweep's budgets resolved for its model."""
    params = describe_model(sweep.bench)["params"]
    return [resolve_budget(text, params) for text in sweep.budgets]


def process_spec(sweep: SweepConfig, budget: Budget) -> RunSpec:
    """The process of ``budget``: DOS started with the first plan (the sweep switches from there)."""
    return RunSpec(label=f"sweep[{budget.name}]", strategy="deep_optimizer_states", plan=sweep.plans[0])


def with_progress(result: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A process result that lacks the sweep's records, completed from the worker's ``progress.json``."""
    if result.get("sweep") or result.get("status") == "ok":
        return result
    try:
        progress = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return result
    return {**result, "sweep": progress}


def budget_line(index: int, total: int, budget: Budget, summary: dict[str, Any], result: dict[str, Any]) -> str:
    """One line summarising a finished budget process: the fixed plans and ``auto``."""
    head = f"[{index}/{total}] {budget.label}:"
    plans = summary["plans"]
    done = sum(p["status"] == "ok" for p in plans)
    best = summary["best"]
    a = summary["auto"]
    if result.get("status") != "ok":
        where = summary["fixed"].get("failed_plan")
        return (f"{head} {str(result.get('status')).upper()}: {result.get('reason')}"
                + (f" during plan {where}" if where else "") + f"; {done}/{len(plans)} fixed plans completed"
                + elapsed_note(result))
    best_text = f"best {best['plan']} {best['update_ms']:.1f} ms" if best else "no plan measured"
    error = summary["prediction_error_median"]
    error_text = f", median prediction error {error:.1%}" if error is not None else ""
    auto_text = (f"auto {a['update_ms']:.1f} ms" if a["update_ms"] is not None else "auto: no measured update phase")
    fraction = f" (device fraction {a['device_fraction']:.2f})" if a["device_fraction"] is not None else ""
    return (f"{head} ok  {done}/{len(plans)} fixed plans, {best_text}{error_text}; {auto_text}{fraction}"
            f"{elapsed_note(result)}")


def run_sweep(sweep: SweepConfig, out_dir: Path, launcher: Launcher = launch, progress: bool = True,
              now: datetime | None = None) -> dict[str, Any]:
    """Run the sweep's processes; write sweep.json, sweep.md and sweep.png under ``out_dir``; return the JSON."""
    now = now or datetime.now(timezone.utc)
    out_dir.mkdir(parents=True, exist_ok=True)
    hardware, model = prepare_invocation(sweep.bench)
    software = versions()
    budgets = budgets_of(sweep)
    if not budgets:
        raise ValueError("sweep: give at least one budget")
    summaries: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    extra = {"sweep": {"plans": list(sweep.plans), "steps_per_plan": sweep.steps_per_plan,
                       "auto_steps": sweep.auto_steps}}
    with worker_processes(len(budgets), "sweep", "process", out_dir, progress) as processes:
        for index, budget in enumerate(budgets, start=1):
            spec, config = process_spec(sweep, budget), sweep.process_config(budget)
            processes.begin(spec)
            run_dir = out_dir / "runs" / budget.slug

            def launch_it(config: BenchConfig = config, spec: RunSpec = spec,
                          run_dir: Path = run_dir) -> dict[str, Any]:
                (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier run's, in the same --out
                return launcher(config, spec, run_dir, extra=extra)

            result = processes.run(spec, launch_it, lambda result, run_dir=run_dir: with_progress(result, run_dir))
            if result.get("device"):
                devices.append(result["device"])
            summary = summarize_budget(budget, result, sweep)
            processes.done(budget_line(index, len(budgets), budget, summary, result))
            summaries.append(summary)
            # after every budget, so a sweep stopped from outside still leaves the budgets it finished
            doc = sweep_document(hardware, software, sweep, model, summaries, now.isoformat(timespec="seconds"),
                                 phase_timing_note(sweep.bench, hardware, devices), processes.interrupted)
            doc["budgets_planned"] = [b.to_dict() for b in budgets]
            write_sweep_outputs(doc, out_dir)
    return doc


def write_sweep_outputs(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """sweep.json, sweep.png and sweep.md; returns their paths by kind."""
    paths = {"json": out_dir / "sweep.json", "chart": out_dir / "sweep.png", "report": out_dir / "sweep.md"}
    write_json(paths["json"], doc)
    chart.render_sweep(doc, paths["chart"])
    paths["report"].write_text(report.render_sweep(doc, chart=paths["chart"].name), encoding="utf-8")
    return paths


def sweep_dry_run_text(sweep: SweepConfig) -> str:
    """The resolved settings, the budgets in GiB and the processes the sweep would run, for ``--dry-run``."""
    model = describe_model(sweep.bench)
    budgets = budgets_of(sweep)
    lines = ["resolved configuration:", json.dumps({"bench": sweep.bench.to_dict(), "sweep": sweep.to_dict()},
                                                    indent=2), "",
             f"model: {model['preset']}, {model['params']:,} parameters", "",
             f"{len(budgets)} processes, one per budget, each {sweep.process_steps} iterations:"]
    for budget in budgets:
        lines.append(f"  {budget.label:<24} fixed plans: {len(sweep.plans)} plans x {sweep.steps_per_plan} rounds "
                     f"= {sweep.fixed_steps} iterations ({', '.join(sweep.plans)})")
        lines.append(f"  {budget.label:<24} auto, started cold, spread over rounds 2-{sweep.steps_per_plan}: "
                     f"{sweep.auto_steps} iterations, the first {sweep.auto_excluded} left out")
    return "\n".join(lines)
