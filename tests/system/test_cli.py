"""The ``lightning-dos`` command line end to end (one run in a fresh process, as a user runs it), its ``bench``
dispatch, the W&B/CSV logger fallbacks and the callbacks the CLI adds (validation-loss report, ``dos/*`` metrics)."""

from __future__ import annotations

import csv
import importlib.util
import io
import logging
import math
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from torch.utils.data import DataLoader, TensorDataset

import lightning_dos
import lightning_dos.telemetry.loggers as loggers
from lightning_dos.cli import DOSLightningCLI, main
from lightning_dos.telemetry.callbacks import DOSMetricsLogger, ValLossReport

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


# ---------------------------------------------------------------------------------------------- end to end
def test_fit_debug_recipe_end_to_end(tmp_path: Path) -> None:
    """``python -m lightning_dos fit --config recipes/debug.yaml`` in a fresh process, as a user runs it, trains
    through the real ZeRO-3 DOS strategy."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "lightning_dos", "fit", "--config", str(ROOT / "recipes" / "debug.yaml"),
               "--trainer.enable_progress_bar", "false"]
    # no standard input: nothing on the path may prompt
    result = subprocess.run(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _check_debug_run(tmp_path, result.stdout, result.stdout + result.stderr, overlap=False)


def test_fit_debug_recipe_overlapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """The same with ``overlap`` (the default on one GPU), through the CLI in this process: each phase's record is
    logged a step later and the last one at the end."""
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        main(["fit", "--config", str(ROOT / "recipes" / "debug.yaml"), "--trainer.enable_progress_bar", "false",
              "--trainer.strategy.init_args.overlap", "true"])
    _check_debug_run(tmp_path, capsys.readouterr().out, caplog.text, overlap=True)


def _check_debug_run(cwd: Path, stdout: str, output: str, overlap: bool) -> None:
    """What a run of the debug recipe leaves: its CSV log, the plan it described, the validation-loss report."""
    # the run logged under the recipe's runs/debug, relative to the working directory
    log_dir = cwd / "runs" / "debug" / "version_0"
    with open(log_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(train) == 4 and all(math.isfinite(v) for v in train)
    assert len(val) == 2 and all(math.isfinite(v) for v in val)
    # DOSMetricsLogger forwarded the strategy manager's numbers, one row per update phase
    device_fraction = [float(r["dos/device_fraction"]) for r in rows if r.get("dos/device_fraction")]
    assert len(device_fraction) == 4 and all(0.0 < f < 1.0 for f in device_fraction)  # plan 0.5: both lanes
    assert all(float(r["dos/update_ms"]) > 0 for r in rows if r.get("dos/update_ms"))
    assert (log_dir / "config.yaml").is_file()  # SaveConfigCallback wrote the resolved config
    assert "deep_optimizer_states:" in output  # the strategy's manager described its plan
    said = "each update phase overlaps the next forward" in output
    assert said == overlap  # the default runs serially where the host stands in for the device
    report = [line for line in stdout.splitlines() if line.startswith("validation loss: first ")]
    assert len(report) == 1, stdout[-2000:]


def test_bench_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("lightning_dos.bench")
    fake.main = lambda argv: calls.append(list(argv)) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning_dos.bench", fake)
    assert main(["bench", "sweep", "--steps", "3"]) == 7
    assert calls == [["sweep", "--steps", "3"]]
    # argv is read when no args are given, as the console script calls it
    monkeypatch.setattr(sys, "argv", ["lightning-dos", "bench"])
    assert main() == 7
    assert calls[-1] == []


def test_only_fit_and_validate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["predict", "--config", str(ROOT / "recipes" / "debug.yaml")])
    assert "predict" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- W&B logger
class _NoStdin(io.TextIOBase):
    """Standard input that fails loudly: CI has none, so a prompt would hang or crash there."""

    def read(self, *args: Any) -> str:
        raise AssertionError("read standard input")

    readline = read

    def isatty(self) -> bool:
        return False


def _no_credentials(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))  # no ~/.netrc from `wandb login`


def test_wandb_offline_without_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _no_credentials(monkeypatch, tmp_path / "home")
    monkeypatch.setattr(sys, "stdin", _NoStdin())
    assert not loggers.has_wandb_api_key()
    logger = loggers.DOSWandbLogger(name="t", save_dir=str(tmp_path / "logs"), project="p", log_model=True)
    assert isinstance(logger, WandbLogger)
    assert logger.offline_fallback and logger._offline and not logger._log_model
    run = logger.experiment
    try:
        assert run.offline
        logger.log_metrics({"train/loss": 1.0}, step=0)
        assert logger.experiment is run
    finally:
        run.finish()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("W&B: no API key found, logging offline to ")]
    assert len(lines) == 1, err  # printed once
    run_dir = Path(run.dir).parent
    assert lines[0] == f"W&B: no API key found, logging offline to {run_dir} (sync later with `wandb sync {run_dir}`)"
    assert run_dir.is_dir() and run_dir.is_relative_to(tmp_path / "logs")


def test_wandb_key_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_credentials(monkeypatch, tmp_path / "home")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert loggers.has_wandb_api_key()
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = tmp_path / "home" / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert loggers.has_wandb_api_key()
    logger = loggers.DOSWandbLogger(save_dir=str(tmp_path / "logs"))
    assert not logger.offline_fallback and not logger._offline  # a key: stays online (nothing is contacted yet)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert not loggers.has_wandb_api_key()  # the entry is for another host
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert not loggers.DOSWandbLogger(save_dir=str(tmp_path / "logs")).offline_fallback  # explicit mode wins


def test_csv_fallback_without_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    # a fresh copy of the module, imported without wandb, stands in for the real one until the test ends
    spec = importlib.util.find_spec("lightning_dos.telemetry.loggers")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    monkeypatch.setitem(sys.modules, "lightning_dos.telemetry.loggers", fresh)
    monkeypatch.setattr(lightning_dos.telemetry, "loggers", fresh)
    assert not fresh.wandb_available()

    logger = fresh.DOSWandbLogger(name="run", save_dir=str(tmp_path), project="p", tags=["a"])
    assert isinstance(logger, CSVLogger) and not isinstance(logger, WandbLogger)
    assert Path(logger.log_dir).parent == tmp_path / "run"
    assert capsys.readouterr().err.count("W&B: wandb is not installed, logging to CSV under") == 1
    # a recipe naming the W&B logger still parses, and gets CSV
    monkeypatch.chdir(tmp_path)
    cli = DOSLightningCLI(args=["--config", str(ROOT / "recipes" / "debug.yaml"),
                                "--config", str(ROOT / "configs" / "logger" / "wandb.yaml")], run=False)
    assert isinstance(cli.trainer.logger, CSVLogger) and cli.trainer.logger.name == "debug"


@pytest.mark.parametrize(("key", "text", "value"), [
    ("overlap", "true", True), ("overlap", "false", False), ("overlap", "auto", "auto"),
    ("leaf_blocks", "true", True), ("leaf_blocks", "false", False),
    ("param_persistence", "true", True), ("param_persistence", "5000", 5000)])
def test_the_strategys_auto_or_bool_switches_parse_from_the_command_line(
        key: str, text: str, value: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--trainer.strategy.init_args.overlap true`` is the bool, not the string 'true' (which each refuses)."""
    monkeypatch.chdir(tmp_path)
    cli = DOSLightningCLI(args=["--config", str(ROOT / "recipes" / "debug.yaml"),
                                f"--trainer.strategy.init_args.{key}", text], run=False)
    assert getattr(cli.trainer.strategy, key) == value and type(getattr(cli.trainer.strategy, key)) is type(value)


