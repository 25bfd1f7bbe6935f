"""Owns the ``lightning-dos bench`` command line: flags, an optional JSON config file, their merge.

Precedence, lowest first: :class:`~lightning_dos.bench.config.BenchConfig` defaults, then ``--config FILE`` (JSON with
the same keys), then the flags given. The workload flags (``--model``, ``--seq-len``, ...) override the recipe every
configuration starts from (``--recipe``, or the bench's own: :mod:`~lightning_dos.bench.compose`); those not given
leave it alone. ``--sweep`` turns the invocation into a plan sweep
(:class:`~lightning_dos.bench.sweep.config.SweepConfig`): the same workload, with its own plan list, iterations per plan
and memory budgets instead of the strategy comparison's options. ``--activations`` turns it into
a ROK curve (:class:`~lightning_dos.bench.rok.config.RokConfig`): the same settings under one strategy, with the
placements, the NVMe directory, the activation offload's knobs and the micro-batch search's budget.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import STRATEGIES, dos_plans, plan_argument
from lightning_dos.bench.rok.config import DEFAULT_DISK_PROBE_MIB, DEFAULT_MAX_MICRO_BATCH, DEFAULT_STRATEGY, RokConfig
from lightning_dos.bench.rok.placements import PLACEMENTS
from lightning_dos.bench.sweep.config import DEFAULT_BUDGETS, DEFAULT_SWEEP_PLANS, SweepConfig

PROG = "lightning-dos bench"
EPILOG = """examples:
  lightning-dos bench                                   # gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, all strategies
  lightning-dos bench --plans host device 0.5 stride:3  # DOS auto plus four fixed plans
  lightning-dos bench --model gpt-1b --strategies zero3_offload deep_optimizer_states --repeats 3
  lightning-dos bench --recipe recipes/gpt-2.7b.yaml    # every configuration starts from a training recipe
  lightning-dos bench --devices 1 2                     # every configuration on one GPU, then data parallel on two
  lightning-dos bench --dry-run                         # print the resolved config and configurations only
  lightning-dos bench --out runs/bench/x --resume       # continue a bench stopped by Ctrl-C or a time limit
  lightning-dos bench --sweep --model gpt-1b            # plan sweep: fixed plans vs auto, unlimited and quarter budget
  lightning-dos bench --activations keep recompute offload-host offload-nvme --nvme-path /mnt/nvme/act
                                                        # the ROK curve: time against activation memory, per placement
  lightning-dos bench --activations keep offload-host --activation-budget-gib 20  # largest micro-batch in 20 GiB
