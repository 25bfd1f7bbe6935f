"""Owns turning a bench configuration into the ``lightning-dos fit`` it runs: a recipe, a strategy fragment, overrides.

A worker builds its Trainer, model and data module with :class:`~lightning_dos.cli.DOSLightningCLI` from what a user
would give ``lightning-dos fit`` (:func:`fit_args`): ``--config RECIPE`` (``--recipe``, or the bench's flags made into
one, :data:`BENCH_RECIPE`), ``--config configs/strategy/FRAGMENT.yaml`` (the row's), the workload flags given
(:data:`WORKLOAD`), the row's strategy arguments and the bench's trainer settings (``--steps`` on the row's devices,
no logger, checkpoint or validation). The worker adds its timing callbacks and leaves out NonFiniteLossGuard (it reads
every loss as it is made: a device synchronisation the end-to-end iterations must not have).
"""

from __future__ import annotations

import functools
import json
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dos.bench.kinds import FRAGMENTS, ROOT, RunSpec

SYNTHETIC, TEXT = "lightning_dos.data.SyntheticDataModule", "lightning_dos.data.TextDataModule"
#: The recipe of a bench without ``--recipe`` (its flags go on top): gpt-2.7b on random tokens, seq 2048, micro-batch 4,
#: bf16-mixed, constant AdamW learning rate after no warm-up, no clipping.
BENCH_RECIPE: dict[str, Any] = {
    "seed_everything": 1234,
    "trainer": {"accelerator": "auto", "devices": 1, "precision": "bf16-mixed", "strategy": "deep_optimizer_states"},
    "model": {"name": "gpt-2.7b", "activation_checkpointing": True, "learning_rate": 3e-4, "warmup_steps": 0},
    "data": {"class_path": SYNTHETIC, "init_args": {"vocab_size": 50304, "seq_len": 2048, "batch_size": 4}},
}
#: Bench setting -> the ``lightning-dos fit`` argument it sets, when given (``vocab_size`` and ``data`` are below).
WORKLOAD = {"model": "model.name", "n_layer": "model.n_layer", "n_embd": "model.n_embd", "n_head": "model.n_head",
            "activation_checkpointing": "model.activation_checkpointing", "learning_rate": "model.learning_rate",
            "seq_len": "data.seq_len", "micro_batch": "data.batch_size", "data_paths": "data.paths",
            "tokenizer": "data.tokenizer", "bpe_vocab_size": "data.bpe_vocab_size", "max_bytes": "data.max_bytes",
            "precision": "trainer.precision", "accelerator": "trainer.accelerator", "seed": "seed_everything"}
#: Strategy arguments a bench setting gives every fragment that lists them (the fragments list every knob they take).
STRATEGY_SETTINGS = ("sub_group_size", "pin_memory", "memory_budget_gib")


def _value(value: Any) -> str:
    """A command-line value: strings as they are, anything else as JSON (``true``, ``[1, 2]``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value)


@functools.cache
def _load(path: str) -> dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping (a recipe or a strategy fragment)")
    return data


def fragment_path(name: str) -> Path:
    """``configs/strategy/<name>.yaml``; ``FileNotFoundError`` naming where it looked."""
    path = FRAGMENTS / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"strategy fragment {path} not found: the bench runs the fragments of the checkout it "
                                "is installed from (pip install -e .)")
    return path


def recipe_data_class(config: Any) -> str:
    """The data module class path of the recipe (``--recipe``'s, or :data:`BENCH_RECIPE`): TextDataModule, the CLI's
    default, when it names none."""
    data = (_load(str(Path(config.recipe).resolve())) if config.recipe else BENCH_RECIPE).get("data")
    return str(data.get("class_path", TEXT)) if isinstance(data, dict) else TEXT


def data_class(config: Any) -> str:
    """The data module's class path: ``--text`` / ``--synthetic``'s, else the recipe's."""
    return {"text": TEXT, "synthetic": SYNTHETIC}[config.data] if config.data else recipe_data_class(config)


def workload_args(config: Any) -> list[str]:
    """The workload flags given, as ``lightning-dos fit`` arguments over the recipe."""
    args: list[str] = []
    chosen = data_class(config)
    if chosen != recipe_data_class(config):
        args += ["--data", chosen]
    for name, key in WORKLOAD.items():
        if getattr(config, name) is not None:
            args += [f"--{key}", _value(getattr(config, name))]
    if config.vocab_size is not None:  # the model's vocabulary follows the data module's
        args += ["--data.vocab_size" if chosen == SYNTHETIC else "--data.bpe_vocab_size", str(config.vocab_size)]
    elif config.model is not None and config.recipe is None and chosen == SYNTHETIC:
        from lightning_dos.models.gpt import PRESETS, GPTConfig

        args += ["--data.vocab_size", str(PRESETS.get(config.model, {}).get("vocab_size", GPTConfig.vocab_size))]
    return args


def strategy_args(config: Any, spec: RunSpec) -> dict[str, Any]:
    """The strategy arguments a row sets on top of its fragment: its own, and the bench's settings its fragment
    lists (results.json's ``strategy_args``; ``{}`` is exactly what ``--config configs/strategy/<fragment>.yaml``
    gives)."""
    path = FRAGMENTS / f"{spec.fragment}.yaml"
    listed = (_load(str(path)).get("trainer", {}).get("strategy", {}) or {}) if path.is_file() else {}
    listed = listed.get("init_args") or {} if isinstance(listed, dict) else {}
    shared = {name: getattr(config, name) for name in STRATEGY_SETTINGS
              if getattr(config, name) is not None and name in listed}
    return {**shared, **spec.args}


def run_args(config: Any, spec: RunSpec, run_dir: Path) -> list[str]:
    """The bench's own trainer settings: ``steps`` iterations on the row's devices, nothing logged, checkpointed or
    validated, Lightning's files in ``run_dir``; synthetic data of one batch per iteration and rank."""
    args = ["--trainer.max_steps", str(config.steps), "--trainer.devices", str(spec.devices),
            "--trainer.default_root_dir", str(run_dir)]
    for key, value in (("logger", "false"), ("enable_checkpointing", "false"), ("enable_progress_bar", "false"),
                       ("enable_model_summary", "false"), ("limit_val_batches", "0"), ("num_sanity_val_steps", "0"),
                       ("val_check_interval", "1.0")):
        args += [f"--trainer.{key}", value]
    if data_class(config) == SYNTHETIC:
        args += ["--data.num_batches", str(config.steps * spec.devices)]
    return args


def recipe_arg(config: Any, run_dir: Path | None, write: bool = True) -> str:
    """``--config``'s value for the recipe: ``--recipe``'s path, or the bench recipe written to ``run_dir/recipe.yaml``
    (inline JSON without a ``run_dir``)."""
    if config.recipe:
        return str(Path(config.recipe).resolve())
    if run_dir is None:
        return json.dumps(BENCH_RECIPE)
    path = Path(run_dir).resolve() / "recipe.yaml"
    if write:
        import yaml

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# the bench's flags made into a recipe (lightning-dos bench without --recipe)\n"
                        + yaml.safe_dump(BENCH_RECIPE, sort_keys=False), encoding="utf-8")
    return str(path)


