"""Runs of one recipe under different strategies line up in W&B: the debug recipe under DOS and under vanilla
ZeRO-3 offload, logged offline through configs/logger/wandb.yaml and read back (name, group, job type, tags,
run config, ``perf/*`` and ``dos/*`` history); the run identity and facts; the ``perf/*`` callback's rules."""

from __future__ import annotations

import csv
import os
import platform
import struct
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import wandb
import yaml
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader, Dataset

import lightning_dos
import lightning_dos.telemetry.environment as environment
from lightning_dos import DeepOptimizerStatesStrategy, ZeRO3OffloadStrategy, ZeRO3Strategy
from lightning_dos.cli import DOSLightningCLI, main
from lightning_dos.models.gpt import GPTConfig, num_params
from lightning_dos.telemetry.callbacks import (
    NonFiniteLossGuard,
    PerfMetrics,
    batch_tokens,
    host_in_use_gib,
    peak_host_gib,
)
from lightning_dos.telemetry.compare import Run, read_csv_run
from lightning_dos.telemetry.loggers import DOSWandbLogger
from lightning_dos.telemetry.run_info import (
    RunIdentity,
    RunInfoLogger,
    configure_run,
    hardware_facts,
    parameter_count,
    run_identity,
    strategy_label,
    version_facts,
)
from tests.support.update_records import logged, phase_keys, record_metrics
from tests.support.wandb_runs import read_finished_wandb_run

# the tests pass args while pytest's own arguments sit in sys.argv
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "debug.yaml"
WANDB_FRAGMENT = ROOT / "configs" / "logger" / "wandb.yaml"
VANILLA_FRAGMENT = ROOT / "configs" / "strategy" / "zero3_offload.yaml"
DOS_NAME = "debug-deep_optimizer_states-fraction:0.5"  # the recipe's plan: 0.5
VANILLA_NAME = "debug-zero3_offload"
MAX_STEPS = 4


def _recipe() -> dict[str, Any]:
    return yaml.safe_load(RECIPE.read_text())


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# ---------------------------------------------------------------------------------------------- the two runs
@pytest.fixture(scope="module")
def fits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[Any]]]:
    """The debug recipe under DOS and under configs/strategy/zero3_offload.yaml, W&B offline: their run dirs, and the
    DOS managers each fit built (none for vanilla)."""
    root = tmp_path_factory.mktemp("strategy_runs")
    runs: dict[str, tuple[Path, list[Any]]] = {}
    managers: list[Any] = []
    build = DeepOptimizerStatesStrategy._build_manager
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeepOptimizerStatesStrategy, "_build_manager",
                      lambda self, optimizer: managers.append(build(self, optimizer)) or managers[-1])
        patch.chdir(root)  # the recipes log under relative paths (runs/)
        patch.setenv("WANDB_MODE", "offline")
        for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            patch.setenv(key, str(root / "wandb-home"))  # nothing of wandb's lands in the real home
        for name, fragments in (("dos", []), ("vanilla", ["--config", str(VANILLA_FRAGMENT)])):
            main(["fit", "--config", str(RECIPE), *fragments, "--config", str(WANDB_FRAGMENT),
                  "--trainer.max_steps", str(MAX_STEPS), "--trainer.enable_progress_bar", "false"])
            run = wandb.run
            assert run is not None, f"{name}: the fit started no W&B run"
            runs[name] = (Path(run.dir).parent.resolve(), list(managers))
            managers.clear()
            run.finish()  # Lightning leaves the run open; the next fit must start its own
    return runs


@pytest.fixture(scope="module")
def strategy_runs(fits: dict[str, tuple[Path, list[Any]]]) -> dict[str, Path]:
    return {name: path for name, (path, _) in fits.items()}


@pytest.fixture(scope="module")
def read_back(strategy_runs: dict[str, Path]) -> dict[str, Run]:
    return {name: read_finished_wandb_run(path) for name, path in strategy_runs.items()}


def test_runs_land_offline_under_the_save_dir(strategy_runs: dict[str, Path]) -> None:
    for path in strategy_runs.values():
        assert path.name.startswith("offline-run-"), path
        assert path.parent.name == "wandb" and path.parent.parent.name == "runs"  # save_dir: runs
        assert len(list(path.glob("run-*.wandb"))) == 1
    assert strategy_runs["dos"] != strategy_runs["vanilla"]


