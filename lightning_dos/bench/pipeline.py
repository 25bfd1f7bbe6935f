"""Owns what every mode's invocation shares: the host and workload resolved once, worker processes one at a time,
the JSON document and its outputs.

A comparison, a sweep and a ROK curve give :class:`Pipeline` their runs; each is reused (``--resume``: an earlier one
that ran exactly the same ``lightning-dos fit`` and settings, :func:`reusable`), skipped with its reason, or launched
in a fresh worker process, under a progress bar. After Ctrl-C or SIGTERM the rest are reported as not run. Each mode's
document has the same head (:meth:`Pipeline.document`) and is written as JSON, a chart and a report
(:func:`write_outputs`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lightning_dos.bench.compose import describe, payload
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import RunSpec
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.results import skipped, write_json
from lightning_dos.telemetry.environment import hardware_info, merge_worker_device, versions

SCHEMA_VERSION = 1
GPU_TIMING = ("GPU: torch.cuda.synchronize() is called at every phase boundary (bench mode), so each phase's "
              "kernels are charged to it; this costs a little and removes overlap across boundaries, so these "
              "iteration times are slightly above the unsynchronised end-to-end ones.")
CPU_TIMING = "CPU: no device to synchronise; phase times are host wall-clock between the Lightning hooks."
#: ``launcher(config, spec, run_dir)`` (with ``extra=`` for a sweep's or a ROK curve's runs): :func:`launch`.
Launcher = Callable[..., dict[str, Any]]
#: Bench settings that choose which runs there are or how long they may take, not what one measures.
NOT_MEASUREMENT = ("strategies", "ratios", "plans", "overlap", "leaf_blocks", "resident_gib", "repeats",
                   "force_no_offload", "timeout_s", "out", "recipe", "devices")


def default_out_dir(mode: str, config: BenchConfig, now: datetime) -> Path:
    """``runs/<mode>/<model or recipe>_<YYYYmmdd-HHMMSS>`` under the current directory."""
    name = config.model or (Path(config.recipe).stem if config.recipe else "gpt-2.7b")
    return Path("runs") / mode / f"{name}_{now:%Y%m%d-%H%M%S}"


def prepare(config: BenchConfig) -> tuple[dict[str, Any], BenchConfig, dict[str, Any]]:
    """The host, ``config`` with its workload resolved (the recipe's value wherever no flag was given) and the
    model of an invocation; its data prepared once first (a corpus tokenised)."""
    workload, model = describe(config)
    resolved = {key: value for key, value in workload.items() if getattr(config, key) is None}
    return hardware_info(), dataclasses.replace(config, **resolved), model


def uses_gpu(config: BenchConfig, hardware: dict[str, Any]) -> bool:
    """Whether the workers of a resolved ``config`` will run on a GPU."""
    if config.accelerator in ("gpu", "cuda"):
        return True
    return config.accelerator == "auto" and bool(hardware.get("gpu_count"))


def timing_note(config: BenchConfig, hardware: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """How phases were timed, from the devices the workers reported (merged into ``hardware``)."""
    merge_worker_device(hardware, devices[0] if devices else None)
    on_gpu = any(d.get("type") == "cuda" for d in devices) or (not devices and uses_gpu(config, hardware))
    return GPU_TIMING if on_gpu else CPU_TIMING


def relative_path(path: str | None, root: Path) -> str | None:
    """``path`` relative to ``root`` where it lies under it."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def write_outputs(doc: dict[str, Any], out_dir: Path, names: Sequence[str], draw: Callable[[dict[str, Any], Path], Any],
                  render: Callable[..., str], figures: dict[str, tuple[str, Callable[..., Any]]] | None = None,
                  copy: str | None = None) -> dict[str, Path]:
    """A mode's outputs under ``out_dir``: the JSON of ``doc``, its chart (``draw``) and its report (``render``,
    linking the chart), named by ``names``; ``figures``: further charts by kind, each linked only when drawn (an
    earlier invocation's removed); ``copy``: a second name of the report. Returns their paths by kind."""
    paths = {kind: out_dir / name for kind, name in zip(("json", "chart", "report"), names)}
    write_json(paths["json"], doc)
    draw(doc, paths["chart"])
    links = {}
    for kind, (name, figure) in (figures or {}).items():
        path = out_dir / name
        path.unlink(missing_ok=True)  # an earlier invocation's, in the same --out: never linked for this one
        if figure(doc, path) is not None:
            paths[kind], links[kind] = path, name
    text = render(doc, chart=paths["chart"].name, **links)
    paths["report"].write_text(text, encoding="utf-8")
    if copy:
        paths["copy"] = out_dir / copy
        paths["copy"].write_text(text, encoding="utf-8")
    return paths


