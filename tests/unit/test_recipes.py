"""Every recipe, alone and composed with every config fragment, parses and instantiates through the CLI.

A renamed argument anywhere (model, data module, strategy, logger) breaks one of these tests instead of a
recipe at launch time; an unknown key is reported by name; fragments really replace the recipe's strategy
and logger (jsonargparse carries ``init_args`` over when ``class_path`` changes, which must not leak).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightning.pytorch.loggers import CSVLogger

from lightning_dos import (
    DeepOptimizerStatesStrategy,
    FSDPOffloadStrategy,
    PlainStrategy,
    SuperOffloadStrategy,
    TorchaoOffloadStrategy,
    ZenFlowStrategy,
    ZeRO3OffloadStrategy,
    ZeRO3Strategy,
)
from lightning_dos.cli import DOSLightningCLI
from lightning_dos.data import SyntheticDataModule, TextDataModule
from lightning_dos.models import HFCausalLMModule
from lightning_dos.models.gpt import num_params
from lightning_dos.models.hf import hf_num_params
from lightning_dos.telemetry.callbacks import DOSMetricsLogger, ValLossReport
from lightning_dos.telemetry.loggers import DOSWandbLogger
from tests.support.recipe_run import fragment_recipe, recipe_copy

# the tests pass args while pytest's own arguments sit in sys.argv
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
STRATEGY_FRAGMENTS = sorted((ROOT / "configs" / "strategy").glob("*.yaml"))
LOGGER_FRAGMENTS = sorted((ROOT / "configs" / "logger").glob("*.yaml"))

# recipe -> (model preset, or "hf:<model_type>" for a Hugging Face model, data module class, plan kind); a new recipe
# must be added here
EXPECTED_RECIPES: dict[str, tuple[str, type, str]] = {
    "debug": ("debug", TextDataModule, "fraction"),
    "quickstart": ("gpt-10m", TextDataModule, "auto"),
    "gpt2-124m": ("gpt2-124m", TextDataModule, "auto"),
    "gpt2-350m": ("gpt2-350m", TextDataModule, "auto"),
    "llama-1b": ("llama-1b", TextDataModule, "auto"),
    "llama-3b": ("llama-3b", TextDataModule, "auto"),
    "gpt-2.7b": ("gpt-2.7b", SyntheticDataModule, "auto"),
    "gpt-12b": ("gpt-12b", SyntheticDataModule, "auto"),
    "hf-debug": ("hf:llama", TextDataModule, "fraction"),
    "hf-llama-1b": ("hf:llama", TextDataModule, "auto"),
}
#: The header every recipe starts with (litgpt's and nanoGPT's habit): what it is for, where it runs, what it measured,
#: how to launch it, and its derived numbers.
HEADER_FIELDS = ("Goal:", "Hardware:", "Measured:", "Launch:", "Derived:")
# strategy fragment -> (strategy class, ZeRO stage (None: not DeepSpeed), optimizer state offloaded by DeepSpeed,
# DeepSpeed's static-split ratio)
EXPECTED_STRATEGIES: dict[str, tuple[type, int | None, bool, float | None]] = {
    "dos_auto": (DeepOptimizerStatesStrategy, 3, True, None),
    "zero3_offload": (ZeRO3OffloadStrategy, 3, True, None),
    "static_split_0.25": (ZeRO3OffloadStrategy, 3, True, 0.25),
    "static_split_0.5": (ZeRO3OffloadStrategy, 3, True, 0.5),
    "static_split_0.75": (ZeRO3OffloadStrategy, 3, True, 0.75),
    "no_offload": (ZeRO3Strategy, 3, False, None),
    "plain": (PlainStrategy, None, False, None),
    "torchao_offload": (TorchaoOffloadStrategy, None, False, None),  # torchao offloads, DeepSpeed is not involved
    "superoffload": (SuperOffloadStrategy, 3, True, None),
    "zenflow": (ZenFlowStrategy, 2, True, None),
    "fsdp_offload": (FSDPOffloadStrategy, None, False, None),  # FSDP offloads, DeepSpeed is not involved
}
EXPECTED_LOGGERS: dict[str, type] = {"csv": CSVLogger, "wandb": DOSWandbLogger}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # recipes log under relative paths (runs/); keep whatever instantiation creates out of the repo
    monkeypatch.chdir(tmp_path)


def _cli(*configs: Path, extra: tuple[str, ...] = ()) -> DOSLightningCLI:
    args: list[str] = []
    for config in configs:
        args += ["--config", str(config)]
    if configs and _needs_gpu(configs[0]):
        args += ["--trainer.accelerator", "cpu"]  # GPU recipes are instantiated, never run, on CPU CI
    return DOSLightningCLI(args=[*args, *extra], run=False)


def _needs_gpu(recipe: Path) -> bool:
    return yaml.safe_load(recipe.read_text())["trainer"].get("accelerator") in ("gpu", "cuda")


def _zero(cli: DOSLightningCLI) -> dict[str, Any]:
    return cli.trainer.strategy.config["zero_optimization"]


def _check_recipe(cli: DOSLightningCLI, recipe: Path, stage: int | None = 3) -> None:
    """The recipe's model and data, linked; ZeRO ``stage`` (None: a strategy without a DeepSpeed config)."""
    preset, data_class, _ = EXPECTED_RECIPES[recipe.stem]
    if preset.startswith("hf:"):
        assert type(cli.model) is HFCausalLMModule and cli.model.hparams.model_type == preset[3:]
        assert cli.model.config.model_type == preset[3:]
        context = cli.model.config.max_position_embeddings
    else:
        assert cli.model.hparams.name == preset
        assert cli.model.config.name == preset
        context = cli.model.config.block_size
    assert type(cli.datamodule) is data_class
    # the links: the model's vocabulary and context length follow the data module
    assert cli.model.config.vocab_size == cli.datamodule.vocab_size
    assert context == cli.datamodule.seq_len
    if stage is None:
        assert not hasattr(cli.trainer.strategy, "config")
    else:
        assert _zero(cli)["stage"] == stage


