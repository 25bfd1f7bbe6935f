"""Owns what every study's invocation shares: the workload and host resolved once, worker processes one at a time
under a progress bar, ``--resume``, ``--dry-run``, the head of the JSON document and the outputs beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lightning_dos.bench import report
from lightning_dos.bench.compose import describe, payload
from lightning_dos.bench.launcher import launch
from lightning_dos.bench.results import read_json, skipped, write_json
from lightning_dos.bench.settings import Run, Settings, parse_set
from lightning_dos.telemetry.environment import hardware_info, measured_env, merge_worker_device, versions

SCHEMA_VERSION = 1
GPU_TIMING = ("GPU: torch.cuda.synchronize() is called at every phase boundary (bench mode), so each phase's "
              "kernels are charged to it; this costs a little and removes overlap across boundaries, so these "
              "iteration times are slightly above the unsynchronised end-to-end ones.")
CPU_TIMING = "CPU: no device to synchronise; phase times are host wall-clock between the Lightning hooks."
#: ``launcher(payload, run_dir, timeout_s)`` -> the raw result: :func:`~lightning_dos.bench.launcher.launch`.
Launcher = Callable[[dict[str, Any], Path, float], dict[str, Any]]
#: Statuses of a run that finished: ``--resume`` may reuse one (a study that re-runs failures reuses ``ok`` only).
FINISHED = ("ok", "oom", "failed", "timeout")


def _comparable(entry: dict[str, Any]) -> dict[str, Any]:
    """A worker's ``config.json`` as ``--resume`` compares it: the config files by content, not by path."""
    fit = entry.get("fit") or {}
    args = fit.get("args") or []
    return {"run": entry.get("run"), "args": [a for i, a in enumerate(args) if not (i and args[i - 1] == "--config")],
            "configs": list((fit.get("configs") or {}).values())}


def reusable(wanted: dict[str, Any], run_dir: Path, statuses: Sequence[str] = ("ok",),
             timeout_s: float | None = None) -> dict[str, Any] | None:
    """The result an earlier run left in ``run_dir`` if it ended with one of ``statuses`` running exactly the
    payload ``wanted`` (the same ``lightning-dos fit`` and windows); else None. A timeout is reused only under a
    ``timeout_s`` no longer than the one it ran out of: a longer one runs it again."""
    earlier, result = read_json(run_dir / "config.json"), read_json(run_dir / "result.json")
    finished = earlier and result and result.get("status") in statuses
    if not finished or _comparable(earlier) != _comparable(wanted):
        return None
    if result.get("status") == "timeout" and timeout_s is not None and (result.get("timeout_s") or 0) < timeout_s:
        return None
    return {**result, "reused": True, "log": str(run_dir / "worker.log")}