def test_runs_line_up_by_recipe_and_strategy(read_back: dict[str, Run]) -> None:
    dos, vanilla = read_back["dos"].wandb, read_back["vanilla"].wandb
    for run in (dos, vanilla):
        assert run["project"] == "lightning-dos"  # configs/logger/wandb.yaml
        assert run["group"] == "debug"  # the recipe
    assert (dos["name"], dos["job_type"], dos["tags"]) == (
        DOS_NAME, "deep_optimizer_states", ["deep_optimizer_states", "fraction:0.5", "cpu"])
    assert (vanilla["name"], vanilla["job_type"], vanilla["tags"]) == (
        VANILLA_NAME, "zero3_offload", ["zero3_offload", "cpu"])
    assert read_back["dos"].label == DOS_NAME and read_back["vanilla"].label == VANILLA_NAME


def test_run_config_holds_engine_host_and_versions(read_back: dict[str, Run]) -> None:
    recipe = _recipe()
    expected_params = num_params(GPTConfig.from_name(recipe["model"]["name"],
                                                     vocab_size=recipe["data"]["init_args"]["bpe_vocab_size"],
                                                     block_size=recipe["data"]["init_args"]["seq_len"]))
    for name, run in read_back.items():
        config = run.config
        zero = config["deepspeed_config"]["zero_optimization"]
        assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
        assert config["num_parameters"] == expected_params, name
        assert config["world_size"] == 1
        assert config["versions"] == {
            "python": platform.python_version(), "torch": str(torch.__version__), "cuda": torch.version.cuda,
            "lightning": version("lightning"), "deepspeed": version("deepspeed"),
            "lightning-dos": version("lightning-dos"), "wandb": wandb.__version__,
        }
        hardware = config["hardware"]
        assert hardware["gpu"] == "cpu" and hardware["cpu_cores"] == _cores() and hardware["host_ram_gib"] > 0
        for key in ("pcie_gen", "pcie_width"):
            assert key in hardware and hardware[key] is None  # recorded, unreadable without a GPU
        assert config["run"]["recipe"] == "debug" and config["run"]["gpu"] == "cpu"
        # Lightning's own hparams sit beside the facts
        assert config["learning_rate"] == recipe["model"]["learning_rate"]
    # the resolved config: DOS's sub_group_size "auto" became a number once the model existed
    dos_zero = read_back["dos"].config["deepspeed_config"]["zero_optimization"]
    assert 0 < dos_zero["sub_group_size"] < expected_params
    assert read_back["vanilla"].config["deepspeed_config"]["zero_optimization"]["sub_group_size"] == 100_000_000
    assert (read_back["dos"].config["run"]["plan"], read_back["vanilla"].config["run"]["plan"]) == ("fraction:0.5",
                                                                                                      None)


def test_history_has_perf_keys_for_both_and_dos_keys_for_dos(read_back: dict[str, Run]) -> None:
    recipe = _recipe()
    tokens = recipe["data"]["init_args"]["batch_size"] * recipe["data"]["init_args"]["seq_len"]
    for name, run in read_back.items():
        history = run.history
        # batch 0 follows fit start, batch 2 a validation (val_check_interval 2): neither is timed
        assert [step for step, _ in history["perf/iteration_ms"]] == [1, 3], name
        for (_, ms), (_, tokens_per_s) in zip(history["perf/iteration_ms"], history["perf/tokens_per_s"]):
            assert ms > 0 and tokens_per_s == pytest.approx(tokens / (ms / 1e3), rel=1e-6)
        assert [step for step, _ in history["perf/tflops_per_s"]] == [1, 3]  # GPTModule has flops_per_token
        host = [value for _, value in history["perf/peak_host_gib"]]
        assert len(host) == MAX_STEPS and host == sorted(host) and host[0] > 0.1  # a peak never falls
        assert "perf/peak_gpu_gib" not in history and "perf/mfu" not in history  # CPU: no GPU memory, no peak FLOPs
        assert not {"train/tokens_per_s", "train/tflops_per_s", "train/mfu"} & set(history)  # moved to perf/*
        assert len(history["train/loss"]) == MAX_STEPS
    assert all(0.0 < f < 1.0 for _, f in read_back["dos"].history["dos/device_fraction"])  # plan 0.5: both lanes
    assert not any(key.startswith("dos/") for key in read_back["vanilla"].history)


