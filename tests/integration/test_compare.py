"""``lightning-dos compare``: CSV runs and offline W&B runs read back and drawn into one PNG with a summary table;
the W&B transaction-log reader against wandb's own writer; clear errors for what cannot be compared."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import wandb
from lightning.pytorch.loggers import CSVLogger
from matplotlib import image
from torch.utils.data import DataLoader, TensorDataset

from lightning_dos.cli import main as cli_main
from lightning_dos.models import GPTModule
from lightning_dos.telemetry.compare import (
    CompareError,
    Run,
    find_run_dirs,
    load_runs,
    main,
    read_csv_run,
    read_wandb_run,
    summary_table,
    wandb_records,
)
from lightning_dos.telemetry.run_info import configure_run
from tests.support.wandb_runs import read_finished_wandb_run


def _png(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature and that it is not blank."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    pixels = image.imread(path)
    assert pixels.shape[:2] == (height, width) and float(np.std(pixels)) > 0.01  # something was drawn
    return width, height


# ---------------------------------------------------------------------------------------------- CSV runs
def _csv_run(root: Path, recipe: str, steps: int) -> Path:
    torch.manual_seed(0)
    vocab, seq_len = 64, 16
    data = torch.randint(0, vocab, (32, seq_len + 1))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, val_check_interval=3, limit_val_batches=2,
                         logger=CSVLogger(root / "runs", name=recipe), log_every_n_steps=1, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    configure_run(trainer)  # the run name and the perf/* callback, as the CLI gives every run
    module = GPTModule(name="debug", vocab_size=vocab, block_size=seq_len, n_layer=1, n_embd=32, warmup_steps=1)
    trainer.fit(module, loader, loader)
    return Path(trainer.logger.log_dir)


@pytest.fixture(scope="module")
def csv_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("csv_runs")
    return [_csv_run(root, "alpha", steps=6), _csv_run(root, "beta", steps=4)]


def test_compare_csv_runs(csv_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "comparison.png"
    assert main([*map(str, csv_runs), "--out", str(out)]) == 0
    width, height = _png(out)
    assert width >= 800 and height >= 600 and out.stat().st_size > 20_000
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "source", "steps", "median", "iter", "ms", "median", "tokens/s", "peak", "GPU",
                                "GiB", "peak", "host", "GiB", "last", "train/loss", "last", "val/loss"]
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert set(rows) == {"alpha-single_device", "beta-single_device"}
    assert rows["alpha-single_device"][2] == "5" and rows["beta-single_device"][2] == "3"  # last logged step
    for row in rows.values():
        assert row[1] == "csv" and float(row[3]) > 0 and float(row[4].replace(",", "")) > 0
        assert row[5] == "n/a" and float(row[6]) > 0  # no GPU memory on a CPU run; host memory measured
    assert lines[-1] == f"wrote {out}"


def test_the_steps_column_is_the_last_training_step_not_an_overlapped_runs_last_record() -> None:
    run = Run(path=Path("r"), source="csv", label="dos",
              history={"train/loss": [(0, 3.0), (1, 2.5)], "dos/update_ms": [(1, 9.0), (2, 8.0)]})
    assert summary_table([run]).splitlines()[2].split()[2] == "1"
    run.history.pop("train/loss")
    assert summary_table([run]).splitlines()[2].split()[2] == "2"  # no training loss: the last step logged


def test_csv_run_read_back(csv_runs: list[Path]) -> None:
    run = read_csv_run(csv_runs[0])
    assert run.source == "csv" and run.label == "alpha-single_device"
    assert run.config["run"]["strategy"] == "single_device" and run.config["betas"] == [0.9, 0.95]  # a tuple in YAML
    assert [step for step, _ in run.history["train/loss"]] == list(range(6))
    assert [step for step, _ in run.history["val/loss"]] == [2, 5]
    assert [step for step, _ in run.history["perf/iteration_ms"]] == [1, 2, 4, 5]  # not after fit start or a validation
    assert run.last("val/loss") == run.history["val/loss"][-1][1]
    assert run.peak("perf/peak_host_gib") == max(run.values("perf/peak_host_gib"))
    assert "epoch" not in run.history and "step" not in run.history


def test_parent_dir_holds_several_runs(csv_runs: list[Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    runs_dir = csv_runs[0].parents[1]  # runs/, holding alpha/version_0 and beta/version_0
    assert find_run_dirs(runs_dir) == sorted(csv_runs)
    assert cli_main(["compare", str(runs_dir), "--out", str(tmp_path / "c.png")]) == 0  # through the CLI's dispatch
    assert (tmp_path / "c.png").is_file()
    assert "alpha-single_device" in capsys.readouterr().out


def test_same_name_runs_get_their_dir_names(csv_runs: list[Path], tmp_path: Path) -> None:
    again = tmp_path / "version_7"
    shutil.copytree(csv_runs[0], again)
    labels = [run.label for run in load_runs([csv_runs[0], again])]
    assert labels == ["alpha-single_device (version_0)", "alpha-single_device (version_7)"]


def test_run_without_run_config_is_labelled_by_its_dir(csv_runs: list[Path], tmp_path: Path) -> None:
    bare = tmp_path / "my_run"
    bare.mkdir()
    shutil.copy(csv_runs[1] / "metrics.csv", bare / "metrics.csv")  # no hparams.yaml
    assert read_csv_run(bare).label == "my_run"


def test_extra_metric_panels(csv_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "more.png"
    assert main([*map(str, csv_runs), "--out", str(out), "--metric", "perf/iteration_ms", "--metric",
                 "train/lr"]) == 0
    _, height = _png(out)
    assert height > _png_height_default(csv_runs, tmp_path)  # a row of panels more
    assert capsys.readouterr().err == ""  # every run has both keys: no notes


def _png_height_default(csv_runs: list[Path], tmp_path: Path) -> int:
    out = tmp_path / "default.png"
    assert main([*map(str, csv_runs), "--out", str(out)]) == 0
    return _png(out)[1]


# ---------------------------------------------------------------------------------------------- W&B runs
def _wandb_run(root: Path, name: str, big: int = 0) -> Path:
    """An offline W&B run written by wandb itself, shaped as Lightning's WandbLogger logs."""
    run = wandb.init(dir=str(root), project="p", name=name, group="g", job_type="zero3", tags=["zero3", "cpu"],
                     config={"run": {"name": name}, "nested": {"a": 1}}, mode="offline")
    try:
        # the config is completed at fit start, as RunInfoLogger does (an update made just before finish() was once
        # missing from the log of a fresh-clone CI run on a loaded machine)
        run.config.update({"deepspeed_config": {"zero_optimization": {"stage": 3}}, "blob": "x" * big},
                          allow_val_change=True)
        for step in range(4):
            run.log({"train/loss": 5.0 - step, "perf/tokens_per_s": 100.0 * (step + 1), "perf/peak_host_gib": 0.5,
                     "trainer/global_step": step, "epoch": 0})
        run.log({"val/loss": 4.5, "trainer/global_step": 3})
        run.log({"dos/plan": wandb.Table(columns=["lane"], data=[["host"]]), "trainer/global_step": 3})
        directory = Path(run.dir).parent
    finally:
        run.finish()
    # finish() can return before wandb's writer process has appended the log's last records: a test that reads the
    # raw bytes (cut off at half, below) read a 6-byte log on a loaded machine
    read_finished_wandb_run(directory)
    return directory


