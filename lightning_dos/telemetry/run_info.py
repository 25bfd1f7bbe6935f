"""Owns what makes runs of one recipe under different strategies line up: the run identity and the run facts.

The identity is derived from the recipe name (the logger's ``name``, which every recipe sets), the strategy
and the GPU: run name ``<recipe>-<strategy>[-<plan>]``, W&B group = recipe, job type = strategy, tags =
strategy, plan, GPU name. It must reach the W&B logger before ``trainer.fit`` (Lightning starts the W&B run
in its setup hook, before any callback runs), so :func:`configure_run` puts it there; the CLI calls it for
every run, and a plain ``Trainer`` user calls it before ``fit``::

    trainer = Trainer(strategy="deep_optimizer_states", logger=DOSWandbLogger(name="my-recipe"))
    configure_run(trainer)
    trainer.fit(model, datamodule)

The facts known only once the engine exists (the resolved DeepSpeed config, the parameter count) and the
host's (hardware, package versions) are logged at fit start by :class:`RunInfoLogger` through every logger's
``log_hyperparams``: W&B's run config, and ``hparams.yaml`` for CSV. Keys: ``run`` (the identity),
``deepspeed_config``, ``num_parameters``, ``world_size``, ``hardware``, ``versions``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_dos.strategies.baselines import ZeRO3OffloadStrategy
from lightning_dos.strategies.dos import DeepOptimizerStatesStrategy

__all__ = [
    "RunIdentity",
    "RunInfoLogger",
    "configure_run",
    "device_name",
    "hardware_facts",
    "parameter_count",
    "run_identity",
    "strategy_label",
    "version_facts",
]

#: The recipe name used when no logger names one.
DEFAULT_RECIPE = "run"


@dataclass(frozen=True)
class RunIdentity:
    """Who a run is among the runs of its recipe: the basis of its W&B name, group, job type and tags.

    Args:
        recipe: The recipe (the logger's ``name``), e.g. ``"debug"``.
        strategy: The strategy's label (:func:`strategy_label`), e.g. ``"deep_optimizer_states"``.
        plan: The DOS plan in printable form (``"auto"``, ``"fraction:0.5"``, ``"stride:4"``), else None.
        gpu: The GPU's name, or ``"cpu"`` when the run does not use a GPU.
    """

    recipe: str
    strategy: str
    plan: Optional[str]
    gpu: str

    @property
    def name(self) -> str:
        """``<recipe>-<strategy>[-<plan>]``."""
        return "-".join(part for part in (self.recipe, self.strategy, self.plan) if part)

    @property
    def group(self) -> str:
        return self.recipe

    @property
    def job_type(self) -> str:
        return self.strategy

    @property
    def tags(self) -> list[str]:
        return [tag for tag in (self.strategy, self.plan, self.gpu) if tag]

    def as_dict(self) -> dict[str, Any]:
        """The identity as the run config's ``run`` entry."""
        return {"name": self.name, "recipe": self.recipe, "strategy": self.strategy, "plan": self.plan,
                "gpu": self.gpu}


def strategy_label(strategy: Any) -> tuple[str, Optional[str]]:
    """``(strategy, plan)`` of a strategy object: ``("deep_optimizer_states", "fraction:0.5")``,
    ``("static_split_0.5", None)`` for ``ZeRO3OffloadStrategy(ratio=0.5)``, ``("zero3_offload", None)``,
    ``("zero3", None)``; any other strategy by its ``strategy_name`` (``"ddp"``, ``"deepspeed"``) or class name."""
    if isinstance(strategy, DeepOptimizerStatesStrategy):
        return strategy.strategy_name, strategy.plan_spec.source
    if isinstance(strategy, ZeRO3OffloadStrategy) and strategy.ratio < 1.0:
        return f"static_split_{strategy.ratio:g}", None  # the name it is registered under
    name = getattr(strategy, "strategy_name", None)
    return (name if isinstance(name, str) and name else type(strategy).__name__), None


def _root_device(trainer: pl.Trainer) -> torch.device:
    try:
        return trainer.strategy.root_device
    except (AttributeError, IndexError, RuntimeError):
        return torch.device("cpu")  # before the strategy knows its devices: nothing says it is a GPU


def _forking_launcher(trainer: pl.Trainer) -> bool:
    launcher = getattr(trainer.strategy, "launcher", None)
    return getattr(launcher, "_start_method", None) == "fork"


def _physical_gpu_index(index: int) -> int:
    """nvidia-smi's index of CUDA device ``index`` (CUDA_VISIBLE_DEVICES renumbers; UUIDs are not mapped)."""
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


def device_name(trainer: pl.Trainer) -> str:
    """The name of the GPU this process trains on, or ``"cpu"``."""
    device = _root_device(trainer)
    if device.type != "cuda":
        return "cpu"
    index = device.index if device.index is not None else 0
    if torch.cuda.is_initialized() or not _forking_launcher(trainer):
        return torch.cuda.get_device_name(index)
    # a forking launcher must find CUDA uninitialised in the parent, so ask nvidia-smi instead
    from lightning_dos.telemetry.environment import nvidia_smi_gpus

    physical = _physical_gpu_index(index)
    names = [gpu["name"] for gpu in nvidia_smi_gpus() if gpu["index"] == physical]
    return names[0] if names else "cuda"


def _recipe_from_loggers(loggers: list[Logger]) -> Optional[str]:
    for logger in loggers:
        recipe = getattr(logger, "recipe", None)
        if recipe:
            return str(recipe)
        if isinstance(logger, WandbLogger):
            continue  # its `name` is the W&B project
        if getattr(logger, "name", None):
            return str(logger.name)
    return None


def run_identity(trainer: pl.Trainer, recipe: Optional[str] = None) -> RunIdentity:
    """The identity of the run ``trainer`` is about to make.

    Args:
        trainer: A Trainer whose strategy and loggers are set (it need not have started).
        recipe: The recipe name; None takes the first logger's (``DOSWandbLogger.recipe``, a CSV logger's
            ``name``), else ``"run"``.
    """
    strategy, plan = strategy_label(trainer.strategy)
    return RunIdentity(recipe=recipe or _recipe_from_loggers(trainer.loggers) or DEFAULT_RECIPE,
                       strategy=strategy, plan=plan, gpu=device_name(trainer))


def parameter_count(module: torch.nn.Module) -> int:
    """Parameters of ``module``, counted whole under ZeRO-3 (a partitioned parameter keeps its size in ds_numel)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())


def hardware_facts(device: Optional[torch.device] = None) -> dict[str, Any]:
    """GPU used (``"cpu"`` without one), GPU count, memory and driver, CPU model and cores available to this
    process, host RAM, and the GPU's PCIe link (generation and width, current and max; None where unreadable).
    Never raises for a missing ``nvidia-smi`` or ``/sys``."""
    from lightning_dos.telemetry.environment import hardware_info

    info = hardware_info()
    on_gpu = device is not None and device.type == "cuda"
    gpu, row, link = "cpu", {}, {}
    if on_gpu:
        physical = _physical_gpu_index(device.index or 0)
        row = next((gpu_row for gpu_row in info["gpus"] if gpu_row["index"] == physical), {})
        gpu = torch.cuda.get_device_name(device) if torch.cuda.is_initialized() else row.get("name") or "cuda"
        # else the first GPU's link, from nvidia-smi or /sys (which has no CUDA index)
        link = row if row.get("pcie_gen") is not None else (info["pcie"] or {})
    facts = {
        "gpu": gpu,
        "gpu_count": info["gpu_count"] or (torch.cuda.device_count() if on_gpu else 0),
        "gpu_memory_gib": row.get("memory_gib", info["gpu_memory_gib"]),
        "gpu_driver": row.get("driver", info["gpu_driver"]),
        "cpu_model": info["cpu_model"],
        "cpu_cores": info["cpu_cores_available"],
        "cpu_cores_logical": info["cpu_cores_logical"],
        "host_ram_gib": round(info["host_ram_gib"], 2),
        "platform": info["platform"],
    }
    for key in ("pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"):
        facts[key] = link.get(key)
    return facts


def version_facts() -> dict[str, Optional[str]]:
    """Versions of python, torch, CUDA (torch's build; None on a CPU build), lightning, deepspeed, lightning-dos
    and wandb (None when not installed)."""
    from lightning_dos.telemetry.environment import _package_version, versions

    return {**versions(), "wandb": _package_version("wandb")}


def _plain(value: Any) -> Any:
    """A JSON-shaped copy (what both W&B config and hparams.yaml store); anything else as its string."""
    return json.loads(json.dumps(value, default=str))


class RunInfoLogger(Callback):
    """Logs the run facts through every logger's ``log_hyperparams`` at fit start, once the strategy has built
    its engine: ``run`` (the identity), ``deepspeed_config`` (the strategy's resolved config; DeepSpeed
    strategies only), ``num_parameters``, ``world_size``, ``hardware`` and ``versions``.

    Args:
        identity: The run's identity; None derives it at fit start (:func:`run_identity`).
    """

    def __init__(self, identity: Optional[RunIdentity] = None) -> None:
        self.identity = identity
        self.facts: dict[str, Any] = {}

    def collect(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The facts of this run (the strategy must be set up for ``deepspeed_config`` to be the resolved one)."""
        identity = self.identity or run_identity(trainer)
        facts: dict[str, Any] = {"run": identity.as_dict()}
        config = getattr(trainer.strategy, "config", None)
        if isinstance(config, dict):
            facts["deepspeed_config"] = config
        facts["num_parameters"] = parameter_count(pl_module)
        facts["world_size"] = trainer.world_size
        facts["hardware"] = hardware_facts(_root_device(trainer))
        facts["versions"] = version_facts()
        return _plain(facts)  # plain types only: torch's version is a str subclass YAML would tag

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.loggers:
            return
        if not trainer.is_global_zero:
            return  # only rank zero's loggers write; the other ranks skip the nvidia-smi call
        self.facts = self.collect(trainer, pl_module)
        for logger in trainer.loggers:
            logger.log_hyperparams(self.facts)


def _apply_to_wandb_logger(logger: WandbLogger, identity: RunIdentity) -> None:
    """Give a plain ``WandbLogger`` the identity for the fields its ``wandb.init`` arguments leave unset."""
    if logger._experiment is not None:
        rank_zero_warn("configure_run: the W&B run has already started, so its name, group, job type and tags stay "
                       "as they are; call configure_run(trainer) before trainer.fit and before using "
                       "logger.experiment")
        return
    init = logger._wandb_init
    for key, value in (("name", identity.name), ("group", identity.group), ("job_type", identity.job_type),
                       ("tags", identity.tags)):
        if init.get(key) is None:
            init[key] = value


def configure_run(trainer: pl.Trainer, recipe: Optional[str] = None) -> RunIdentity:
    """Make ``trainer``'s run line up with the recipe's runs under other strategies; call before ``trainer.fit``.

    Gives every W&B logger the run identity (name ``<recipe>-<strategy>[-<plan>]``, group, job type, tags);
    whatever the user set explicitly on the logger is kept. Adds :class:`RunInfoLogger` (the run facts) and
    :class:`~lightning_dos.telemetry.callbacks.PerfMetrics` (``perf/*``) unless the trainer already has them.

    Args:
        trainer: The Trainer of the run, before ``fit``.
        recipe: The recipe name; None takes it from the loggers (see :func:`run_identity`).

    Returns:
        The identity given to the loggers.
    """
    from lightning_dos.telemetry.callbacks import PerfMetrics

    identity = run_identity(trainer, recipe)
    for logger in trainer.loggers:
        if hasattr(logger, "set_run_identity"):
            logger.set_run_identity(name=identity.name, group=identity.group, job_type=identity.job_type,
                                    tags=identity.tags)
        elif isinstance(logger, WandbLogger):
            _apply_to_wandb_logger(logger, identity)
    present = {type(callback) for callback in trainer.callbacks}
    for callback in (RunInfoLogger(identity), PerfMetrics()):
        if type(callback) not in present:
            trainer.callbacks.insert(0, callback)  # in front: ModelCheckpoint stays last, as Lightning orders it
    return identity