"""
#: Comparison options that mean nothing to a plan sweep (it picks its own strategies, plans and budgets).
NOT_FOR_SWEEP = {"strategies": "--strategies", "ratios": "--ratios", "plans": "--plans (use --sweep-plans)",
                 "repeats": "--repeats", "force_no_offload": "--force-no-offload",
                 "memory_budget_gib": "--memory-budget-gib (use --budgets)",
                 "e2e_steps": "--e2e-steps (the sweep times update phases, every iteration synchronised)",
                 "overlap": "--overlap (the sweep times update phases, which overlap would hide)",
                 "leaf_blocks": "--leaf-blocks (the sweep times update phases)",
                 "resident_gib": "--resident-gib (the sweep compares plans of every subgroup)"}
#: Options of the plan sweep only.
SWEEP_ONLY = {"sweep_plans": "--sweep-plans", "steps_per_plan": "--steps-per-plan", "budgets": "--budgets"}
#: Options of the ROK curve only (``--activations``), and the RokConfig field each sets.
ROK_ONLY = {"nvme_path": ("--nvme-path", "nvme_path"),
            "activation_budget_gib": ("--activation-budget-gib", "budget_gib"),
            "activation_min_tensor_bytes": ("--activation-min-tensor-bytes", "min_tensor_bytes"),
            "activation_keep_last_layers": ("--activation-keep-last-layers", "keep_last_layers"),
            "max_micro_batch": ("--max-micro-batch", "max_micro_batch"),
            "disk_probe_mib": ("--disk-probe-mib", "disk_probe_mib")}
#: Options that mean nothing to the ROK curve (one strategy, one device, the placements set checkpointing).
NOT_FOR_ROK = {"ratios": "--ratios", "repeats": "--repeats", "overlap": "--overlap", "leaf_blocks": "--leaf-blocks",
               "resident_gib": "--resident-gib",
               "force_no_offload": "--force-no-offload",
               "activation_checkpointing": "--[no-]activation-checkpointing (each placement sets it)"}


@dataclass
class Invocation:
    """What the command line asked for: the resolved config and how to run it."""

    config: BenchConfig
    """The fully resolved bench configuration."""
    dry_run: bool = False
    """Print the configuration and the list of configurations, run nothing."""
    resume: bool = False
    """Reuse the configurations that finished in ``--out`` with the same measurement settings (``--resume``)."""
    sweep: SweepConfig | None = None
    """The plan sweep to run instead of the strategy comparison (``--sweep``), or None."""
    rok: RokConfig | None = None
    """The ROK curve to run instead of the strategy comparison (``--activations``), or None."""


def _on_off(text: str) -> bool:
    """``on`` or ``off`` as a bool."""
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return value == "on"


def _auto_on_off(text: str) -> bool | str:
    """``auto``, or ``on`` / ``off`` as a bool."""
    return "auto" if text.strip().lower() == "auto" else _on_off(text)


def _gib_or_auto(text: str) -> float | str:
    """``auto`` or a size in GiB."""
    return "auto" if text.strip().lower() == "auto" else float(text)


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
    p.add_argument("--recipe", metavar="FILE", help="training recipe (YAML, as for lightning-dos fit) every "
                   "configuration starts from, before its strategy fragment; the workload flags override it "
                   "(default: gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, random tokens)")
    p.add_argument("--config", dest="config_file", metavar="FILE", help="JSON file of bench settings (keys as in "
                   "results.json's config); flags override it")
    model = p.add_argument_group("model")
    model.add_argument("--model", metavar="PRESET",
                       help="model preset: debug, gpt-10m, gpt-1b, gpt-2.7b, gpt-4b, ... (default: the recipe's)")
    model.add_argument("--n-layer", dest="n_layer", type=int, metavar="N",
                       help="transformer blocks (overrides the preset)")
    model.add_argument("--n-embd", dest="n_embd", type=int, metavar="N", help="hidden size (overrides the preset)")
    model.add_argument("--n-head", dest="n_head", type=int, metavar="N",
                       help="attention heads (overrides the preset)")
    model.add_argument("--vocab-size", dest="vocab_size", type=int, metavar="N",
                       help="vocabulary of the data, which the model's follows (synthetic vocab_size, text "
                       "bpe_vocab_size)")
    model.add_argument("--activation-checkpointing", dest="activation_checkpointing",
                       action=argparse.BooleanOptionalAction,
                       help="recompute activations in backward (model.activation_checkpointing)")
    train = p.add_argument_group("training")
    train.add_argument("--seq-len", dest="seq_len", type=int, metavar="N", help="tokens per sequence (data.seq_len)")
    train.add_argument("--micro-batch", dest="micro_batch", type=int, metavar="N",
                       help="sequences per iteration per device (data.batch_size)")
    train.add_argument("--precision", metavar="P", help="Lightning precision, e.g. 32-true on a CPU "
                       "(trainer.precision)")
    train.add_argument("--sub-group-size", dest="sub_group_size", type=_count, metavar="N",
                       help="parameters per optimizer-state subgroup, for every strategy fragment that has subgroups "
                       "(default: each fragment's)")
    train.add_argument("--steps", type=int, metavar="N", help="iterations per run, warm-up included (default 10)")
    train.add_argument("--warmup", type=int, metavar="N",
                       help="leading iterations left out of the statistics (default 3)")
    train.add_argument("--e2e-steps", dest="e2e_steps", type=int, metavar="N",
                       help="iterations after the warm-up timed end to end with no synchronisation (the headline); "
                       "the rest are timed phase by phase, synchronised; --steps must exceed --warmup + N "
                       "(default: half the measured iterations, rounded down)")
    train.add_argument("--repeats", type=int, metavar="N",
                       help="fresh-process runs of each configuration (default 1)")
    train.add_argument("--seed", type=int, metavar="N", help="model and data seed (seed_everything)")
    train.add_argument("--lr", dest="learning_rate", type=float, metavar="LR",
                       help="peak AdamW learning rate (model.learning_rate)")
    train.add_argument("--accelerator", metavar="A", help="auto, gpu or cpu (trainer.accelerator)")
    which = p.add_argument_group("configurations")
    which.add_argument("--strategies", nargs="+", choices=STRATEGIES, metavar="KIND",
                       help=f"strategy kinds to run, any of: {', '.join(STRATEGIES)} (default all)")
    which.add_argument("--ratios", nargs="+", type=float, metavar="R",
                       help="static-split ratios, share of the state kept on the host (default 0.25 0.5 0.75)")
    which.add_argument("--plans", nargs="+", metavar="PLAN",
                       help="DOS fixed plans run besides auto: host, device, a fraction, stride:K, or one lane per "
                       "subgroup joined by commas (host,device,...); with --activations, the one plan every placement "
                       "runs under (default auto)")
    which.add_argument("--overlap", nargs="+", type=_auto_on_off, metavar="auto|on|off",
                       help="DOS with the update phase overlapped with the next forward (on, rows dos(PLAN,overlap)), "
                       "serial (off, rows dos(PLAN,serial)) or as the strategy decides (auto: overlapped on CUDA "
                       "devices): one row each, e.g. off on (default auto)")
    which.add_argument("--leaf-blocks", dest="leaf_blocks", nargs="+", type=_on_off, metavar="on|off",
                       help="DOS with ZeRO-3 hooking each transformer block once (on, the strategy's default on one "
                       "device), every layer (off, rows dos(PLAN,layer-hooks)), or both (on off): one row each "
                       "(default on)")
    which.add_argument("--resident-gib", dest="resident_gib", nargs="+", type=_gib_or_auto, metavar="GIB",
                       help="DOS with this many GiB of GPU memory keeping subgroups' optimizer state resident there "
                       "(the strategy's resident_gib): one row each, e.g. auto 0 3.5 (default auto, the strategy's "
                       "default: as much as fits beside the measured peak; 0: none)")
    which.add_argument("--memory-budget-gib", dest="memory_budget_gib", type=float, metavar="GIB",
                       help="most GPU memory the DOS optimizer state may take, GiB (default: what is free)")
    which.add_argument("--pin-memory", dest="pin_memory", action=argparse.BooleanOptionalAction,
                       help="page-locked host memory for offloaded state (default: each fragment's, on)")
    which.add_argument("--force-no-offload", dest="force_no_offload", action="store_true",
                       help="run no_offload even when the model states clearly exceed the GPU memory")
    which.add_argument("--devices", nargs="+", type=int, metavar="N",
                       help="data-parallel device counts: every configuration runs once on each, one rank per device "
                       "on this host, e.g. 1 2 (default 1; single-GPU kinds are skipped above 1)")
    data = p.add_argument_group("data")
    source = data.add_mutually_exclusive_group()
    source.add_argument("--synthetic", dest="data", action="store_const", const="synthetic",
                        help="deterministic random tokens (SyntheticDataModule; default: the recipe's data)")
    source.add_argument("--text", dest="data", action="store_const", const="text",
                        help="a real tokenised corpus (TextDataModule: the Python standard library unless "
                        "--data-path)")
    data.add_argument("--data-path", dest="data_paths", nargs="+", metavar="PATH",
                      help="text files, directories or globs for --text")
    data.add_argument("--tokenizer", metavar="FILE",
                      help="tokenizer file for --text (default: train a BPE tokenizer once)")
    sweep = p.add_argument_group("plan sweep (--sweep)")
    sweep.add_argument("--sweep", action="store_true",
                       help="run a plan sweep instead of the strategy comparison: per budget, every fixed plan in one "
                       "DOS process (switching plans every --steps-per-plan iterations) and auto in another "
                       "(--steps iterations, --warmup left out)")
    sweep.add_argument("--sweep-plans", dest="sweep_plans", nargs="+", metavar="PLAN",
                       help=f"fixed plans swept, in order (default {' '.join(DEFAULT_SWEEP_PLANS)})")
    sweep.add_argument("--steps-per-plan", dest="steps_per_plan", type=int, metavar="N",
                       help="iterations each fixed plan is held for, the first left out (default 3)")
    sweep.add_argument("--budgets", nargs="+", metavar="BUDGET",
                       help="DOS memory budgets: unlimited, quarter (0.25 x 12 bytes x parameters) or GiB "
                       f"(default {' '.join(DEFAULT_BUDGETS)})")
    rok = p.add_argument_group("ROK curve (--activations)")
    rok.add_argument("--activations", nargs="+", metavar="PLACEMENT",
                     help="run the recompute-offload-keep curve instead of the strategy comparison: each placement "
                     f"({', '.join(PLACEMENTS)}) in its own process under one strategy (--strategies "
                     f"{DEFAULT_STRATEGY} by default, or zero3_offload); iteration time against peak activation "
                     "memory")
    rok.add_argument("--nvme-path", dest="nvme_path", metavar="DIR",
                     help="an existing, writable directory on a local NVMe disk for offload-nvme's activation files "
                     "(required by offload-nvme; its bandwidth is measured there too)")
    rok.add_argument("--activation-budget-gib", dest="activation_budget_gib", type=float, metavar="GIB",
                     help="also find, per placement, the largest micro-batch whose peak activation memory fits GIB "
                     "(doubling from --micro-batch, then bisecting; each probe a short run), and its tokens/s")
    rok.add_argument("--activation-min-tensor-bytes", dest="activation_min_tensor_bytes", type=_count, metavar="N",
                     help="saved tensors smaller than this stay on the device (default 1048576)")
    rok.add_argument("--activation-keep-last-layers", dest="activation_keep_last_layers", type=int, metavar="N",
                     help="the last N blocks keep their activations on the device (default 1)")
    rok.add_argument("--max-micro-batch", dest="max_micro_batch", type=int, metavar="N",
                     help=f"the largest micro-batch the budget search tries (default {DEFAULT_MAX_MICRO_BATCH})")
    rok.add_argument("--disk-probe-mib", dest="disk_probe_mib", type=int, metavar="MIB",
                     help="MiB written and read back under --nvme-path to measure its bandwidth (default "
                     f"{DEFAULT_DISK_PROBE_MIB}; 0: not measured)")
    run = p.add_argument_group("running")
    run.add_argument("--timeout", dest="timeout_s", type=float, metavar="SECONDS",
                     help="seconds per configuration, start-up included (default 1800)")
    run.add_argument("--out", metavar="DIR", help="output directory (default runs/bench/<model>_<timestamp>, "
                     "runs/sweep/<model>_<timestamp> with --sweep, runs/rok/<model>_<timestamp> with --activations)")
    run.add_argument("--dry-run", dest="dry_run", action="store_true",
                     help="print the resolved configuration and the configurations, run nothing")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted bench in --out: the runs that finished there running exactly the "
                     "same are reused, the others run (configurations; with --sweep a budget's process; with "
                     "--activations placement runs and search probes, e.g. to search a budget after the curve)")
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


def sweep_settings(given: dict[str, Any]) -> dict[str, Any]:
    """Take the plan sweep's own options out of ``given``; ``ValueError`` for options of the other mode."""
    sweep = bool(given.pop("sweep", False))
    own = {key: given.pop(key) for key in list(SWEEP_ONLY) if key in given}
    if not sweep:
        if own:
            raise ValueError(f"{', '.join(SWEEP_ONLY[key] for key in own)}: only with --sweep")
        return {}
    wrong = [flag for key, flag in NOT_FOR_SWEEP.items() if key in given]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: not used by --sweep")
    settings: dict[str, Any] = {"sweep": True}
    if "sweep_plans" in own:
        settings["plans"] = [str(plan) for plan in own["sweep_plans"]]
    if "steps_per_plan" in own:
        settings["steps_per_plan"] = own["steps_per_plan"]
    if "budgets" in own:
        settings["budgets"] = [str(budget) for budget in own["budgets"]]
    return settings