def test_wandb_reader_reads_what_wandb_wrote(tmp_path: Path) -> None:
    run_dir = _wandb_run(tmp_path, "w-zero3", big=100_000)  # a config record spanning several 32 KiB blocks
    run = read_finished_wandb_run(run_dir)
    assert run.source == "wandb" and run.label == "w-zero3"
    assert run.wandb == {"name": "w-zero3", "group": "g", "job_type": "zero3", "tags": ["zero3", "cpu"],
                         "project": "p", "id": run.wandb["id"]} and run.wandb["id"]
    assert run.config["nested"] == {"a": 1} and run.config["deepspeed_config"]["zero_optimization"]["stage"] == 3
    assert run.config["blob"] == "x" * 100_000
    assert "_wandb" not in run.config
    assert run.history["train/loss"] == [(0, 5.0), (1, 4.0), (2, 3.0), (3, 2.0)]  # stepped by trainer/global_step
    assert run.history["val/loss"] == [(3, 4.5)]
    # a table's fields are not metrics, nor are wandb's own _step/_runtime, the step or the epoch
    assert set(run.history) == {"train/loss", "perf/tokens_per_s", "perf/peak_host_gib", "val/loss"}
    # the .wandb file itself works as a RUN_DIR
    log = next(run_dir.glob("run-*.wandb"))
    assert read_wandb_run(log).history == run.history
    assert find_run_dirs(log) == [run_dir]