class Runner:
    """One invocation of a study (a context manager): its workload, model and host resolved once, its runs one at a
    time under a progress bar per :meth:`stage`, and its document's head."""

    def __init__(self, settings: Settings, resume: bool = False, dry_run: bool = False, progress: bool = True,
                 launcher: Launcher | None = None, now: datetime | None = None) -> None:
        self.settings, self.resume, self.dry_run, self.progress, self.launcher = (settings, resume, dry_run, progress,
                                                                                  launcher)
        self.overrides = [parse_set(text) for text in settings.set]  # values as YAML reads them
        self.workload, self.model, self.batches = self.describe({})
        self.hardware, self.versions, self.environment = hardware_info(), versions(), measured_env()
        now = now or datetime.now(timezone.utc)
        self.date = now.isoformat(timespec="seconds")
        self.out_dir = Path(settings.out or Path("runs") / settings.study / f"{Path(settings.recipe).stem}_"
                            f"{now:%Y%m%d-%H%M%S}")
        settings.out = str(self.out_dir)
        self.bar: Any = None
        self.interrupted = False
        self.completed = self.made = 0  # runs that completed, of those launched or reused
        self.devices: list[dict[str, Any]] = []  # the devices the workers reported, for the timing note

    def describe(self, sets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """The workload and model of the recipe with ``--set`` and then ``sets`` (a study's, e.g. a model size)."""
        return describe(self.settings.recipe, {**dict(self.overrides), **sets})

    @property
    def tokens(self) -> int:
        """Tokens one iteration trains on, per device."""
        return int(self.workload["micro_batch"]) * int(self.workload["seq_len"])

    def stage(self, name: str, unit: str, total: int | None = None) -> None:
        """Start the progress bar of ``name``'s runs (``unit`` each), ending the previous stage's."""
        if self.bar is not None:
            self.bar.close()
        self.bar = tqdm(total=total, desc=name, unit=unit, disable=not self.progress or self.dry_run,
                        dynamic_ncols=True)

    def __enter__(self) -> Runner:
        if not self.dry_run:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()

    def run(self, spec: Run, run_dir: Path, reuse: Sequence[str] = ("ok",),
            complete: Callable[[dict[str, Any]], dict[str, Any]] = lambda result: result) -> dict[str, Any]:
        """The raw result of ``spec``: reused (``--resume``: :func:`reusable`, a status in ``reuse``), not run (its
        ``skip``; a dry run, whose command is printed instead; after Ctrl-C or SIGTERM) or launched in a fresh worker
        process (:func:`~lightning_dos.bench.launcher.launch`; ``complete`` then fills it in)."""
        self.bar.set_postfix_str(spec.label)
        if spec.skip is not None:
            return skipped(spec, spec.skip)
        wanted = payload(self.settings.recipe, spec, run_dir, self.batches)
        prior = reusable(wanted, run_dir, reuse, self.settings.timeout_s) if self.resume else None
        if prior is not None:
            result = prior
            self.made += 1
        elif self.dry_run:
            print(f"{spec.label}: {wanted['fit']['command']}")
            result = skipped(spec, "dry run")
        elif self.interrupted:
            result = skipped(spec, "not run: the study was interrupted")
        else:
            self.made += 1
            try:
                result = complete((self.launcher or launch)(wanted, run_dir, self.settings.timeout_s))
            except KeyboardInterrupt:  # the worker is already stopped; report what ran
                self.interrupted = True
                result = complete(skipped(spec, "interrupted while running"))
            if run_dir.is_dir():  # the worker's figures with the launcher's: what --resume reuses
                write_json(run_dir / "result.json", result)
        if result.get("log"):
            result["log"] = relative_path(result["log"], self.out_dir)
        self.completed += result.get("status") == "ok"
        if result.get("device"):
            self.devices.append(result["device"])
        return result

    def done(self, label: str, result: dict[str, Any], **figures: Any) -> None:
        """Count a run done and print a line of its outcome above the progress bar: its ``figures`` if it completed
        (None left out), else its status and why."""
        self.bar.update(1)
        head = f"[{self.bar.n}/{self.bar.total or '?'}] {label}" + (" (reused)" if result.get("reused") else "")
        if result.get("status") != "ok":
            text = f"{head}: {str(result.get('status')).upper()}: {result.get('reason')}"
        else:
            text = f"{head}: ok  " + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in figures.items()
                                               if value is not None)
        if not self.dry_run:
            self.bar.write(text + (f" ({result['elapsed_s']:.0f} s)" if result.get("elapsed_s") else ""))

    def write(self, kind: str | None, measurement: dict[str, Any], names: tuple[str, str, str],
              draw: Callable[[dict[str, Any], Path], Any], tables: Callable[[dict[str, Any]], Sequence[report.Table]],
              **rest: Any) -> dict[str, Any]:
        """A study's JSON document, written under ``--out`` (not in a dry run) with ``names`` = (the JSON, the chart
        ``draw`` draws, the report of its ``tables``). The document: schema, kind (None: a comparison's, which predates
        kinds), date, host, versions, the settings with the workload resolved, the model, how it measured (ending with
        how the phases were timed), whether it was interrupted, then the study's own entries (``rest``)."""
        merge_worker_device(self.hardware, self.devices[0] if self.devices else None)
        on_gpu = any(d.get("type") == "cuda" for d in self.devices) or (not self.devices and self.uses_gpu)
        doc = {"schema_version": SCHEMA_VERSION, **({"kind": kind} if kind else {}), "date": self.date,
               "hardware": self.hardware, "versions": self.versions,
               **({"environment": self.environment} if self.environment else {}),
               "config": {**self.settings.to_dict(), **self.workload}, "model": self.model,
               "measurement": {**measurement, "timing": GPU_TIMING if on_gpu else CPU_TIMING},
               "interrupted": self.interrupted, **rest}
        if not self.dry_run:
            json_name, chart_name, report_name = names
            write_json(self.out_dir / json_name, doc)
            draw(doc, self.out_dir / chart_name)
            (self.out_dir / report_name).write_text(report.render(doc, tables(doc), chart_name, json_name),
                                                    encoding="utf-8")
        return doc

    @property
    def uses_gpu(self) -> bool:
        """Whether the workers will run on a GPU."""
        accelerator = self.workload.get("accelerator")
        return accelerator in ("gpu", "cuda") or (accelerator == "auto" and bool(self.hardware.get("gpu_count")))


def relative_path(path: str, root: Path) -> str:
    """``path`` relative to ``root`` where it lies under it."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path