def test_every_recipe_is_listed() -> None:
    assert {p.stem for p in RECIPES} == set(EXPECTED_RECIPES)
    assert {p.stem for p in STRATEGY_FRAGMENTS} == set(EXPECTED_STRATEGIES)
    assert {p.stem for p in LOGGER_FRAGMENTS} == set(EXPECTED_LOGGERS)


def test_every_strategy_fragment_names_its_command() -> None:
    """Each fragment's header says how to try it (the GPU tier runs that command): on a recipe that exists."""
    recipes = {fragment.stem: fragment_recipe(fragment) for fragment in STRATEGY_FRAGMENTS}
    assert all(recipe is not None and recipe.is_file() for recipe in recipes.values()), recipes


@pytest.mark.parametrize("config", RECIPES + STRATEGY_FRAGMENTS + LOGGER_FRAGMENTS, ids=lambda p: p.stem)
def test_every_key_has_a_comment(config: Path) -> None:
    lines = config.read_text().splitlines()
    assert lines[0].startswith("# "), f"{config.name}: starts without a header comment"
    for number, line in enumerate(lines, 1):
        if re.match(r"^\s*[\w.-]+:\s*[^\s#]", line):  # a key with a value (section headers hold only keys)
            assert " # " in line, f"{config.name}:{number}: key without a comment: {line.strip()}"