# ---------------------------------------------------------------------------------------------- callbacks
class _ConstantLoss(pl.LightningModule):
    """Logs val/loss = 10 - global_step, so each validation's value says when it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", 10.0 - self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_val_loss_report_prints_first_and_last(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(TensorDataset(torch.ones(8, 1)), batch_size=2)
    report = ValLossReport()
    trainer = pl.Trainer(max_steps=4, val_check_interval=2, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, callbacks=[report])
    trainer.fit(_ConstantLoss(), loader, loader)
    # sanity check (step 0) -> 10, then step 2 -> 8, step 4 -> 6: first is the untrained model
    assert (report.first, report.last) == (10.0, 6.0)
    assert "validation loss: first 10.00 -> last 6.00 (dropped 4.00)" in capsys.readouterr().out.splitlines()


def test_val_loss_report_rank_zero_only(capsys: pytest.CaptureFixture[str]) -> None:
    report = ValLossReport()
    for loss in (8.31, 6.0, 5.02):
        report.on_validation_end(SimpleNamespace(callback_metrics={"val/loss": torch.tensor(loss)}), None)
    assert report.summary() == "validation loss: first 8.31 -> last 5.02 (dropped 3.29)"
    report.on_fit_end(SimpleNamespace(is_global_zero=False), None)
    assert capsys.readouterr().out == ""
    report.on_fit_end(SimpleNamespace(is_global_zero=True), None)
    assert capsys.readouterr().out == "validation loss: first 8.31 -> last 5.02 (dropped 3.29)\n"
    assert ValLossReport().summary() is None  # no validation ran: nothing to say


def test_dos_metrics_logger_logs_each_update_phase_once() -> None:
    class Manager:
        def __init__(self) -> None:
            self.records: list[int] = []

        def metrics(self) -> dict[str, float]:
            return {"dos/update_ms": float(len(self.records))} if self.records else {}

    logged: list[dict] = []
    connector = SimpleNamespace(should_update_logs=True, log_metrics=logged.append)
    manager = Manager()
    trainer = SimpleNamespace(strategy=SimpleNamespace(manager=manager), _logger_connector=connector,
                              fast_dev_run=False)
    callback = DOSMetricsLogger()
    callback.on_train_batch_end(trainer, None, None, None, 0)  # no phase yet
    manager.records.append(1)
    callback.on_train_batch_end(trainer, None, None, None, 1)
    callback.on_train_batch_end(trainer, None, None, None, 2)  # accumulating: same phase, not logged again
    manager.records.append(2)
    callback.on_train_batch_end(trainer, None, None, None, 3)
    assert logged == [{"dos/update_ms": 1.0}, {"dos/update_ms": 2.0}]
    # a step Lightning does not log at (log_every_n_steps): the phase is passed over, not logged at a later step
    connector.should_update_logs = False
    manager.records.append(3)
    callback.on_train_batch_end(trainer, None, None, None, 4)
    connector.should_update_logs = True
    callback.on_train_batch_end(trainer, None, None, None, 5)
    assert len(logged) == 2
    # strategies without a manager are left alone
    callback.on_train_batch_end(SimpleNamespace(strategy=object(), _logger_connector=connector, fast_dev_run=False),
                                None, None, None, 6)
    assert len(logged) == 2
