"""Owns one bench invocation end to end: configurations in, results.json, report and chart out.

Describes the host and the model, prepares text data once if asked for, runs every configuration (each
repeat in its own worker process, round-robin) under a progress bar with a one-line summary per run,
aggregates the repeats, compares against vanilla ``zero3_offload`` and writes the outputs under ``out``.
Also decides, before spending a run on it, whether ``no_offload`` can possibly fit on the GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lightning_dos.bench import chart, report
from lightning_dos.bench.claims import check_claims
from lightning_dos.bench.config import BenchConfig, RunSpec, expand, schedule
from lightning_dos.bench.data import prepare_text
from lightning_dos.bench.environment import hardware_info, merge_worker_device, versions
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.model import NO_OFFLOAD_BYTES_PER_PARAM, describe_model
from lightning_dos.bench.results import aggregate, compare_to_baseline, document, skipped
from lightning_dos.bench.stats import median
from lightning_dos.bench.worker import write_json

GPU_TIMING = ("GPU: torch.cuda.synchronize() is called at every phase boundary (bench mode), so each phase's "
              "kernels are charged to it; this costs a little and removes overlap across boundaries, so "
              "iteration times are slightly above an unsynchronised run's.")
CPU_TIMING = "CPU: no device to synchronise; phase times are host wall-clock between the Lightning hooks."

Launcher = Callable[[BenchConfig, RunSpec, Path], dict[str, Any]]


def default_out_dir(config: BenchConfig, now: datetime) -> Path:
    """``runs/bench/<model>_<YYYYmmdd-HHMMSS>`` under the current directory."""
    return Path("runs") / "bench" / f"{config.model}_{now:%Y%m%d-%H%M%S}"


def uses_gpu(config: BenchConfig, hardware: dict[str, Any]) -> bool:
    """Whether the workers will run on a GPU."""
    if config.accelerator in ("gpu", "cuda"):
        return True
    return config.accelerator == "auto" and bool(hardware.get("gpu_count"))


def no_offload_skip_reason(config: BenchConfig, model: dict[str, Any], hardware: dict[str, Any]) -> str | None:
    """Why no_offload cannot fit (so it is not run), or None to run it."""
    total = hardware.get("gpu_memory_gib")
    if config.force_no_offload or not uses_gpu(config, hardware) or not total:
        return None
    need = model["no_offload_state_gib_lower_bound"]
    if need <= total:
        return None
    return (f"does not fit: model and optimizer state alone need >= {need:.1f} GiB "
            f"({NO_OFFLOAD_BYTES_PER_PARAM} B/param) but the GPU has {total:.1f} GiB (--force-no-offload runs it)")


def run_line(index: int, total: int, result: dict[str, Any], config: BenchConfig) -> str:
    """One line summarising a finished run, printed as it completes."""
    head = f"[{index}/{total}] {result['label']}"
    if config.repeats > 1:
        head += f" (repeat {result.get('repeat', 0) + 1})"
    if result.get("reused"):
        head += " (reused from an earlier invocation)"
    elapsed = f" ({result['elapsed_s']:.0f} s)" if result.get("elapsed_s") is not None else ""
    if result["status"] != "ok":
        return f"{head}: {result['status'].upper()}: {result.get('reason')}{elapsed}"
    it = {k: median(v[config.warmup:]) for k, v in result["iterations"].items()}
    tokens_per_s = config.tokens_per_iteration / (it["iteration_ms"] / 1e3) if it["iteration_ms"] else None
    gpu = result.get("peak_gpu_gib")
    memory = (f"peak GPU {gpu:.2f} GiB, " if gpu is not None else "") + f"host {result['peak_host_gib']:.2f} GiB"
    return (f"{head}: ok  iteration {it['iteration_ms']:.1f} ms (fwd {it['fwd_ms']:.1f} | bwd {it['bwd_ms']:.1f} | "
            f"step {it['step_ms']:.1f})  {tokens_per_s or 0:,.0f} tokens/s  {memory}  "
            f"loss {result['iterations']['loss'][-1]:.4f}{elapsed}")


def _relative(path: str | None, root: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


#: BenchConfig fields that choose which configurations run or how long they may take, not what they measure:
#: a finished configuration is reused by ``--resume`` whatever these say.
NOT_MEASUREMENT = ("strategies", "ratios", "plans", "repeats", "force_no_offload", "timeout_s", "out", "recipe")


def reusable_result(config: BenchConfig, spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """The result a finished earlier run left in ``run_dir``, if it measured ``spec`` under the same settings.

    Only a result with status ``ok`` counts, and only when its ``config.json`` names the same configuration and
    the same measurement settings (every field but :data:`NOT_MEASUREMENT`); anything else is run again.
    """
    try:
        payload = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if result.get("status") != "ok" or payload.get("run") != spec.to_dict():
        return None
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
    hardware = hardware_info()
    if config.data == "text":
        prepare_text(config)
    model = describe_model(config)
    specs = expand(config)
    runs = schedule(specs, config.repeats)
    raw: dict[str, list[dict[str, Any]]] = {spec.label: [] for spec in specs}
    skip_no_offload = no_offload_skip_reason(config, model, hardware)
    interrupted = False
    with tqdm(total=len(runs), desc="bench", unit="config", disable=not progress, dynamic_ncols=True) as bar:
        for index, spec in enumerate(runs, start=1):
            bar.set_postfix_str(spec.label)
            run_dir = out_dir / "runs" / f"{spec.slug}_r{spec.repeat}"
            if resume and (prior := reusable_result(config, spec, run_dir)):
                result = prior  # already on disk: reused even after an interruption, costs no time
            elif interrupted:
                result = skipped(spec, "not run: the bench was interrupted")
            elif spec.strategy == "no_offload" and skip_no_offload:
                result = skipped(spec, skip_no_offload)
            else:
                try:
                    result = launcher(config, spec, run_dir)
                except KeyboardInterrupt:  # the worker is already stopped; report what ran
                    interrupted = True
                    result = skipped(spec, "interrupted while running")
            result["log"] = _relative(result.get("log"), out_dir)
            raw[spec.label].append(result)
            bar.write(run_line(index, len(runs), result, config))
            bar.update(1)
    results = [aggregate(spec, raw[spec.label], config, model) for spec in specs]
    base = compare_to_baseline(results)
    devices = [r["device"] for r in results if r.get("device")]
    merge_worker_device(hardware, devices[0] if devices else None)
    on_gpu = any(d.get("type") == "cuda" for d in devices) or (not devices and uses_gpu(config, hardware))
    doc = document(hardware, versions(), config, model, results, now.isoformat(timespec="seconds"),
                   GPU_TIMING if on_gpu else CPU_TIMING)
    doc["interrupted"] = interrupted
    doc["reused"] = sorted({r["label"] for runs_ in raw.values() for r in runs_ if r.get("reused")})
    doc["claims"] = check_claims(results)
    write_outputs(doc, base, out_dir)
    return doc


def write_outputs(doc: dict[str, Any], base: dict[str, Any] | None, out_dir: Path) -> dict[str, Path]:
    """results.json, chart.png, report.md and its dated copy; returns their paths by kind."""
    paths = {"results": out_dir / "results.json", "chart": out_dir / "chart.png", "report": out_dir / "report.md"}
    write_json(paths["results"], doc)
    chart.render(doc, paths["chart"])
    text = report.render(doc, base, chart=paths["chart"].name)
    paths["report"].write_text(text, encoding="utf-8")
    paths["named_report"] = out_dir / report.report_name(doc)
    paths["named_report"].write_text(text, encoding="utf-8")
    return paths


def dry_run_text(config: BenchConfig) -> str:
    """The resolved configuration and the configurations it expands to, for ``--dry-run``."""
    specs = expand(config)
    lines = ["resolved configuration:", json.dumps(config.to_dict(), indent=2), "",
             f"model: {json.dumps(describe_model(config))}", "",
             f"{len(specs)} configurations x {config.repeats} repeat(s):"]
    lines += [f"  {spec.label:<24} strategy={spec.strategy} plan={spec.plan}" for spec in specs]
    return "\n".join(lines)
