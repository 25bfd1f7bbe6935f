"""Owns the ``lightning-dos bench`` command line: flags, an optional JSON config file, their merge.

Precedence, lowest first: :class:`~lightning_dos.bench.config.BenchConfig`'s defaults, ``--config FILE`` (JSON of the
same keys), the flags given; the workload flags go over the recipe (:mod:`~lightning_dos.bench.compose`). ``--sweep``
and ``--activations`` turn the invocation into a plan sweep or a ROK curve, each with options of its own.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import STRATEGIES, dos_plans, plan_argument
from lightning_dos.bench.rok import config as rok_config
from lightning_dos.bench.rok.config import DEFAULT_STRATEGY, PLACEMENTS, RokConfig
from lightning_dos.bench.sweep.config import DEFAULT_BUDGETS, DEFAULT_SWEEP_PLANS, SweepConfig

EPILOG = """examples:
  lightning-dos bench                                   # gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, all strategies
  lightning-dos bench --plans host device 0.5 stride:3  # DOS auto plus four fixed plans
  lightning-dos bench --model gpt-1b --strategies zero3_offload deep_optimizer_states --repeats 3
  lightning-dos bench --recipe recipes/gpt2-124m.yaml   # every configuration starts from a training recipe
  lightning-dos bench --devices 1 2                     # every configuration on one GPU, then data parallel on two
  lightning-dos bench --dry-run                         # the resolved settings and each configuration's command
  lightning-dos bench --out runs/bench/x --resume       # continue a bench stopped by Ctrl-C or a time limit
  lightning-dos bench --sweep --model gpt-1b            # plan sweep: fixed plans vs auto, unlimited and quarter budget
  lightning-dos bench --activations keep recompute offload-host offload-nvme --nvme-path /mnt/nvme/act  # ROK curve
  lightning-dos bench --activations keep offload-host --activation-budget-gib 20  # largest micro-batch in 20 GiB