def elapsed_note(result: dict[str, Any]) -> str:
    return f" ({result['elapsed_s']:.0f} s)" if result.get("elapsed_s") is not None else ""


def _comparable(entry: dict[str, Any]) -> dict[str, Any]:
    """A worker's ``config.json`` as ``--resume`` compares it: the config files by content, not by path."""
    fit = entry.get("fit") or {}
    args = fit.get("args") or []
    bench = {key: value for key, value in (entry.get("bench") or {}).items() if key not in NOT_MEASUREMENT}
    return {**{key: value for key, value in entry.items() if key not in ("bench", "fit")}, "bench": bench,
            "args": [a for i, a in enumerate(args) if not (i and args[i - 1] == "--config")],
            "configs": list((fit.get("configs") or {}).values())}


def reusable(config: BenchConfig, spec: RunSpec, run_dir: Path,
             extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The result an earlier run left in ``run_dir``, if it completed and ran exactly what ``spec`` would now (the same
    ``lightning-dos fit``, row and measurement settings) with every end time its headline needs; else None."""
    try:
        earlier = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if result.get("status") != "ok" or (config.e2e_count and "end_s" not in (result.get("iterations") or {})):
        return None
    if _comparable(earlier) != _comparable(payload(config, spec, run_dir, extra, write=False)):
        return None
    return {**result, "reused": True, "log": str(run_dir / "worker.log")}


class Pipeline:
    """An invocation (a context manager): its host, workload and model resolved once (:func:`prepare`), its worker
    processes one at a time under a progress bar per :meth:`stage`, and the head of its JSON document."""

    def __init__(self, config: BenchConfig, out_dir: Path, launcher: Launcher = launch, resume: bool = False,
                 progress: bool = True, now: datetime | None = None) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.hardware, self.resolved, self.model = prepare(config)
        self.versions = versions()
        self.date = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
        self.out_dir, self.launcher, self.resume, self.progress = out_dir, launcher, resume, progress
        self.mode = ""
        self.bar: Any = None
        self.interrupted = False
        self.devices: list[dict[str, Any]] = []  # the devices the workers reported, for timing_note

    def stage(self, mode: str, unit: str, total: int | None = None) -> None:
        """Start the progress bar of ``mode``'s processes (``unit`` each), ending the previous stage's."""
        if self.bar is not None:
            self.bar.close()
        self.mode = mode
        self.bar = tqdm(total=total, desc=mode, unit=unit, disable=not self.progress, dynamic_ncols=True)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()

    def document(self, kind: str | None, measurement: dict[str, Any], **rest: Any) -> dict[str, Any]:
        """The mode's JSON document: schema, kind (None: a comparison's, which predates kinds), date, host, versions,
        the settings with the workload resolved, the model, how it measured (ending with how the phases were timed),
        then the mode's own entries."""
        timing = timing_note(self.resolved, self.hardware, self.devices)
        return {"schema_version": SCHEMA_VERSION, **({"kind": kind} if kind else {}), "date": self.date,
                "hardware": self.hardware, "versions": self.versions, "config": self.resolved.to_dict(),
                "model": self.model, "measurement": {**measurement, "timing": timing}, **rest}

    def run(self, config: BenchConfig, spec: RunSpec, run_dir: Path, extra: dict[str, Any] | None = None,
            skip: str | None = None,
            complete: Callable[[dict[str, Any]], dict[str, Any]] = lambda result: result) -> dict[str, Any]:
        """The result of ``spec``: reused (``--resume``, even after an interruption: it is on disk), ``skipped``
        (after an interruption, or for ``skip``'s reason) or launched (``complete`` then fills it in)."""
        self.bar.set_postfix_str(spec.label)
        prior = reusable(config, spec, run_dir, extra) if self.resume else None
        if prior is not None:
            result = prior
        elif self.interrupted:
            result = skipped(spec, f"not run: the {self.mode} was interrupted")
        elif skip is not None:
            result = skipped(spec, skip)
        else:
            try:
                result = complete(self.launcher(config, spec, run_dir, **({"extra": extra} if extra else {})))
            except KeyboardInterrupt:  # the worker is already stopped; report what ran
                self.interrupted = True
                result = complete(skipped(spec, "interrupted while running"))
        result["log"] = relative_path(result.get("log"), self.out_dir)
        if result.get("device"):
            self.devices.append(result["device"])
        return result

    def done(self, line: str) -> None:
        """Print ``line`` above the progress bar and count the process done."""
        self.bar.write(line)
        self.bar.update(1)