def test_dos_history_is_what_the_manager_recorded(read_back: dict[str, Run],
                                                  fits: dict[str, tuple[Path, list[Any]]]) -> None:
    """Every ``dos/*`` key of the W&B history, at every step, is what the manager recorded of that update phase
    (docs/telemetry.md), and the last step's keys are those of its ``metrics()``."""
    (manager,) = fits["dos"][1]
    assert not fits["vanilla"][1]
    history = read_back["dos"].history
    records = manager.records
    assert len(records) == MAX_STEPS
    steps = [step for step, _ in history["dos/update_ms"]]
    assert len(steps) == MAX_STEPS and steps == sorted(set(steps))  # one phase a step
    rows: dict[int, dict[str, float]] = {step: {} for step in steps}
    for key, values in history.items():
        if key.startswith("dos/"):
            for step, value in values:
                rows[step][key] = value
    for step, record in zip(steps, records):
        assert phase_keys(rows[step]) == logged(record_metrics(record)), step  # no key more, none less
    assert rows[steps[-1]] == logged(manager.metrics())


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_compare_draws_the_two_strategy_runs(strategy_runs: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "charts" / "dos-vs-vanilla.png"
    assert main(["compare", str(strategy_runs["dos"]), str(strategy_runs["vanilla"]), "--out", str(out),
                 "--metric", "dos/update_ms"]) == 0
    width, height = _png_size(out)
    assert width >= 800 and height >= 600 and out.stat().st_size > 20_000
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[0].split()[:2] == ["run", "source"]
    rows = {line.split()[0]: line.split() for line in table[2:4]}
    assert set(rows) == {DOS_NAME, VANILLA_NAME}
    assert all(row[1] == "wandb" and row[2] == str(MAX_STEPS - 1) for row in rows.values())
    assert f"wrote {out}" in captured.out
    assert f"note: {VANILLA_NAME} has no dos/update_ms" in captured.err  # drawn for DOS alone
    # the parent dir finds both runs once each (wandb's latest-run link points at one of them)
    assert main(["compare", str(strategy_runs["dos"].parent), "--out", str(tmp_path / "all.png")]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:] if not line.startswith("wrote")]
    assert sorted(listed) == sorted([DOS_NAME, VANILLA_NAME])


# ---------------------------------------------------------------------------------------------- identity
def test_cli_sets_the_identity_before_the_run_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = DOSLightningCLI(args=["--config", str(RECIPE), "--config", str(WANDB_FRAGMENT)], run=False)
    logger = cli.trainer.logger
    assert isinstance(logger, DOSWandbLogger) and logger._experiment is None  # nothing started yet
    assert logger.recipe == "debug" and logger._wandb_init["name"] == "debug"  # the recipe's name stays the name
    init = logger.wandb_init_kwargs
    assert (init["name"], init["group"], init["job_type"], init["tags"]) == (
        DOS_NAME, "debug", "deep_optimizer_states", ["deep_optimizer_states", "fraction:0.5", "cpu"])
    # the facts and perf/* callbacks and the non-finite loss guard are there once
    for kind in (RunInfoLogger, PerfMetrics, NonFiniteLossGuard):
        assert sum(isinstance(callback, kind) for callback in cli.trainer.callbacks) == 1


def test_cli_keeps_what_the_user_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = DOSLightningCLI(args=[
        "--config", str(RECIPE), "--config", str(ROOT / "configs" / "strategy" / "static_split_0.5.yaml"),
        "--config", str(WANDB_FRAGMENT), "--trainer.logger.init_args.run_name", "my-run",
        "--trainer.logger.init_args.group", "my-group", "--trainer.logger.init_args.job_type", "my-job",
        "--trainer.logger.init_args.tags", "[mine]"], run=False)
    init = cli.trainer.logger.wandb_init_kwargs
    assert (init["name"], init["group"], init["job_type"], init["tags"]) == ("my-run", "my-group", "my-job", ["mine"])
    # only the group set: the rest still follows the strategy (the static split is named by its ratio)
    cli = DOSLightningCLI(args=[
        "--config", str(RECIPE), "--config", str(ROOT / "configs" / "strategy" / "static_split_0.5.yaml"),
        "--config", str(WANDB_FRAGMENT), "--trainer.logger.init_args.group", "my-group"], run=False)
    init = cli.trainer.logger.wandb_init_kwargs
    assert (init["name"], init["group"], init["job_type"], init["tags"]) == (
        "debug-static_split_0.5", "my-group", "static_split_0.5", ["static_split_0.5", "cpu"])


