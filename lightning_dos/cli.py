"""Owns the ``lightning-dos`` command line: ``fit``/``validate`` through LightningCLI, and ``bench`` dispatch.

``lightning-dos fit --config recipes/quickstart.yaml [--config configs/strategy/zero3_offload.yaml ...]``
trains a LightningModule chosen by ``class_path`` (default :class:`~lightning_dos.models.GPTModule`, whose arguments a
recipe may give without one; :class:`~lightning_dos.models.HFCausalLMModule` trains a Hugging Face model) on any
LightningDataModule chosen by ``class_path`` (default :class:`~lightning_dos.data.TextDataModule`). The model's
vocabulary and context length follow the data module (``data.vocab_size`` -> ``model.vocab_size``, ``data.seq_len``
-> ``model.block_size``: a module of one's own takes both arguments), so a recipe sets them once. Every run gets the
default callbacks and its run identity (name ``<recipe>-<strategy>[-<plan>]``, W&B group/job type/tags:
:func:`lightning_dos.telemetry.run_info.configure_run`).
``lightning-dos bench ...`` hands its arguments to ``lightning_dos.bench.main``; ``lightning-dos plan --config RECIPE``
prints the memory plan of a run without training it (:mod:`lightning_dos.strategies.sizing`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_info

import lightning_dos  # noqa: F401  (registers "deep_optimizer_states" and the baselines by name)
from lightning_dos.data import TextDataModule
from lightning_dos.models import GPTModule
from lightning_dos.strategies.checkpoint import newest_complete, validate_resume_path
from lightning_dos.telemetry.callbacks import default_callbacks
from lightning_dos.telemetry.run_info import configure_run

__all__ = ["DOSLightningCLI", "main"]

DESCRIPTION = (
    "Pretrain a GPT or a Hugging Face model under DeepSpeed ZeRO-3 with Deep Optimizer States: lightning-dos fit "
    "--config recipes/quickstart.yaml. Compare strategies with lightning-dos bench --help."
)
#: Subcommands that are not LightningCLI's: name -> module whose ``main(argv)`` runs it.
TOOL_COMMANDS = {
    "bench": "lightning_dos.bench",  # strategies compared in one run
    "prepare": "lightning_dos.data.prepare",  # a corpus tokenised into sharded token files
    "compare": "lightning_dos.telemetry.compare",  # runs of different strategies drawn side by side
    "to-universal": "lightning_dos.strategies.checkpoint",  # a checkpoint that resumes at any world size
}
#: Seed used when a config sets none, so two runs of one recipe give the same losses.
DEFAULT_SEED = 1234


def _vocab_size(data: Any) -> int:
    return int(data.vocab_size)


def _seq_len(data: Any) -> int:
    return int(data.seq_len)


class DOSLightningCLI(LightningCLI):
    """LightningCLI for pretraining: ``fit`` and ``validate``, model and data by ``class_path``, DOS callbacks added.

    Args:
        args: Command-line style arguments (``["fit", "--config", "recipe.yaml"]``); None reads ``sys.argv``.
        run: Run the subcommand; with False the first argument is not a subcommand and the classes are only
            instantiated (how the tests check recipes).
        **kwargs: Any other ``LightningCLI`` argument.
    """

    def __init__(self, args: Optional[Sequence[str]] = None, run: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("seed_everything_default", DEFAULT_SEED)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # the same name and help whether started as the console script or as python -m lightning_dos
        kwargs.setdefault("parser_kwargs", {"prog": "lightning-dos", "description": DESCRIPTION})
        # model and data are picked by class_path (GPTModule and TextDataModule by default)
        super().__init__(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=list(args) if args is not None else None,
            run=run,
            **kwargs,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Only ``fit`` and ``validate``: the recipes pretrain and evaluate; nothing here predicts or tests."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
        }

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"data": {"class_path": f"{TextDataModule.__module__}.{TextDataModule.__name__}"},
                             "model": {"class_path": f"{GPTModule.__module__}.{GPTModule.__name__}"}})
        # on instantiate: the data module knows its vocabulary only once its tokenizer exists
        parser.link_arguments("data", "model.init_args.vocab_size", compute_fn=_vocab_size, apply_on="instantiate")
        parser.link_arguments("data", "model.init_args.block_size", compute_fn=_seq_len, apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """The Trainer with the default callbacks and the run identity (``configure_run``) on its loggers.

        The identity is set here because Lightning starts the W&B run in its setup hook, before any callback.
        """
        trainer = super().instantiate_trainer(**kwargs)
        present = {type(callback) for callback in trainer.callbacks}
        for callback in default_callbacks():
            if type(callback) not in present:
                # in front: ModelCheckpoint stays last, as Lightning orders it
                trainer.callbacks.insert(0, callback)
        configure_run(trainer)
        return trainer

    def before_fit(self) -> None:
        """``--ckpt_path last`` means the newest *complete* checkpoint in the checkpoint folders (a crash may have left
        ``last.ckpt`` dangling or a checkpoint half-written); any other path is checked before the engine is built."""
        config = self.config_init[self.subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            folders = [cb.dirpath for cb in self.trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
            newest = newest_complete(folders)
            if newest is not None:
                rank_zero_info(f"ckpt_path last: resuming from {newest}")
                config["ckpt_path"] = str(newest)
        elif ckpt_path is not None and ckpt_path not in ("best", "hpc") and not str(ckpt_path).startswith("registry"):
            validate_resume_path(ckpt_path)


class _SizingCLI(DOSLightningCLI):
    """The recipe's classes without a Trainer (none is needed to size a run, and a GPU recipe's cannot be built on a
    machine without one)."""

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        return None


PLAN_HELP = """Print the memory plan of a run without training it: where each subgroup's optimizer state would live, and
whether the GPU and the host hold the run, before the first step and after it (the activations from the model's own
estimate). Takes the arguments of `lightning-dos fit` (--config RECIPE, --trainer.devices N, --model.n_layer L, ...)
and sizes for this machine's GPU and host unless given. Exits 1 when the run does not fit, or may not (it fits
before the first step but not with the estimated peak, an upper one)."""


def plan(argv: Sequence[str]) -> int:
    """``lightning-dos plan``: the memory plans of a recipe under ``deep_optimizer_states``, from the model alone."""
    import torch

    from lightning_dos.planning.placement import GIB
    from lightning_dos.strategies.dos import DeepOptimizerStatesStrategy
    from lightning_dos.strategies.sizing import host_for, precision_bytes, size_run, world_of
    from lightning_dos.update.host_memory import read_meminfo

    parser = argparse.ArgumentParser(prog="lightning-dos plan", description=PLAN_HELP, add_help=False)
    parser.add_argument("--gpu-gib", type=float, help="memory of one GPU (default: this machine's first GPU)")
    parser.add_argument("--host-gib", type=float, help="the host's memory (default: what this host has available)")
    ours, rest = parser.parse_known_args(argv)
    if not rest or rest[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    cli = _SizingCLI(args=list(rest), run=False)
    trainer = cli.config_init["trainer"]
    strategy = trainer.get("strategy")
    if not isinstance(strategy, DeepOptimizerStatesStrategy):
        strategy = DeepOptimizerStatesStrategy()
    world = world_of(trainer.get("devices", 1), trainer.get("num_nodes", 1) or 1)
    if ours.gpu_gib is not None:
        device_bytes = int(ours.gpu_gib * GIB)
    elif torch.cuda.is_available():
        device_bytes = torch.cuda.mem_get_info(0)[1]
    else:
        parser.error("no GPU here: give --gpu-gib, the memory of the GPU to size for")
    ranks_per_host = world_of(trainer.get("devices", 1))
    if ours.host_gib is not None:
        host = host_for(int(ours.host_gib * GIB), ranks_per_host)
    else:
        reading = read_meminfo()
        if reading is None:
            parser.error("this host's memory cannot be read (/proc/meminfo): give --host-gib")
        host = host_for(reading[0], ranks_per_host, reading[1])
    data = cli.datamodule
    budget = strategy.memory_budget_gib
    resident = strategy.resident_gib
    param_bytes, grad_bytes, host_grad_bytes = precision_bytes(trainer.get("precision") or "32-true",
                                                               int(trainer.get("accumulate_grad_batches") or 1))
    sizing = size_run(cli.model, world, "auto" if strategy.options.auto_sub_group_size else
                      strategy.config["zero_optimization"]["sub_group_size"],
                      int(getattr(data, "batch_size", 1)), int(getattr(data, "seq_len", 1)), device_bytes, host,
                      param_bytes=param_bytes, grad_bytes=grad_bytes, host_grad_bytes=host_grad_bytes,
                      budget_bytes=None if budget is None else int(budget * GIB),
                      resident_bytes=None if resident == "auto" else int(float(resident) * GIB))
    print(sizing.describe())
    return 0 if sizing.fits else 1


def main(args: Optional[Sequence[str]] = None) -> Any:
    """Entry point of ``lightning-dos`` and ``python -m lightning_dos``."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] == "plan":
        return plan(argv[1:])
    if argv and argv[0] in TOOL_COMMANDS:
        # imported lazily: benchmarking, tokenising and plotting pull in what a training run never needs
        module = importlib.import_module(TOOL_COMMANDS[argv[0]])
        return module.main(argv[1:])
    # DeepSpeed's ZeRO-3 calls torch.distributed collectives that torch deprecates, warning on every step
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    # None lets LightningCLI read sys.argv itself (given both, it warns about a possible mix-up)
    DOSLightningCLI(args=None if args is None else argv)
    return None


if __name__ == "__main__":
    sys.exit(main())
