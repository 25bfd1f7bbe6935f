"""Owns reading a training recipe (the YAML that ``lightning-dos fit --config`` takes) into bench settings.

Only what defines the workload is taken: the model preset and shape, activation checkpointing and learning
rate; the data source, sequence length, micro-batch and vocabulary; the precision; the strategy's integer
``sub_group_size``, ``pin_memory`` and ``memory_budget_gib``; the seed. Steps, logging, checkpointing and the
recipe's own strategy choice are not: the bench decides those. Both ``{class_path, init_args}`` sections and
plain ones are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: recipe ``model`` key -> bench setting
MODEL_KEYS = {"name": "model", "n_layer": "n_layer", "n_embd": "n_embd", "n_head": "n_head",
              "vocab_size": "vocab_size", "activation_checkpointing": "activation_checkpointing",
              "learning_rate": "learning_rate"}
#: recipe ``data`` key -> bench setting
DATA_KEYS = {"seq_len": "seq_len", "batch_size": "micro_batch", "vocab_size": "vocab_size", "paths": "data_paths",
             "tokenizer": "tokenizer", "bpe_vocab_size": "bpe_vocab_size", "max_bytes": "max_bytes"}
STRATEGY_KEYS = ("pin_memory", "memory_budget_gib")


def _init_args(section: Any) -> tuple[str | None, dict[str, Any]]:
    """``(class_path, arguments)`` of a recipe section in either form."""
    if not isinstance(section, dict):
        return None, {}
    if "class_path" in section:
        return str(section["class_path"]), dict(section.get("init_args") or {})
    return None, dict(section)


def recipe_settings(path: str | Path) -> dict[str, Any]:
    """The bench settings a recipe file defines (keys of :class:`~lightning_dos.bench.config.BenchConfig`)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        try:
            recipe = yaml.safe_load(fh) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"--recipe {path}: not valid YAML: {err}") from err
    if not isinstance(recipe, dict):
        raise ValueError(f"--recipe {path}: expected a YAML mapping with model/data/trainer sections")
    settings: dict[str, Any] = {}
    data_class, data_args = _init_args(recipe.get("data"))
    if data_class is not None:
        settings["data"] = "text" if data_class.endswith("TextDataModule") else "synthetic"
    for key, setting in DATA_KEYS.items():
        if data_args.get(key) is not None:
            settings[setting] = data_args[key]
    _, model_args = _init_args(recipe.get("model"))
    for key, setting in MODEL_KEYS.items():
        if model_args.get(key) is not None:
            settings[setting] = model_args[key]
    trainer = recipe.get("trainer") or {}
    if isinstance(trainer, dict):
        if trainer.get("precision") is not None:
            settings["precision"] = str(trainer["precision"])
        _, strategy_args = _init_args(trainer.get("strategy"))
        sub = strategy_args.get("sub_group_size")
        if isinstance(sub, (int, float)) and not isinstance(sub, bool):
            settings["sub_group_size"] = int(sub)
        for key in STRATEGY_KEYS:
            if key in strategy_args:
                settings[key] = strategy_args[key]
    seed = recipe.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        settings["seed"] = seed
    if isinstance(settings.get("data_paths"), str):
        settings["data_paths"] = [settings["data_paths"]]
    for key in ("learning_rate",):
        if key in settings:
            settings[key] = float(settings[key])
    settings["recipe"] = str(path)
    return settings