def test_strategy_labels() -> None:
    assert strategy_label(DeepOptimizerStatesStrategy(plan="auto")) == ("deep_optimizer_states", "auto")
    assert strategy_label(DeepOptimizerStatesStrategy(plan=0.25)) == ("deep_optimizer_states", "fraction:0.25")
    assert strategy_label(DeepOptimizerStatesStrategy(plan="stride:4")) == ("deep_optimizer_states", "stride:4")
    assert strategy_label(ZeRO3OffloadStrategy()) == ("zero3_offload", None)
    assert strategy_label(ZeRO3OffloadStrategy(ratio=0.75)) == ("static_split_0.75", None)
    assert strategy_label(ZeRO3Strategy()) == ("zero3", None)
    assert strategy_label(SingleDeviceStrategy(torch.device("cpu"))) == ("single_device", None)
    assert strategy_label(object()) == ("object", None)
    identity = RunIdentity(recipe="quickstart", strategy="deep_optimizer_states", plan="auto", gpu="NVIDIA H100")
    assert identity.name == "quickstart-deep_optimizer_states-auto"
    assert identity.tags == ["deep_optimizer_states", "auto", "NVIDIA H100"]
    assert RunIdentity(recipe="q", strategy="zero3", plan=None, gpu="cpu").name == "q-zero3"


def test_configure_run_on_a_plain_trainer(tmp_path: Path) -> None:
    wandb_logger = WandbLogger(project="p", save_dir=str(tmp_path), group="mine")
    trainer = pl.Trainer(accelerator="cpu", logger=[wandb_logger, CSVLogger(tmp_path, name="my-recipe")],
                         enable_progress_bar=False, enable_model_summary=False)
    identity = configure_run(trainer)
    assert identity == RunIdentity(recipe="my-recipe", strategy="single_device", plan=None, gpu="cpu")
    init = wandb_logger._wandb_init
    assert (init["name"], init["group"], init["job_type"], init["tags"]) == (
        "my-recipe-single_device", "mine", "single_device", ["single_device", "cpu"])
    configure_run(trainer)  # again: no callback doubles
    for kind in (RunInfoLogger, PerfMetrics):
        assert sum(isinstance(callback, kind) for callback in trainer.callbacks) == 1
    assert run_identity(trainer, recipe="other").name == "other-single_device"


def test_identity_after_the_run_started_warns_and_changes_nothing(tmp_path: Path) -> None:
    logger = DOSWandbLogger(name="late", save_dir=str(tmp_path), project="p")
    run = logger.experiment
    try:
        with pytest.warns(UserWarning, match="already started"):
            logger.set_run_identity(name="late-zero3", group="late", job_type="zero3", tags=["zero3"])
        assert run.name == "late" and logger.wandb_init_kwargs["name"] == "late"
    finally:
        run.finish()


def test_explicit_logger_arguments_win_over_the_identity(tmp_path: Path) -> None:
    logger = DOSWandbLogger(name="r", save_dir=str(tmp_path), group="g", tags=["t"])
    logger.set_run_identity(name="r-zero3", group="r", job_type="zero3", tags=["zero3", "cpu"])
    init = logger.wandb_init_kwargs
    assert (init["name"], init["group"], init["job_type"], init["tags"]) == ("r-zero3", "g", "zero3", ["t"])


# ---------------------------------------------------------------------------------------------- run facts
def test_hardware_facts_on_cpu() -> None:
    facts = hardware_facts(torch.device("cpu"))
    assert facts["gpu"] == "cpu" and facts["cpu_cores"] == _cores()
    assert {"pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"} <= set(facts)
    assert facts["pcie_gen"] is None and facts["host_ram_gib"] > 0