def rok_settings(given: dict[str, Any]) -> dict[str, Any] | None:
    """Take the ROK curve's own options out of ``given`` (RokConfig fields); None without ``--activations``.

    ``ValueError`` for options of the other modes, ``--sweep``, and ROK options without ``--activations``.
    """
    placements = given.pop("activations", None)
    own = {key: given.pop(key) for key in list(ROK_ONLY) if key in given}
    if placements is None:
        if own:
            raise ValueError(f"{', '.join(ROK_ONLY[key][0] for key in own)}: only with --activations")
        return None
    if given.get("sweep"):
        raise ValueError("--activations: cannot be combined with --sweep (a plan sweep is another mode); run them "
                         "separately")
    wrong = [flag for key, flag in NOT_FOR_ROK.items() if key in given]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: not used by --activations")
    return {"placements": [str(name) for name in placements],
            **{ROK_ONLY[key][1]: value for key, value in own.items()}}


def parse_args(argv: list[str] | None) -> Invocation:
    """Parse ``argv`` into a validated :class:`Invocation`; bad values exit with status 2 like any CLI error."""
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    dry_run = bool(given.pop("dry_run", False))
    resume = bool(given.pop("resume", False))
    if resume and not given.get("out"):
        parser.error("--resume: set --out to the directory of the bench to continue")
    settings: dict[str, Any] = {}
    config_file = given.pop("config_file", None)
    if given.get("recipe") is not None and not Path(given["recipe"]).is_file():
        parser.error(f"--recipe {given['recipe']}: no such file")
    sweep: SweepConfig | None = None
    rok: RokConfig | None = None
    try:
        rok_given = rok_settings(given)
        sweep_given = sweep_settings(given)
        if config_file is not None:
            settings.update(load_config_file(config_file))
        settings.update(given)
        config = BenchConfig.from_dict(settings)
        if sweep_given:
            sweep_given.pop("sweep")
            # DOS only; the budgets say the memory budget, per process
            config.strategies, config.ratios, config.plans, config.repeats = ["deep_optimizer_states"], [], ["auto"], 1
            config.memory_budget_gib = None
            config.e2e_steps = 0  # its figures are update phases and synchronised iterations, by index
            sweep = SweepConfig(bench=config, **sweep_given)
            sweep.validate()
        elif rok_given is not None:
            if "strategies" not in given:
                config.strategies = [DEFAULT_STRATEGY]
            config.ratios, config.repeats = [], 1
            if "plans" not in given:
                config.plans = ["auto"]
            rok = RokConfig(bench=config, **rok_given)
            rok.validate()
        else:
            config.validate()
            check_plans(config)
    except (OSError, ValueError, TypeError, ImportError) as err:
        parser.error(str(err))
    return Invocation(config=config, dry_run=dry_run, sweep=sweep, resume=resume, rok=rok)
