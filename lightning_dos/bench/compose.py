"""Owns turning a run into the ``lightning-dos fit`` it is: ``--config RECIPE --config configs/strategy/FRAGMENT.yaml``,
then what the run sets over them (LightningCLI keys), then the bench's own trainer settings (``--steps`` iterations
on the run's devices, no logger, checkpoint or validation). A worker builds it with the same
:class:`~lightning_dos.cli.DOSLightningCLI`, adds its timing callbacks and leaves out NonFiniteLossGuard (it reads
every loss as it is made: a device synchronisation the end-to-end iterations must not have).
"""

from __future__ import annotations

import json
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench.rows import fragment_path, load_yaml
from lightning_dos.bench.settings import ROOT, STRATEGY_ARG, Run, recipe_path


def _value(value: Any) -> str:
    """A command-line value: strings as they are, anything else as JSON (``true``, ``[1, 2]``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value)


def fit_args(recipe: str, run: Run, run_dir: Path, batches: bool = True) -> list[str]:
    """Everything ``lightning-dos fit`` is given for ``run``; ``batches``: the data module takes ``num_batches`` (one
    batch per iteration and rank is what the bench asks of it)."""
    args = ["--config", str(recipe_path(recipe)), "--config", str(fragment_path(run.fragment))]
    for key, value in [*run.sets.items(), *((STRATEGY_ARG + k, v) for k, v in run.args.items())]:
        args += [f"--{key}", _value(value)]
    args += ["--trainer.max_steps", str(run.steps), "--trainer.devices", str(run.devices),
             "--trainer.default_root_dir", str(Path(run_dir).resolve())]
    for key, value in (("logger", "false"), ("enable_checkpointing", "false"), ("enable_progress_bar", "false"),
                       ("enable_model_summary", "false"), ("limit_val_batches", "0"), ("num_sanity_val_steps", "0"),
                       ("val_check_interval", "1.0")):
        args += [f"--trainer.{key}", value]
    return args + (["--data.num_batches", str(run.steps * run.devices)] if batches else [])


def command(args: Sequence[str]) -> str:
    """The ``lightning-dos fit`` command line of ``args``, paths under this checkout relative to it."""
    shown = [str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT) + "/") else a for a in args]
    return shlex.join(["lightning-dos", "fit", *shown])


def payload(recipe: str, run: Run, run_dir: Path, batches: bool = True) -> dict[str, Any]:
    """A worker's ``config.json``: the run, and the ``lightning-dos fit`` it runs (its arguments, its command line and
    the content of every config file they name)."""
    args = fit_args(recipe, run, run_dir, batches)
    files = [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]
    return {"run": run.to_dict(), "fit": {"args": args, "command": command(args),
                                          "configs": {path: load_yaml(path) for path in files}}}


def build(args: Sequence[str], callbacks: Sequence[Any] = (), instantiate_trainer: bool = True) -> Any:
    """``DOSLightningCLI(args, run=False)`` with ``callbacks`` added to the Trainer, less NonFiniteLossGuard; with
    ``instantiate_trainer=False`` only the model, the data module and the config (no Trainer, no device touched)."""
    from lightning_dos.cli import DOSLightningCLI
    from lightning_dos.telemetry.callbacks import NonFiniteLossGuard

    class BenchCLI(DOSLightningCLI):
        def instantiate_trainer(self, **kwargs: Any) -> Any:
            if not instantiate_trainer:
                return None
            trainer = super().instantiate_trainer(**kwargs)
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, NonFiniteLossGuard)]
            return trainer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return BenchCLI(args=list(args), run=False, trainer_defaults={"callbacks": list(callbacks)})


def describe(recipe: str, sets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """``(workload, model, batches)`` of ``recipe`` with ``sets`` (no strategy argument: the recipe's strategy may not
    take it), resolved through the CLI without a Trainer (the model is built later, in ``configure_model``) and its
    data prepared once (a corpus tokenised); ``batches``: the data module takes ``num_batches``."""
    args = ["--config", str(recipe_path(recipe))]
    for key, value in sets.items():
        args += [] if key.startswith(STRATEGY_ARG) else [f"--{key}", _value(value)]
    cli = build(args, instantiate_trainer=False)
    module, data = cli.model, cli.datamodule
    data.prepare_data()
    trainer, hp = cli.config["trainer"], module.hparams
    workload = {"model": hp.get("name", type(module).__name__), "seq_len": int(data.seq_len),
                "micro_batch": int(data.batch_size), "precision": str(trainer["precision"]),
                "accelerator": str(trainer["accelerator"]), "seed": cli.config["seed_everything"],
                "learning_rate": hp.get("learning_rate"),
                "data": {"SyntheticDataModule": "synthetic", "TextDataModule": "text"}.get(type(data).__name__,
                                                                                         type(data).__name__),
                "activation_checkpointing": getattr(getattr(module, "config", None), "activation_checkpointing",
                                                    hp.get("activation_checkpointing"))}
    return workload, describe_model(module, workload["seq_len"]), hasattr(data, "num_batches")


def describe_model(module: Any, seq_len: int) -> dict[str, Any]:
    """The resolved model for the JSON: shape, parameter count, FLOPs per token (``params`` None for a module that is
    not the GPT)."""
    from lightning_dos.models.gpt import GPTConfig, flops_per_token, num_params

    gpt = getattr(module, "config", None)
    if not isinstance(gpt, GPTConfig):
        flops = getattr(module, "flops_per_token", None)
        return {"preset": type(module).__name__, "params": None,
                "flops_per_token": float(flops(seq_len)) if callable(flops) else None}
    return {"preset": gpt.name, "style": gpt.style, "n_layer": gpt.n_layer, "n_embd": gpt.n_embd, "n_head": gpt.n_head,
            "n_kv_head": gpt.n_kv_head, "intermediate_size": gpt.intermediate_size, "vocab_size": gpt.vocab_size,
            "block_size": gpt.block_size, "params": num_params(gpt), "flops_per_token": flops_per_token(gpt, seq_len)}