def _header(recipe: Path) -> str:
    lines = recipe.read_text().splitlines()
    return "\n".join(line for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_header(recipe: Path) -> None:
    header = _header(recipe)
    for field in HEADER_FIELDS:
        assert f"# {field}" in header, f"{recipe.name}: the header has no {field} line"
    assert f"--config recipes/{recipe.name}" in header, f"{recipe.name}: the launch line names another file"
    assert "MEASURED" not in header, f"{recipe.name}: the Measured line is a placeholder"


def _num_params(model: Any) -> int:
    if isinstance(model, HFCausalLMModule):
        h = model.hparams
        return hf_num_params(h.model_type, h.config, h.vocab_size, h.block_size)
    return num_params(model.config)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_derived_numbers(recipe: Path) -> None:
    """The header's parameter count and tokens per step are those of the model and data the recipe builds."""
    cli = _cli(recipe)
    derived = _header(recipe).split("# Derived:", 1)[1]
    params = int(re.search(r"([\d,]+) parameters", derived).group(1).replace(",", ""))
    assert params == _num_params(cli.model)
    batch, seq_len, tokens = re.search(r"(\d+) x (\d+) = ([\d,]+) tokens per step", derived).groups()
    assert (int(batch), int(seq_len)) == (cli.datamodule.batch_size, cli.datamodule.seq_len)
    assert int(tokens.replace(",", "")) == int(batch) * int(seq_len)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_instantiates(recipe: Path) -> None:
    cli = _cli(recipe)
    _check_recipe(cli, recipe)
    strategy = cli.trainer.strategy
    assert type(strategy) is DeepOptimizerStatesStrategy
    assert strategy.plan_spec.kind == EXPECTED_RECIPES[recipe.stem][2]
    assert _zero(cli)["offload_optimizer"]["device"] == "cpu"
    # the CLI adds its callbacks exactly once
    for kind in (ValLossReport, DOSMetricsLogger):
        assert sum(isinstance(c, kind) for c in cli.trainer.callbacks) == 1
    assert cli.trainer.max_steps > 0


def test_quickstart_values() -> None:
    cli = _cli(ROOT / "recipes" / "quickstart.yaml")
    assert cli.trainer.precision == "32-true"
    assert cli.datamodule.paths is None and cli.datamodule.bpe_vocab_size == 4096  # stdlib corpus, 4k BPE
    assert cli.model.config.vocab_size == 4096
    assert isinstance(cli.trainer.logger, CSVLogger)


def test_gpt_2_7b_values() -> None:
    cli = _cli(ROOT / "recipes" / "gpt-2.7b.yaml")
    config = cli.model.config
    assert (config.n_layer, config.n_embd, config.block_size, config.vocab_size) == (32, 2560, 2048, 50304)
    assert config.activation_checkpointing
    assert cli.datamodule.batch_size == 4
    assert cli.trainer.precision == "bf16-mixed"
    assert _zero(cli)["sub_group_size"] == 100_000_000
    assert math.isclose(cli.model.hparams.learning_rate, 1.6e-4)


#: the override depends on the fragment; what a recipe changes is its model (this package's GPT or a Hugging Face one)
#: and the clipping a fragment keeps or drops: every fragment on one recipe of each kind, every other recipe with a
#: fragment of DeepSpeed's and one that is not
ALL_FRAGMENTS_ON, SOME_FRAGMENTS = ("gpt2-124m", "hf-debug"), ("zero3_offload", "fsdp_offload")
RECIPE_FRAGMENTS = [(recipe, fragment) for recipe in RECIPES for fragment in STRATEGY_FRAGMENTS
                    if recipe.stem in ALL_FRAGMENTS_ON or fragment.stem in SOME_FRAGMENTS]


@pytest.mark.parametrize(("recipe", "fragment"), RECIPE_FRAGMENTS,
                         ids=[f"{recipe.stem}-{fragment.stem}" for recipe, fragment in RECIPE_FRAGMENTS])
def test_strategy_fragment_overrides_recipe(recipe: Path, fragment: Path) -> None:
    """Fragments compose with recipes, and only instantiate: torchao_offload needs neither torchao nor a GPU here (it
    refuses them when fit starts), nor do superoffload (CUDA only) and zenflow."""
    cli = _cli(recipe, fragment)
    strategy_class, stage, offloaded, ratio = EXPECTED_STRATEGIES[fragment.stem]
    _check_recipe(cli, recipe, stage)
    strategy = cli.trainer.strategy
    assert type(strategy) is strategy_class
    recipe_clip = yaml.safe_load(recipe.read_text())["trainer"].get("gradient_clip_val")
    # torchao_offload and fsdp_offload cannot clip by norm, so their fragments turn the recipe's clipping off; every
    # other one keeps it
    no_clip = (TorchaoOffloadStrategy, FSDPOffloadStrategy)
    assert cli.trainer.gradient_clip_val == (None if strategy_class in no_clip else recipe_clip)
    if stage is None:  # nothing of DeepSpeed: the recipe's DOS arguments did not leak in
        assert not hasattr(strategy, "plan_spec") and strategy.root_device.type == "cpu"
        if strategy_class is FSDPOffloadStrategy:  # the fragment's FSDP settings
            assert strategy.cpu_offload.offload_params and strategy.sharding_strategy.name == "FULL_SHARD"
            assert strategy.state_dict_type == "sharded" and strategy.kwargs["use_orig_params"] is True
        return
    zero = _zero(cli)
    offload = zero.get("offload_optimizer")
    if offloaded:
        assert offload["device"] == "cpu" and offload["pin_memory"] is True
        assert offload.get("ratio", 1.0) == (ratio if ratio is not None else 1.0)
    else:
        assert not offload
    assert bool(offload and offload.get("super_offload")) == (strategy_class is SuperOffloadStrategy)
    assert ("zenflow" in zero) == (strategy_class is ZenFlowStrategy)
    if strategy_class is DeepOptimizerStatesStrategy:
        assert strategy.plan_spec.kind == "auto"  # the fragment's plan, not the recipe's
    elif strategy_class is ZenFlowStrategy:  # ZeRO-2 has no subgroups; the fragment's ZenFlow settings
        assert zero["zenflow"] == {"topk_ratio": 0.1, "update_interval": 4, "overlap_step": True}
    else:
        assert zero["sub_group_size"] == 100_000_000


@pytest.mark.parametrize("fragment", LOGGER_FRAGMENTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_logger_fragment_overrides_recipe(recipe: Path, fragment: Path) -> None:
    cli = _cli(recipe, fragment)
    logger = cli.trainer.logger
    assert type(logger) is EXPECTED_LOGGERS[fragment.stem]
    # the recipe's run name is kept when the logger class changes
    name = yaml.safe_load(recipe.read_text())["trainer"]["logger"]["init_args"]["name"]
    if isinstance(logger, DOSWandbLogger):
        assert logger._wandb_init["name"] == name and logger._wandb_init["project"] == "lightning-dos"
    else:
        assert logger.name == name


def test_strategy_and_logger_fragments_compose() -> None:
    recipe = ROOT / "recipes" / "quickstart.yaml"
    cli = _cli(recipe, ROOT / "configs/strategy/static_split_0.5.yaml", ROOT / "configs/logger/wandb.yaml")
    assert type(cli.trainer.strategy) is ZeRO3OffloadStrategy and cli.trainer.strategy.ratio == 0.5
    assert type(cli.trainer.logger) is DOSWandbLogger
    # the last fragment wins, and no static-split ratio leaks into the DOS config
    cli = _cli(recipe, ROOT / "configs/strategy/static_split_0.5.yaml", ROOT / "configs/strategy/dos_auto.yaml")
    assert type(cli.trainer.strategy) is DeepOptimizerStatesStrategy
    assert "ratio" not in _zero(cli)["offload_optimizer"]


@pytest.mark.parametrize("name", ["zero3_offload", "static_split_0.25", "zero3", "deep_optimizer_states"])
def test_strategy_by_registered_name(name: str) -> None:
    cli = _cli(ROOT / "recipes" / "debug.yaml", extra=("--trainer.strategy", name))
    assert cli.trainer.strategy.strategy_name == name.replace("static_split_0.25", "zero3_offload")
    assert _zero(cli)["stage"] == 3


@pytest.mark.parametrize(
    ("path", "typo"),
    [
        (("model",), "learnig_rate"),
        (("data", "init_args"), "seq_lenn"),
        (("trainer", "strategy", "init_args"), "plann"),
        (("trainer",), "max_stpes"),
    ],
)
def test_unknown_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: tuple, typo: str) -> None:
    config = yaml.safe_load((ROOT / "recipes" / "debug.yaml").read_text())
    section = config
    for key in path:
        section = section[key]
    section[typo] = 1
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        _cli(bad)
    assert exit_info.value.code != 0
    assert typo in capsys.readouterr().err


def test_data_defaults_to_text_and_synthetic_is_selectable(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "recipes" / "debug.yaml").read_text())
    del config["data"]
    no_data = tmp_path / "no_data.yaml"
    no_data.write_text(yaml.safe_dump(config))
    # no data section: TextDataModule, whose arguments the command line reaches without a class_path
    cli = _cli(no_data, extra=("--data.bpe_vocab_size", "512", "--data.max_bytes", "400000", "--data.seq_len", "32"))
    assert type(cli.datamodule) is TextDataModule
    assert (cli.model.config.vocab_size, cli.model.config.block_size) == (512, 32)
    # the synthetic module by class_path: the model follows its vocabulary and window
    cli = _cli(ROOT / "recipes" / "debug.yaml", extra=("--data", "lightning_dos.data.SyntheticDataModule",
                                                      "--data.vocab_size", "96", "--data.seq_len", "16"))
    assert type(cli.datamodule) is SyntheticDataModule
    assert (cli.model.config.vocab_size, cli.model.config.block_size) == (96, 16)
    assert cli.datamodule.batch_size == 4  # the recipe's batch_size carried over to the new class