def test_hardware_facts_pick_the_gpu_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    def gpu(index: int, name: str, gen: int | None) -> dict[str, Any]:
        return {"index": index, "name": name, "memory_gib": 80.0, "pcie_gen": gen, "pcie_gen_max": 5,
                "pcie_width": 16, "pcie_width_max": 16, "driver": "550"}

    info = {"gpus": [gpu(3, "GPU three", 4), gpu(5, "GPU five", 5)], "gpu_name": "GPU three", "gpu_count": 2,
            "gpu_memory_gib": 80.0, "gpu_driver": "550", "cpu_model": "x", "cpu_cores_available": 8,
            "cpu_cores_logical": 16, "host_ram_gib": 64.0, "platform": "p",
            "pcie": {"pcie_gen": 4, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16}}
    monkeypatch.setattr(environment, "hardware_info", lambda: info)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the name comes from nvidia-smi's row
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    facts = hardware_facts(torch.device("cuda", 1))  # cuda:1 is physical GPU 5
    assert (facts["gpu"], facts["pcie_gen"], facts["pcie_width"], facts["gpu_count"]) == ("GPU five", 5, 16, 2)
    info["gpus"][1]["pcie_gen"] = None  # unreadable there: the first GPU's link (sysfs has no CUDA index)
    assert hardware_facts(torch.device("cuda", 1))["pcie_gen"] == 4
    info["gpus"], info["pcie"] = [], None  # no nvidia-smi, no /sys: recorded as None, no error
    facts = hardware_facts(torch.device("cuda", 0))
    assert facts["gpu"] == "cuda" and facts["pcie_gen"] is None and facts["pcie_width"] is None


def test_version_facts_name_what_is_missing_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = version_facts()
    assert set(facts) == {"python", "torch", "cuda", "lightning", "deepspeed", "lightning-dos", "wandb"}
    assert facts["deepspeed"].startswith("0.19.") and facts["lightning"].startswith("2.6.")  # the pinned series

    def installed_without(*missing: str) -> Any:
        def lookup(name: str) -> str:
            if name in missing:
                raise PackageNotFoundError(name)
            return version(name)
        return lookup

    # wandb not installed: None, not an error; lightning-dos run from a source tree: the package's own version
    monkeypatch.setattr(environment, "version", installed_without("wandb", "lightning-dos"))
    facts = version_facts()
    assert facts["wandb"] is None and facts["lightning-dos"] == lightning_dos.__version__
    assert facts["deepspeed"] == version("deepspeed")


def test_parameter_count_sees_through_zero3_partitioning() -> None:
    module = torch.nn.Linear(4, 3)
    assert parameter_count(module) == 15
    module.weight.ds_numel = 1000  # ZeRO-3 leaves an empty tensor and the real size here
    module.weight.data = torch.empty(0)
    assert parameter_count(module) == 1003


def test_run_facts_reach_csv_hparams(tmp_path: Path) -> None:
    trainer, _ = _fit(tmp_path, "facts", max_steps=2)
    run = read_csv_run(Path(trainer.logger.log_dir))
    assert run.label == "facts-single_device"
    assert run.config["run"] == {"name": "facts-single_device", "recipe": "facts", "strategy": "single_device",
                                 "plan": None, "gpu": "cpu"}
    assert run.config["num_parameters"] == sum(p.numel() for p in trainer.lightning_module.parameters())
    assert "deepspeed_config" not in run.config  # not a DeepSpeed strategy
    assert run.config["versions"]["torch"] == torch.__version__


# ---------------------------------------------------------------------------------------------- perf/*
class _Tokens(Dataset):
    """Batches as dicts of token ids, so PerfMetrics must find the input tensor by name."""

    def __init__(self, count: int, seq_len: int = 8) -> None:
        self.data = torch.randint(0, 16, (count, seq_len))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"labels": self.data[index], "input_ids": self.data[index]}


