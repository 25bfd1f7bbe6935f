"""Runs a recipe as a user would (``lightning-dos fit --config ...`` in a fresh process, or in this one), with small
overrides.

Shared by the CPU resume tests and the GPU tier: a recipe is copied with a few values changed (steps, validation
interval, checkpoint interval, where logs and checkpoints go) and everything else kept, so the recipe's own code
path runs.
"""

from __future__ import annotations

import csv
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: The command a strategy fragment's header gives to try it: ``lightning-dos fit --config RECIPE --config FRAGMENT``.
FRAGMENT_COMMAND = re.compile(
    r"^#\s+lightning-dos fit --config (recipes/\S+\.yaml) --config (configs/strategy/\S+\.yaml)$", re.MULTILINE)

#: Extra arguments a recipe's own header says to add on a GPU.
ON_A_GPU = {"quickstart": ("--trainer.precision", "bf16-mixed")}


def fragment_recipe(fragment: Path) -> Path | None:
    """The recipe ``fragment``'s header tries it on, or None where its header names no command for itself."""
    match = FRAGMENT_COMMAND.search(fragment.read_text())
    return ROOT / match.group(1) if match and match.group(2) == f"configs/strategy/{fragment.name}" else None


def recipe_copy(recipe: Path, out: Path, *, max_steps: int, every_n_train_steps: int | None = None,
                checkpoints: bool = True, **trainer: Any) -> Path:
    """``recipe`` with ``max_steps``, the checkpoint interval and any trainer value replaced; logs and checkpoints
    under ``out``. ``checkpoints=False`` drops the recipe's ``ModelCheckpoint`` (its ``save_last`` would still write
    one when training ends) and turns checkpointing off: nothing is written. Returns the path of the copy."""
    config = yaml.safe_load(recipe.read_text())
    t = config["trainer"]
    t["max_steps"] = max_steps
    t.update(trainer)
    t["logger"]["init_args"]["save_dir"] = str(out / "runs")
    if not checkpoints:
        t["callbacks"] = [c for c in t.get("callbacks") or [] if not c["class_path"].endswith("ModelCheckpoint")]
        t["enable_checkpointing"] = False
    for callback in t.get("callbacks") or []:
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["dirpath"] = str(out / "checkpoints")
            if every_n_train_steps is not None:
                callback["init_args"]["every_n_train_steps"] = every_n_train_steps
    path = out / recipe.name
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


DEBUG = ROOT / "recipes" / "debug.yaml"


def debug_with_checkpoints(out: Path, max_steps: int, horizon: int = 6, every: int = 2, **trainer: Any) -> Path:
    """The debug recipe with a checkpoint every ``every`` steps, stopping at ``max_steps``, its learning-rate schedule
    planned for ``horizon`` steps whatever the stop (so a stopped and a whole run share it)."""
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"filename": "{step}", "every_n_train_steps": every, "save_top_k": 1,
                                "save_last": "link"}}
    config = recipe_copy(DEBUG, out, max_steps=max_steps, enable_checkpointing=True, callbacks=[checkpoint],
                         val_check_interval=100, num_sanity_val_steps=0, **trainer)
    config.write_text(config.read_text().replace("model:\n", f"model:\n  max_steps: {horizon}\n", 1))
    return config


def fit(config: Path, *extra: str, timeout: float = 600,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``lightning-dos fit --config config extra...`` in a fresh process, from the config's folder."""
    return run_fit([sys.executable, "-m", "lightning_dos"], config, *extra, timeout=timeout, env=env)


def fit_here(config: Path, *extra: str) -> None:
    """``lightning-dos fit --config config extra...`` in this process, from the config's folder: for the runs that
    need no process of their own (the one killed does; what resumes after it, or the run it is compared with, do
    not). Its log lines reach this process's standard error."""
    from lightning_dos.cli import main

    cwd = Path.cwd()
    os.chdir(config.parent)
    try:
        main(["fit", "--config", str(config), *extra])
    finally:
        os.chdir(cwd)


def run_fit(program: list[str], config: Path, *extra: str, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``program fit --config config extra...`` (``program``: the command line of ``lightning-dos`` or a stand-in)."""
    command = [*program, "fit", "--config", str(config), *extra]
    return subprocess.run(command, cwd=config.parent, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def metrics(out: Path, name: str) -> list[dict[str, str]]:
    """Rows of the newest ``metrics.csv`` of the run called ``name`` under ``out/runs``."""
    versions = sorted((out / "runs" / name).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise FileNotFoundError(f"no run {name!r} under {out / 'runs'}")
    with open(versions[-1] / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def series(rows: Sequence[dict[str, str]], key: str) -> dict[int, float]:
    """``key`` by step, for the rows that log it."""
    return {int(row["step"]): float(row[key]) for row in rows if row.get(key) not in (None, "")}


def finite(values: dict[int, float]) -> bool:
    return bool(values) and all(math.isfinite(v) for v in values.values())


def summary(rows: Sequence[dict[str, str]], skip: int = 3) -> dict[str, Any]:
    """A run's figures as a recipe header reports them: median ``perf/iteration_ms`` and ``perf/tokens_per_s`` after
    the first ``skip`` steps (warm-up), peak GPU and host memory, the first and last logged validation loss (the sanity
    check's is not logged: ``ValLossReport`` prints it), the last train loss."""
    import statistics

    def median_after(key: str) -> float | None:
        values = [v for step, v in series(rows, key).items() if step >= skip]
        return statistics.median(values) if values else None

    def last(values: dict[int, float]) -> float | None:
        return values[max(values)] if values else None

    val = series(rows, "val/loss")
    peaks = {key: max(series(rows, key).values(), default=None) for key in ("perf/peak_gpu_gib", "perf/peak_host_gib")}
    return {"steps": len(series(rows, "train/loss")), "iteration_ms": median_after("perf/iteration_ms"),
            "tokens_per_s": median_after("perf/tokens_per_s"), "update_ms": median_after("dos/update_ms"),
            "peak_gpu_gib": peaks["perf/peak_gpu_gib"], "peak_host_gib": peaks["perf/peak_host_gib"],
            "val_loss_first": val[min(val)] if val else None, "val_loss_last": last(val),
            "train_loss_last": last(series(rows, "train/loss"))}