def fit_args(config: Any, spec: RunSpec, run_dir: Path, write: bool = True) -> list[str]:
    """Everything a worker gives ``DOSLightningCLI`` for ``spec``: recipe, fragment, workload, row, bench settings."""
    run_dir = Path(run_dir).resolve()
    args = ["--config", recipe_arg(config, run_dir, write), "--config", str(fragment_path(spec.fragment))]
    args += workload_args(config)
    for key, value in strategy_args(config, spec).items():
        args += [f"--trainer.strategy.init_args.{key}", _value(value)]
    return args + run_args(config, spec, run_dir)


def command(args: Sequence[str]) -> str:
    """The ``lightning-dos fit`` command line of ``args``, paths under this checkout relative to it."""
    shown = [str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT) + "/configs/") else a for a in args]
    return shlex.join(["lightning-dos", "fit", *shown])


def payload(config: Any, spec: RunSpec, run_dir: Path, extra: dict[str, Any] | None = None,
            write: bool = True) -> dict[str, Any]:
    """What a worker's ``config.json`` holds: the bench settings, the row, the ``lightning-dos fit`` it runs (its
    arguments, and the content of every config file they name) and a mode's ``extra`` entries."""
    args = fit_args(config, spec, run_dir, write)
    files = [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]
    configs = {path: BENCH_RECIPE if not config.recipe and path.endswith("recipe.yaml") else _load(path)
               for path in files}
    return {"bench": config.to_dict(), "run": spec.to_dict(),
            "fit": {"args": args, "command": command(args), "configs": configs}, **(extra or {})}


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


def describe(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(workload, model)`` of ``config``, resolved through the CLI without a Trainer, data prepared once (a corpus
    tokenised): the workload as bench settings (model, seq_len, micro_batch, precision, ...) and the model for the
    report (shape, parameters, FLOPs per token; ``params`` None for a module that is not the GPT)."""
    cli = build(["--config", recipe_arg(config, None), *workload_args(config)], instantiate_trainer=False)
    module, data = cli.model, cli.datamodule
    data.prepare_data()
    trainer, hp = cli.config["trainer"], module.hparams
    workload = {"model": hp.get("name", type(module).__name__), "seq_len": int(data.seq_len),
                "micro_batch": int(data.batch_size), "precision": str(trainer["precision"]),
                "accelerator": str(trainer["accelerator"]), "seed": cli.config["seed_everything"],
                "learning_rate": hp.get("learning_rate"), "data": "text" if type(data).__name__ == "TextDataModule"
                else "synthetic" if type(data).__name__ == "SyntheticDataModule" else type(data).__name__,
                "activation_checkpointing": getattr(getattr(module, "config", None), "activation_checkpointing",
                                                    hp.get("activation_checkpointing"))}
    return workload, describe_model(module, workload["seq_len"])


GIB = 1024**3
#: Lower bound of the bytes ZeRO-3 keeps per parameter without offload: 16-bit param and grad, fp32 master, m, v.
NO_OFFLOAD_BYTES_PER_PARAM = 16


def describe_model(module: Any, seq_len: int) -> dict[str, Any]:
    """The resolved model for results.json and the report: shape, parameter count, FLOPs per token."""
    from lightning_dos.models.gpt import GPTConfig, flops_per_token, num_params

    gpt = getattr(module, "config", None)
    if not isinstance(gpt, GPTConfig):
        flops = getattr(module, "flops_per_token", None)
        return {"preset": type(module).__name__, "params": None,
                "flops_per_token": float(flops(seq_len)) if callable(flops) else None,
                "no_offload_state_gib_lower_bound": None}
    params = num_params(gpt)
    return {"preset": gpt.name, "style": gpt.style, "n_layer": gpt.n_layer, "n_embd": gpt.n_embd, "n_head": gpt.n_head,
            "n_kv_head": gpt.n_kv_head, "intermediate_size": gpt.intermediate_size, "vocab_size": gpt.vocab_size,
            "block_size": gpt.block_size, "params": params, "flops_per_token": flops_per_token(gpt, seq_len),
            "no_offload_state_gib_lower_bound": params * NO_OFFLOAD_BYTES_PER_PARAM / GIB}
