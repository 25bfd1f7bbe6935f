"""Owns the ``lightning-dos bench`` command line: flags, an optional JSON config file, and their merge.

Precedence, lowest first: :class:`~lightning_dos.bench.config.BenchConfig` defaults (a GPU host running
gpt-2.7b), then ``--recipe FILE`` (a training recipe's model, data and precision), then ``--config FILE``
(JSON with the same keys), then the flags given. Flags that are not given leave the lower layers alone, so a
recipe or config file can be tweaked from the command line.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import STRATEGIES, BenchConfig, dos_plans, plan_argument
from lightning_dos.bench.recipe import recipe_settings

PROG = "lightning-dos bench"
EPILOG = """examples:
  lightning-dos bench                                   # gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, all strategies
  lightning-dos bench --plans host device 0.5 stride:3  # DOS auto plus four fixed plans
  lightning-dos bench --model gpt-1b --strategies zero3_offload deep_optimizer_states --repeats 3
  lightning-dos bench --recipe recipes/gpt-2.7b.yaml    # model, data, batch and precision of a training recipe
  lightning-dos bench --dry-run                         # print the resolved config and configurations only
"""


@dataclass
class Invocation:
    """What the command line asked for: the resolved config and how to run it."""

    config: BenchConfig
    """The fully resolved bench configuration."""
    dry_run: bool = False
    """Print the configuration and the list of configurations, run nothing."""


def _count(text: str) -> int:
    """A positive count that may be written in scientific notation, e.g. ``1e8``."""
    value = float(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every option defaults to "not given" so lower layers show through."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Compare optimizer-offload strategies (vanilla ZeRO-3 offload, DeepSpeed's static split, "
        "Deep Optimizer States, no offload) on this host: same model, data, seed and batch, each configuration "
        "in its own process.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--recipe", metavar="FILE", help="training recipe (YAML, as for lightning-dos fit) to take the "
                   "model, data, batch, precision and seed from; --config and flags override it")
    p.add_argument("--config", dest="config_file", metavar="FILE", help="JSON file of bench settings (keys as in "
                   "results.json's config); flags override it")
    model = p.add_argument_group("model")
    model.add_argument("--model", metavar="PRESET",
                       help="model preset: debug, gpt-10m, gpt-1b, gpt-2.7b (default), gpt-4b")
    model.add_argument("--n-layer", dest="n_layer", type=int, metavar="N",
                       help="transformer blocks (overrides the preset)")
    model.add_argument("--n-embd", dest="n_embd", type=int, metavar="N", help="hidden size (overrides the preset)")
    model.add_argument("--n-head", dest="n_head", type=int, metavar="N",
                       help="attention heads (overrides the preset)")
    model.add_argument("--vocab-size", dest="vocab_size", type=int, metavar="N",
                       help="vocabulary size (overrides the preset)")
    model.add_argument("--activation-checkpointing", dest="activation_checkpointing",
                       action=argparse.BooleanOptionalAction, help="recompute activations in backward (default on)")
    train = p.add_argument_group("training")
    train.add_argument("--seq-len", dest="seq_len", type=int, metavar="N", help="tokens per sequence (default 2048)")
    train.add_argument("--micro-batch", dest="micro_batch", type=int, metavar="N",
                       help="sequences per iteration (default 4)")
    train.add_argument("--precision", metavar="P", help="Lightning precision (default bf16-mixed; 32-true on a CPU)")
    train.add_argument("--sub-group-size", dest="sub_group_size", type=_count, metavar="N",
                       help="parameters per optimizer-state subgroup, every strategy (default 1e8)")
    train.add_argument("--steps", type=int, metavar="N", help="iterations per run, warm-up included (default 10)")
    train.add_argument("--warmup", type=int, metavar="N",
                       help="leading iterations left out of the statistics (default 3)")
    train.add_argument("--repeats", type=int, metavar="N",
                       help="fresh-process runs of each configuration (default 1)")
    train.add_argument("--seed", type=int, metavar="N", help="model and data seed (default 1234)")
    train.add_argument("--lr", dest="learning_rate", type=float, metavar="LR",
                       help="AdamW learning rate (default 3e-4)")
    train.add_argument("--accelerator", metavar="A", help="auto (default), gpu or cpu")
    which = p.add_argument_group("configurations")
    which.add_argument("--strategies", nargs="+", choices=STRATEGIES, metavar="KIND",
                       help=f"strategy kinds to run, any of: {', '.join(STRATEGIES)} (default all)")
    which.add_argument("--ratios", nargs="+", type=float, metavar="R",
                       help="static-split ratios, share of the state kept on the host (default 0.25 0.5 0.75)")
    which.add_argument("--plans", nargs="+", metavar="PLAN",
                       help="DOS fixed plans run besides auto: host, device, a fraction, stride:K, or one lane per "
                       "subgroup joined by commas (host,device,...)")
    which.add_argument("--memory-budget-gib", dest="memory_budget_gib", type=float, metavar="GIB",
                       help="DOS device-lane memory budget in GiB (default: what is free)")
    which.add_argument("--pin-memory", dest="pin_memory", action=argparse.BooleanOptionalAction,
                       help="page-locked host memory for offloaded state (default on)")
    which.add_argument("--force-no-offload", dest="force_no_offload", action="store_true",
                       help="run no_offload even when the model states clearly exceed the GPU memory")
    data = p.add_argument_group("data")
    source = data.add_mutually_exclusive_group()
    source.add_argument("--synthetic", dest="data", action="store_const", const="synthetic",
                        help="deterministic random tokens (default)")
    source.add_argument("--text", dest="data", action="store_const", const="text",
                        help="a real tokenised corpus (the Python standard library unless --data-path)")
    data.add_argument("--data-path", dest="data_paths", nargs="+", metavar="PATH",
                      help="text files, directories or globs for --text")
    data.add_argument("--tokenizer", metavar="FILE",
                      help="tokenizer file for --text (default: train a BPE tokenizer once)")
    run = p.add_argument_group("running")
    run.add_argument("--timeout", dest="timeout_s", type=float, metavar="SECONDS",
                     help="seconds per configuration, start-up included (default 1800)")
    run.add_argument("--out", metavar="DIR", help="output directory (default runs/bench/<model>_<timestamp>)")
    run.add_argument("--dry-run", dest="dry_run", action="store_true",
                     help="print the resolved configuration and the configurations, run nothing")
    return p


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of a JSON config file (a bare object, or results.json's ``config``)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a JSON object of bench settings")
    if "config" in data and "results" in data:  # a results.json: rerun its configuration
        data = data["config"]
    return data


def check_plans(config: BenchConfig) -> None:
    """Raise ``ValueError`` for a DOS plan the strategy would refuse, before any worker starts."""
    if "deep_optimizer_states" not in config.strategies:
        return
    from lightning_dos.planning.plan import parse_plan

    for plan in dos_plans(config):
        parse_plan(plan_argument(plan))


def parse_args(argv: list[str] | None) -> Invocation:
    """Parse ``argv`` into a validated :class:`Invocation`; bad values exit with status 2 like any CLI error."""
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    dry_run = bool(given.pop("dry_run", False))
    settings: dict[str, Any] = {}
    config_file = given.pop("config_file", None)
    try:
        if given.get("recipe") is not None:
            settings.update(recipe_settings(given["recipe"]))
        if config_file is not None:
            settings.update(load_config_file(config_file))
        settings.update(given)
        config = BenchConfig.from_dict(settings)
        config.validate()
        check_plans(config)
    except (OSError, ValueError, TypeError, ImportError) as err:
        parser.error(str(err))
    return Invocation(config=config, dry_run=dry_run)