def test_wandb_reader_stops_at_a_cut_off_record(tmp_path: Path) -> None:
    run_dir = _wandb_run(tmp_path, "cut")
    log = next(run_dir.glob("run-*.wandb"))
    whole = list(wandb_records(log))
    data = log.read_bytes()
    cut = tmp_path / "cut" / "run-cut.wandb"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) // 2 + 3])  # a crash mid-write
    partial = list(wandb_records(cut))
    assert 0 < len(partial) < len(whole)
    assert [r.SerializeToString() for r in partial] == [r.SerializeToString() for r in whole[: len(partial)]]


def test_compare_mixes_csv_and_wandb(csv_runs: list[Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _wandb_run(tmp_path, "w-zero3")
    out = tmp_path / "mixed.png"
    assert main([str(csv_runs[0]), str(run_dir), "--out", str(out), "--metric", "perf/iteration_ms"]) == 0
    _png(out)
    captured = capsys.readouterr()
    assert "note: w-zero3 has no perf/iteration_ms" in captured.err
    rows = {line.split()[0]: line.split() for line in captured.out.splitlines()[2:4]}
    assert rows["w-zero3"][1] == "wandb" and rows["w-zero3"][7] == "2.000" and rows["w-zero3"][8] == "4.500"


def test_summary_table_names_every_run(csv_runs: list[Path]) -> None:
    table = summary_table(load_runs(csv_runs)).splitlines()
    assert len(table) == 4 and set(table[1]) <= {"-", " "}
    assert [line.split()[0] for line in table[2:]] == ["alpha-single_device", "beta-single_device"]


# ---------------------------------------------------------------------------------------------- bad inputs
def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("lightning-dos compare: error: ")
    return captured.err


def test_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error([str(tmp_path / "nope")], capsys)
    assert "nope' does not exist" in err and "metrics.csv" in err


def test_dir_with_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("no run here")
    err = _error([str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")], capsys)
    assert "no run found" in err and "run-*.wandb" in err
    assert not (tmp_path / "x.png").exists()


def test_file_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert "is a file" in _error([str(tmp_path / "notes.txt")], capsys)
    fake = tmp_path / "offline-run-1" / "run-1.wandb"
    fake.parent.mkdir()
    fake.write_bytes(b"not a log at all")
    assert "not a W&B transaction log" in _error([str(fake.parent)], capsys)


def test_run_without_the_compared_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other" / "version_0"
    other.mkdir(parents=True)
    (other / "metrics.csv").write_text("accuracy,epoch,step\n0.5,0,0\n0.6,0,1\n")
    err = _error([str(other)], capsys)
    assert "logged none of train/loss" in err and "it logged: accuracy" in err


def test_metric_no_run_logged(csv_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error([*map(str, csv_runs), "--metric", "dos/update_ms", "--out", str(tmp_path / "x.png")], capsys)
    assert "--metric dos/update_ms: no run logged it" in err and "perf/tokens_per_s" in err
    assert not (tmp_path / "x.png").exists()


def test_needs_a_run_dir(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "RUN_DIR" in capsys.readouterr().err


def test_compare_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        find_run_dirs(Path("/definitely/not/here"))
    assert issubclass(CompareError, ValueError)
