"""The bench's rows run what a user runs: each is a recipe, a strategy fragment of ``configs/strategy/`` and the flags
given, built by the LightningCLI of ``lightning-dos fit``; results.json records the strategy arguments a row sets on
top of its fragment (``strategy_args``; ``{}`` is exactly the fragment)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_dos.bench.compose import BENCH_RECIPE, build, fit_args, strategy_args
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import KINDS, dos_rows, expand

ROOT = Path(__file__).resolve().parents[2]
#: The bench's own trainer settings, which a user's run of the recipe does not have.
BENCH_ONLY = {"max_steps", "devices", "default_root_dir", "logger", "enable_checkpointing", "enable_progress_bar",
              "enable_model_summary", "limit_val_batches", "num_sanity_val_steps", "val_check_interval", "callbacks"}


def _rows(**settings: Any) -> tuple[dict[str, Any], BenchConfig]:
    config = BenchConfig(strategies=["deep_optimizer_states"], **settings)
    config.validate()
    return {spec.label: spec for spec in dos_rows(config)}, config


def _config(cli: Any) -> dict[str, Any]:
    """A CLI's parsed configuration as plain data, without the bench's own trainer settings."""
    data = cli.config.as_dict()
    data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in BENCH_ONLY}
    data["data"]["init_args"].pop("num_batches", None)
    return data


def test_the_default_row_is_what_a_user_gets_from_the_recipe_and_the_fragment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dos(auto)`` with no flags sets nothing over ``configs/strategy/dos_auto.yaml``: its model, data and strategy
    are those of ``lightning-dos fit --config recipe.yaml --config configs/strategy/dos_auto.yaml``."""
    from lightning_dos.cli import DOSLightningCLI

    monkeypatch.chdir(tmp_path)  # the user's Trainer has a default logger

    rows, config = _rows()
    (spec,) = rows.values()
    assert (spec.label, spec.fragment, spec.args, strategy_args(config, spec)) == ("dos(auto)", "dos_auto", {}, {})
    bench = build(fit_args(config, spec, tmp_path), instantiate_trainer=False)
    recipe = tmp_path / "recipe.yaml"
    assert recipe.is_file()
    monkeypatch.setattr(sys, "argv", ["lightning-dos"])  # as from a shell: the arguments below are all it has
    user = DOSLightningCLI(args=["--config", str(recipe), "--config", str(ROOT / "configs/strategy/dos_auto.yaml")],
                           run=False)
    assert _config(bench) == _config(user)
    strategy = bench.config_init["trainer"]["strategy"]
    assert strategy.resident_gib == "auto" and strategy.leaf_blocks == "auto" and strategy.overlap == "auto"
    assert strategy.plan_spec.kind == "auto" and bench.config["model"]["init_args"]["name"] == "gpt-2.7b"
    assert bench.config["data"]["class_path"] == BENCH_RECIPE["data"]["class_path"]


def test_each_option_appears_in_the_label_and_in_the_arguments(tmp_path: Path) -> None:
    rows, config = _rows(overlap=[True], leaf_blocks=[False], resident_gib=["auto", 3.5], plans=["0.25"],
                         memory_budget_gib=20.0, pin_memory=False, sub_group_size=40_000)
    assert set(rows) == {"dos(auto,overlap,layer-hooks)", "dos(auto,overlap,layer-hooks,resident=3.5GiB)",
                         "dos(0.25,overlap,layer-hooks)", "dos(0.25,overlap,layer-hooks,resident=3.5GiB)"}
    spec = rows["dos(0.25,overlap,layer-hooks,resident=3.5GiB)"]
    assert strategy_args(config, spec) == {"sub_group_size": 40_000, "pin_memory": False, "memory_budget_gib": 20.0,
                                           "plan": 0.25, "overlap": True, "leaf_blocks": False, "resident_gib": 3.5}
    strategy = build(fit_args(config, spec, tmp_path), instantiate_trainer=False).config_init["trainer"]["strategy"]
    assert (strategy.resident_gib, strategy.leaf_blocks, strategy.overlap) == (3.5, False, True)
    assert strategy.plan_spec.fraction == 0.25 and strategy.memory_budget_gib == 20.0


def test_rows_of_other_kinds_run_their_fragments(tmp_path: Path) -> None:
    """Every kind has its fragment; a setting reaches only the fragments that list it (ZenFlow's ZeRO-2 has no
    subgroups, plain nothing to pin); a static split of another ratio is vanilla's fragment with the ratio set."""
    config = BenchConfig(strategies=list(KINDS), ratios=[0.5, 0.3], sub_group_size=40_000, pin_memory=False)
    specs = {spec.label: spec for spec in expand(config)}
    assert {label: (spec.fragment, strategy_args(config, spec)) for label, spec in specs.items()} == {
        "zero3_offload": ("zero3_offload", {"sub_group_size": 40_000, "pin_memory": False}),
        "static_split(0.5)": ("static_split_0.5", {"sub_group_size": 40_000, "pin_memory": False}),
        "static_split(0.3)": ("zero3_offload", {"sub_group_size": 40_000, "pin_memory": False, "ratio": 0.3}),
        "dos(auto)": ("dos_auto", {"sub_group_size": 40_000, "pin_memory": False}),
        "no_offload": ("no_offload", {"sub_group_size": 40_000}),
        "plain": ("plain", {}), "torchao_offload": ("torchao_offload", {}),
        "superoffload": ("superoffload", {"sub_group_size": 40_000, "pin_memory": False}),
        "zenflow": ("zenflow", {"pin_memory": False}), "fsdp_offload": ("fsdp_offload", {}),
    }
    assert {(ROOT / "configs" / "strategy" / f"{kind.fragment}.yaml").is_file() for kind in KINDS.values()} == {True}
    split = build(fit_args(config, specs["static_split(0.3)"], tmp_path), instantiate_trainer=False)
    assert split.config_init["trainer"]["strategy"].ratio == 0.3


def test_workload_flags_override_a_recipe(tmp_path: Path) -> None:
    """With ``--recipe`` the workload flags go over it; ``--synthetic`` swaps its data module, whose vocabulary the
    model follows."""
    config = BenchConfig(recipe=str(ROOT / "recipes" / "debug.yaml"), n_layer=3, data="synthetic", vocab_size=96,
                         seq_len=16, micro_batch=2, seed=7)
    spec = expand(BenchConfig(strategies=["zero3_offload"]))[0]
    cli = build(fit_args(config, spec, tmp_path), instantiate_trainer=False)
    assert (cli.model.config.name, cli.model.config.n_layer, cli.model.config.vocab_size) == ("debug", 3, 96)
    assert type(cli.datamodule).__name__ == "SyntheticDataModule" and cli.datamodule.batch_size == 2
    assert cli.config["seed_everything"] == 7 and cli.config["trainer"]["precision"] == "32-true"  # the recipe's
    assert cli.config["trainer"]["max_steps"] == config.steps  # the bench's, not the recipe's 4
    assert not (tmp_path / "recipe.yaml").exists()  # the recipe given is used where it is