"""
#: Comparison options a plan sweep refuses (it picks its own strategies, plans and budgets), and why.
NOT_FOR_SWEEP = {"strategies": "--strategies", "ratios": "--ratios", "plans": "--plans (use --sweep-plans)",
                 "repeats": "--repeats", "force_no_offload": "--force-no-offload",
                 "memory_budget_gib": "--memory-budget-gib (use --budgets)",
                 "e2e_steps": "--e2e-steps (the sweep times update phases, every iteration synchronised)",
                 "overlap": "--overlap (the sweep times update phases, which overlap would hide)",
                 "leaf_blocks": "--leaf-blocks (the sweep times update phases)",
                 "resident_gib": "--resident-gib (the sweep compares plans of every subgroup)"}
#: Options of the plan sweep only (each the flag of its name): the SweepConfig field it sets.
SWEEP_ONLY = {"sweep_plans": "plans", "steps_per_plan": "steps_per_plan", "budgets": "budgets"}
#: Options of the ROK curve only (each the flag of its name): the RokConfig field it sets.
ROK_ONLY = {"nvme_path": "nvme_path", "activation_budget_gib": "budget_gib",
            "activation_min_tensor_bytes": "min_tensor_bytes", "activation_keep_last_layers": "keep_last_layers",
            "max_micro_batch": "max_micro_batch", "disk_probe_mib": "disk_probe_mib"}
#: Options the ROK curve refuses (one strategy, one device, each placement sets checkpointing).
NOT_FOR_ROK = {"ratios": "--ratios", "repeats": "--repeats", "overlap": "--overlap", "leaf_blocks": "--leaf-blocks",
               "resident_gib": "--resident-gib", "force_no_offload": "--force-no-offload",
               "activation_checkpointing": "--[no-]activation-checkpointing (each placement sets it)"}


@dataclass
class Invocation:
    """What the command line asked for."""

    config: BenchConfig  # The bench settings (in a sweep or a ROK curve, those of its ``bench``).
    dry_run: bool = False  # Print the settings and the runs, run nothing.
    resume: bool = False  # Reuse the runs that finished in ``--out`` running exactly the same (``--resume``).
    sweep: SweepConfig | None = None  # The plan sweep to run instead of the comparison (``--sweep``).
    rok: RokConfig | None = None  # The ROK curve to run instead of the comparison (``--activations``).


def _on_off(text: str) -> bool:
    if text.strip().lower() not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return text.strip().lower() == "on"


def _auto_on_off(text: str) -> bool | str:
    return "auto" if text.strip().lower() == "auto" else _on_off(text)


def _gib_or_auto(text: str) -> float | str:
    return "auto" if text.strip().lower() == "auto" else float(text)


def _count(text: str) -> int:
    """A whole number, maybe in scientific notation (``1e8``)."""
    value = float(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every option defaults to "not given" so lower layers show through."""
    p = argparse.ArgumentParser(prog="lightning-dos bench", epilog=EPILOG, argument_default=argparse.SUPPRESS,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Compare optimizer-offload strategies on this host: one recipe under each "
                                "strategy fragment, each configuration its own lightning-dos fit process.")
    p.add_argument("--recipe", metavar="FILE", help="training recipe (YAML, as for lightning-dos fit) every "
                   "configuration starts from (default: gpt-2.7b, seq 2048, micro-batch 4, bf16-mixed, random tokens)")
    p.add_argument("--config", dest="config_file", metavar="FILE", help="JSON of bench settings (results.json's "
                   "config, or a results.json); flags override it")
    w = p.add_argument_group("workload: over the recipe, as the lightning-dos fit argument named (default: its)")
    w.add_argument("--model", metavar="PRESET", help="model.name: debug, gpt-10m, gpt-1b, gpt-2.7b, gpt-4b, ...")
    for key, target in (("n_layer", "model"), ("n_embd", "model"), ("n_head", "model"), ("seq_len", "data")):
        w.add_argument(f"--{key.replace('_', '-')}", type=int, metavar="N", help=f"{target}.{key}")
    w.add_argument("--vocab-size", type=int, metavar="N",
                   help="the data's vocabulary, the model's too (data.vocab_size; data.bpe_vocab_size with text)")
    w.add_argument("--micro-batch", type=int, metavar="N", help="data.batch_size (per device)")
    w.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction,
                   help="model.activation_checkpointing")
    w.add_argument("--precision", metavar="P", help="trainer.precision, e.g. 32-true on a CPU")
    w.add_argument("--seed", type=int, metavar="N", help="seed_everything")
    w.add_argument("--lr", dest="learning_rate", type=float, metavar="LR", help="model.learning_rate")
    w.add_argument("--accelerator", metavar="A", help="trainer.accelerator: auto, gpu or cpu")
    source = w.add_mutually_exclusive_group()
    source.add_argument("--synthetic", dest="data", action="store_const", const="synthetic",
                        help="data: random tokens (SyntheticDataModule)")
    source.add_argument("--text", dest="data", action="store_const", const="text",
                        help="data: a tokenised corpus (TextDataModule; the standard library unless --data-path)")
    w.add_argument("--data-path", dest="data_paths", nargs="+", metavar="PATH", help="data.paths (--text)")
    w.add_argument("--tokenizer", metavar="FILE", help="data.tokenizer (--text; default: a BPE trained once)")
    w.add_argument("--sub-group-size", type=_count, metavar="N",
                   help="parameters per subgroup, for every fragment that has subgroups (default: each fragment's)")
    w.add_argument("--pin-memory", action=argparse.BooleanOptionalAction,
                   help="page-locked host memory, for every fragment that pins (default: each fragment's, on)")
    w.add_argument("--memory-budget-gib", type=float, metavar="GIB",
                   help="most GPU memory the DOS optimizer state may take (default: what is free)")
    c = p.add_argument_group("configurations")
    c.add_argument("--steps", type=int, metavar="N", help="iterations per run, warm-up included (default 10)")
    c.add_argument("--warmup", type=int, metavar="N", help="leading iterations left out (default 3)")
    c.add_argument("--e2e-steps", type=int, metavar="N", help="iterations after the warm-up timed end to end, "
                   "unsynchronised (the headline); the rest phase by phase (default: half, rounded down)")
    c.add_argument("--repeats", type=int, metavar="N", help="fresh-process runs of each configuration (default 1)")
    c.add_argument("--strategies", nargs="+", choices=STRATEGIES, metavar="KIND",
                   help=f"strategy kinds: {', '.join(STRATEGIES)} (default all)")
    c.add_argument("--ratios", nargs="+", type=float, metavar="R", help="static-split ratios (default 0.25 0.5 0.75)")
    c.add_argument("--plans", nargs="+", metavar="PLAN", help="DOS fixed plans besides auto: host, device, a fraction, "
                   "stride:K, lanes joined by commas (with --activations: the one plan)")
    c.add_argument("--overlap", nargs="+", type=_auto_on_off, metavar="auto|on|off", help="DOS rows with the update as "
                   "the strategy decides (auto, default), overlapped with the next forward (on) or serial (off)")
    c.add_argument("--leaf-blocks", nargs="+", type=_on_off, metavar="on|off",
                   help="DOS rows with ZeRO-3 hooking each block once (on, default) or every layer (off)")
    c.add_argument("--resident-gib", nargs="+", type=_gib_or_auto, metavar="GIB",
                   help="DOS rows with this much optimizer state resident (auto, default: what fits; 0: none)")
    c.add_argument("--force-no-offload", action="store_true", help="run no_offload even when it clearly cannot fit")
    c.add_argument("--devices", nargs="+", type=int, metavar="N", help="data-parallel device counts (default 1)")
    s = p.add_argument_group("plan sweep")
    s.add_argument("--sweep", action="store_true", help="per budget, every fixed plan and auto in one DOS process")
    s.add_argument("--sweep-plans", nargs="+", metavar="PLAN",
                   help=f"fixed plans (default {' '.join(DEFAULT_SWEEP_PLANS)})")
    s.add_argument("--steps-per-plan", type=int, metavar="N",
                   help="iterations of each fixed plan, the first left out (default 3)")
    s.add_argument("--budgets", nargs="+", metavar="BUDGET",
                   help=f"unlimited, quarter or GiB (default {' '.join(DEFAULT_BUDGETS)})")
    r = p.add_argument_group("ROK curve")
    r.add_argument("--activations", nargs="+", metavar="PLACEMENT", help=f"the ROK curve: {', '.join(PLACEMENTS)}, "
                   f"under one strategy (default {DEFAULT_STRATEGY}, or zero3_offload)")
    r.add_argument("--nvme-path", metavar="DIR", help="a local NVMe directory, for offload-nvme")
    r.add_argument("--activation-budget-gib", type=float, metavar="GIB",
                   help="search each placement's largest micro-batch within GIB of activation memory")
    r.add_argument("--activation-min-tensor-bytes", type=_count, metavar="N",
                   help="smaller saved tensors stay on the device (default 1048576)")
    r.add_argument("--activation-keep-last-layers", type=int, metavar="N",
                   help="the last N blocks keep their activations (default 1)")
    r.add_argument("--max-micro-batch", type=int, metavar="N",
                   help=f"the search's largest micro-batch (default {rok_config.DEFAULT_MAX_MICRO_BATCH})")
    r.add_argument("--disk-probe-mib", type=int, metavar="MIB",
                   help=f"MiB measuring --nvme-path's bandwidth (default {rok_config.DEFAULT_DISK_PROBE_MIB}; 0: none)")
    x = p.add_argument_group("running")
    x.add_argument("--timeout", dest="timeout_s", type=float, metavar="SECONDS", help="per worker (default 1800)")
    x.add_argument("--out", metavar="DIR", help="output directory (default runs/<bench|sweep|rok>/<model>_<time>)")
    x.add_argument("--dry-run", action="store_true",
                   help="print the settings and each run's lightning-dos fit, run nothing")
    x.add_argument("--resume", action="store_true", help="with --out: reuse the runs that finished there running "
                   "exactly the same, run the others")
    return p


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of a JSON config file (a bare object, or results.json's ``config``)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a JSON object of bench settings")
    return data["config"] if "config" in data and "results" in data else data


def _mode(given: dict[str, Any], flag: str, own: dict[str, str],
          refused: dict[str, str]) -> tuple[Any, dict[str, Any]] | None:
    """Take a mode's own options (``own``: the field each sets) out of ``given`` when ``flag`` is set: its value and
    the mode's fields they set (None when it is not set); ``ValueError`` for options of another mode."""
    on = given.pop(flag.strip("-"), None)
    taken = {key: given.pop(key) for key in list(own) if key in given}
    if not on:
        if taken:
            raise ValueError(f"{', '.join('--' + key.replace('_', '-') for key in taken)}: only with {flag}")
        return None
    wrong = [text for key, text in refused.items() if key in given]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: not used by {flag}")
    return on, {own[key]: value for key, value in taken.items()}


def parse_args(argv: list[str] | None) -> Invocation:
    """Parse ``argv`` into a validated :class:`Invocation`; bad values exit with status 2 like any CLI error."""
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    dry_run, resume = bool(given.pop("dry_run", False)), bool(given.pop("resume", False))
    if resume and not given.get("out"):
        parser.error("--resume: set --out to the directory of the bench to continue")
    if given.get("recipe") is not None and not Path(given["recipe"]).is_file():
        parser.error(f"--recipe {given['recipe']}: no such file")
    config_file = given.pop("config_file", None)
    sweep: SweepConfig | None = None
    rok: RokConfig | None = None
    try:
        if given.get("activations") is not None and given.get("sweep"):
            raise ValueError("--activations: cannot be combined with --sweep (another mode); run them separately")
        rok_given = _mode(given, "--activations", ROK_ONLY, NOT_FOR_ROK)
        sweep_given = _mode(given, "--sweep", SWEEP_ONLY, NOT_FOR_SWEEP)
        config = BenchConfig.from_dict({**(load_config_file(config_file) if config_file else {}), **given})
        if sweep_given is not None:  # DOS only, serial; the budgets are its memory budgets, one process each
            config.strategies, config.ratios, config.plans, config.repeats = ["deep_optimizer_states"], [], ["auto"], 1
            config.memory_budget_gib, config.e2e_steps = None, 0  # its figures are update phases, by iteration
            sweep = SweepConfig(bench=config, **sweep_given[1])
            sweep.validate()
        elif rok_given is not None:
            config.strategies = config.strategies if "strategies" in given else [DEFAULT_STRATEGY]
            config.plans = config.plans if "plans" in given else ["auto"]
            config.ratios, config.repeats = [], 1
            rok = RokConfig(bench=config, placements=[str(p) for p in rok_given[0]], **rok_given[1])
            rok.validate()
        else:
            config.validate()
            if "deep_optimizer_states" in config.strategies:  # a plan the strategy would refuse, before any worker
                from lightning_dos.planning.plan import parse_plan

                for plan in dos_plans(config):
                    parse_plan(plan_argument(plan))
    except (OSError, ValueError, TypeError, ImportError) as err:
        parser.error(str(err))
    return Invocation(config=config, dry_run=dry_run, sweep=sweep, resume=resume, rok=rok)
