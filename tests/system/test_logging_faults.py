"""Logging faults: W&B unreachable at the start, failing mid-run, or out of disk: training goes on, the ``dos/*`` and
``perf/*`` numbers reach CSV from the failure on, and one warning says what happened.

The faults are injected at wandb's Python API (``wandb.init`` and ``Run.log`` raise), on the debug recipe run through
the CLI under DOS with configs/logger/wandb.yaml, offline.
"""

from __future__ import annotations

import errno
import warnings
from pathlib import Path

import pytest
import wandb
from wandb.sdk.wandb_run import Run as WandbRun

from lightning_dos.cli import DOSLightningCLI
from lightning_dos.telemetry.compare import read_csv_run
from tests.support.wandb_runs import read_finished_wandb_run

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def _fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DOSLightningCLI, list[str]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = DOSLightningCLI(args=["fit", "--config", str(ROOT / "recipes" / "debug.yaml"), "--config",
                                    str(ROOT / "configs" / "logger" / "wandb.yaml"), "--trainer.max_steps",
                                    str(STEPS), "--trainer.enable_progress_bar", "false"])
    if wandb.run is not None:
        wandb.run.finish()
    said = [str(w.message) for w in caught if str(w.message).startswith("W&B:")]
    return cli, said


def _csv_keys(cli: DOSLightningCLI) -> tuple[set[str], list[int]]:
    csv = cli.trainer.logger.failed_over
    assert csv is not None, "the logger did not fail over to CSV"
    run = read_csv_run(Path(csv.log_dir))
    return set(run.history), sorted(step for step, _ in run.history["train/loss"])


def test_wandb_unreachable_at_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise wandb.errors.CommError("api.wandb.ai unreachable")

    monkeypatch.setattr(wandb, "init", unreachable)
    cli, said = _fit(tmp_path, monkeypatch)
    assert cli.trainer.global_step == STEPS  # training went on
    assert len(said) == 1 and "starting the run failed (CommError" in said[0] and "CSV" in said[0]
    keys, steps = _csv_keys(cli)
    assert steps == list(range(STEPS))  # every step, from the first
    assert {"dos/update_ms", "perf/peak_host_gib", "val/loss"} <= keys


@pytest.mark.parametrize(("error", "words"), [(RuntimeError("connection reset"), "RuntimeError: connection reset"),
                                              (OSError(errno.ENOSPC, "No space left on device"), "No space left")])
def test_wandb_failing_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception,
                               words: str) -> None:
    real_log = WandbRun.log

    def log(self: WandbRun, data: dict, *args: object, **kwargs: object) -> None:
        if data.get("trainer/global_step", 0) >= 2:  # steps 0 and 1 reach W&B, then it fails for good
            raise error
        real_log(self, data, *args, **kwargs)

    monkeypatch.setattr(WandbRun, "log", log)
    cli, said = _fit(tmp_path, monkeypatch)
    assert cli.trainer.global_step == STEPS
    assert len(said) == 1 and "logging metrics failed" in said[0] and words in said[0]
    keys, steps = _csv_keys(cli)
    assert {"dos/update_ms", "perf/iteration_ms", "perf/peak_host_gib", "train/loss"} <= keys
    # what W&B took before the failure stays in the W&B run; the CSV holds the rest, through the last step
    logged = read_finished_wandb_run(next((tmp_path / "runs" / "wandb").glob("offline-run-*")))
    assert sorted(step for step, _ in logged.history["train/loss"]) == [0, 1]
    assert steps == [2, 3]