class _TinyLM(pl.LightningModule):
    def __init__(self, flops: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        if flops:
            self.flops_per_token = lambda seq_len: 1e6 * seq_len

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.embed(batch["input_ids"]).pow(2).mean()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.embed(batch["input_ids"]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, name: str, max_steps: int, batches: int = 8, val_every: int | None = None,
         callbacks: list | None = None) -> tuple[pl.Trainer, list[dict[str, str]]]:
    loader = DataLoader(_Tokens(batches * 2), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=CSVLogger(tmp_path, name=name),
                         log_every_n_steps=1, val_check_interval=val_every, limit_val_batches=1 if val_every else 0,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=callbacks or [])
    configure_run(trainer)
    trainer.fit(_TinyLM(), loader, loader if val_every else None)
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as handle:
        return trainer, list(csv.DictReader(handle))


def _steps(rows: list[dict[str, str]], key: str) -> list[int]:
    return [int(row["step"]) for row in rows if row.get(key)]


def test_perf_metrics_skip_epoch_turnover(tmp_path: Path) -> None:
    # 4 batches an epoch: batch 0 follows fit start, batch 4 the epoch turnover
    _, rows = _fit(tmp_path, "epochs", max_steps=6, batches=4)
    assert _steps(rows, "perf/iteration_ms") == [1, 2, 3, 5]
    assert _steps(rows, "perf/peak_host_gib") == list(range(6))
    for row in rows:
        if row.get("perf/iteration_ms"):
            # 2 windows of 8 tokens (from the dict batch's input_ids), world size 1
            assert float(row["perf/tokens_per_s"]) == pytest.approx(16 / (float(row["perf/iteration_ms"]) / 1e3),
                                                                   rel=1e-5)
            assert float(row["perf/tflops_per_s"]) == pytest.approx(float(row["perf/tokens_per_s"]) * 8e6 / 1e12,
                                                                    rel=1e-5)
    assert not any(row.get("perf/mfu") or row.get("perf/peak_gpu_gib") for row in rows)  # CPU: no peak FLOPs


def test_perf_metrics_skip_the_batch_after_validation(tmp_path: Path) -> None:
    _, rows = _fit(tmp_path, "val", max_steps=6, val_every=2)
    assert _steps(rows, "perf/iteration_ms") == [1, 3, 5]  # 2 and 4 follow a validation, so do not repeat 1 and 3
    assert _steps(rows, "val/loss") == [1, 3, 5]


def test_perf_metrics_mfu_with_known_peak(tmp_path: Path) -> None:
    _, rows = _fit(tmp_path, "mfu", max_steps=3, callbacks=[PerfMetrics(peak_flops=2e12)])
    timed = [row for row in rows if row.get("perf/mfu")]
    assert len(timed) == 2
    for row in timed:
        assert float(row["perf/mfu"]) == pytest.approx(float(row["perf/tflops_per_s"]) / 2, rel=1e-5)


def test_perf_metrics_measure_rules() -> None:
    callback = PerfMetrics()
    trainer = SimpleNamespace(world_size=4)
    module = _TinyLM(flops=False)
    batch = (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    first = callback.measure(trainer, module, batch, now=10.0)
    assert set(first) == {"perf/peak_host_gib", "perf/host_in_use_gib"}  # nothing to time against yet
    second = callback.measure(trainer, module, batch, now=10.5)
    assert second["perf/iteration_ms"] == pytest.approx(500.0)
    assert second["perf/tokens_per_s"] == pytest.approx(2 * 5 * 4 / 0.5)  # times the world size
    assert "perf/tflops_per_s" not in second  # the module gives no FLOPs per token
    callback.on_validation_start(trainer, module)
    assert "perf/iteration_ms" not in callback.measure(trainer, module, batch, now=11.0)
    with pytest.raises(ValueError, match="peak_flops"):
        PerfMetrics(peak_flops=0)


def test_batch_tokens() -> None:
    ids = torch.zeros(4, 64, dtype=torch.long)
    assert batch_tokens(ids) == (256, 64)
    assert batch_tokens((ids, ids)) == (256, 64)
    assert batch_tokens({"labels": torch.zeros(4), "input_ids": ids}) == (256, 64)
    assert batch_tokens({"x": ids}) == (256, 64)
    assert batch_tokens([{"input_ids": ids}]) == (256, 64)
    assert batch_tokens(torch.zeros(8)) == (8, None)
    assert batch_tokens(["text"]) == (0, None)


def test_peak_host_gib_grows_with_what_this_process_touches() -> None:
    def status_gib(key: str) -> float:  # the kernel's own accounting of this process, read another way
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key))
        return int(line.split()[1]) * 1024 / 1024**3

    before = peak_host_gib()
    assert before == pytest.approx(status_gib("VmHWM:"), rel=0.02)
    # touch enough memory that the resident set must pass the old peak by 256 MiB
    grow = before - status_gib("VmRSS:") + 0.25
    block = torch.ones(int(grow * 1024**3) // 4, dtype=torch.float32)
    after = peak_host_gib()
    del block
    assert after >= before + 0.2, (before, after)


def test_host_in_use_counts_the_whole_host(tmp_path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:        1000 kB\nMemAvailable:   31072000 kB\n"
                       "Shmem:          47185920 kB\n")
    assert host_in_use_gib(str(meminfo)) == pytest.approx(100_000_000 * 1024 / 1024**3)
    assert host_in_use_gib(str(tmp_path / "missing")) is None
    meminfo.write_text("MemTotal: 1 kB\n")  # no MemAvailable (a kernel before 3.14)
    assert host_in_use_gib(str(meminfo)) is None