def test_the_family_table_of_docs_recipes_gives_each_recipes_steps() -> None:
    text = (ROOT / "docs" / "recipes.md").read_text()
    family = text[text.index("## The family"):text.index("## The largest model")]
    steps = {cells[1].strip(" `"): int(cells[6].replace(",", ""))
             for cells in (line.split("|") for line in family.splitlines() if line.startswith("| `"))}
    assert steps == {p.stem: yaml.safe_load(p.read_text())["trainer"]["max_steps"] for p in RECIPES}


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_copy_for_the_gpu_tier_saves_checkpoints_only_when_asked(checkpoints: bool, tmp_path: Path) -> None:
    """The GPU tier's copies of a recipe: with ``checkpoints=False`` no ModelCheckpoint is left (a recipe's
    ``save_last`` writes one when training ends, whatever the interval: gigabytes on a GPU host's disk)."""
    recipe = ROOT / "recipes" / "llama-3b.yaml"
    cli = _cli(recipe_copy(recipe, tmp_path / "copy", max_steps=3, every_n_train_steps=2, checkpoints=checkpoints))
    saving = cli.trainer.checkpoint_callbacks
    assert [c._every_n_train_steps for c in saving] == ([2] if checkpoints else [])
    assert [Path(c.dirpath) for c in saving] == ([tmp_path / "copy" / "checkpoints"] if checkpoints else [])
