"""Owns the ``lightning-dos bench`` command line: one verb per study, the options every study shares (a recipe,
``--set`` overrides, the iteration windows, ``--out``, ``--resume``, ``--dry-run``) and each study's own; every
problem of an invocation is reported at once, as a usage error, before any worker starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

from lightning_dos.bench.rok.study import RokSettings
from lightning_dos.bench.rows import load_rows, table_path
from lightning_dos.bench.settings import DEFAULT_RECIPE, Settings, is_count, parse_set, recipe_path
from lightning_dos.bench.sizes import LADDER, SizeSettings
from lightning_dos.bench.sweep.config import DEFAULT_BUDGETS, DEFAULT_SWEEP_PLANS, SweepSettings

VERBS = ("compare", "sweep", "rok", "sizes")
EPILOG = """studies (lightning-dos bench VERB --help for each one's options; no verb: compare):
  compare  every row of configs/bench/compare.yaml under one recipe: speed, memory, loss agreement
  sweep    every fixed DOS plan against auto, per memory budget
  rok      keep / recompute / offload the activations: time against activation memory
  sizes    growing GPT sizes under every row of configs/bench/sizes.yaml, until each strategy fails

examples:
  lightning-dos bench                                            # compare, recipes/gpt-2.7b.yaml
  lightning-dos bench compare --set model.n_layer=40 model.n_embd=3200 model.n_head=25 --only zero3_offload 'dos(auto)'
  lightning-dos bench compare --rows configs/bench/dos-plans.yaml --devices 1 2
  lightning-dos bench sweep --set model.name=gpt-1b --steps-per-plan 6 --steps 24
  lightning-dos bench rok --placements keep recompute offload-host offload-nvme --nvme-path /mnt/nvme/act
  lightning-dos bench sizes --from 32x4096 --out runs/sizes/h100 --resume

the flags before the verbs (--model, --strategies, --plans, --sweep, --activations, ...): docs/bench.md says what
each became
"""


def _common(parser: argparse.ArgumentParser, devices: str) -> None:
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, metavar="FILE",
                        help="the recipe every run starts from (default recipes/gpt-2.7b.yaml)")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="LightningCLI keys over the recipe and every row, e.g. model.n_layer=40 (a "
                        "trainer.strategy.init_args key reaches the rows whose fragment lists it)")
    parser.add_argument("--steps", type=int, default=10, help="iterations per run, warm-up included (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="leading iterations left out (default 3)")
    parser.add_argument("--e2e-steps", type=int, help="iterations after the warm-up timed end to end, unsynchronised "
                        "(default: half the measured ones); the rest phase by phase")
    parser.add_argument("--timeout", dest="timeout_s", type=float, default=1800.0, metavar="SECONDS",
                        help="limit per worker, start-up included (default 1800)")
    parser.add_argument("--out", default="", metavar="DIR", help="output directory (default runs/<study>/...)")
    parser.add_argument("--resume", action="store_true", help="with --out: reuse the runs that finished there "
                        "running exactly the same (sizes: failures too)")
    parser.add_argument("--dry-run", action="store_true", help="print each run's lightning-dos fit, run nothing")
    if devices == "list":
        parser.add_argument("--devices", type=int, nargs="+", default=[1], metavar="N",
                            help="data-parallel device counts, every row at each (default 1)")
    elif devices == "one":
        parser.add_argument("--devices", type=int, default=1, metavar="N", help="data-parallel ranks (default 1)")


def _rows(parser: argparse.ArgumentParser, study: str) -> None:
    parser.add_argument("--rows", metavar="FILE", help=f"a row table (default configs/bench/{study}.yaml)")
    parser.add_argument("--only", nargs="+", default=[], metavar="LABEL", help="the rows of these labels only")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-dos bench", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Studies over lightning-dos fit on this host: each run a recipe, a "
                                     "strategy fragment and overrides, in a worker process of its own.")
    verbs = parser.add_subparsers(dest="study", metavar="VERB")
    compare = verbs.add_parser("compare", help="strategies side by side")
    _common(compare, "list")
    _rows(compare, "compare")
    compare.add_argument("--repeats", type=int, default=1, help="fresh-process runs of each row, round-robin")
    sweep = verbs.add_parser("sweep", help="fixed DOS plans against auto")
    _common(sweep, "one")
    sweep.add_argument("--plans", nargs="+", default=list(DEFAULT_SWEEP_PLANS), metavar="PLAN",
                       help="fixed plans, in the order each round runs them (default 0.0 0.1 ... 1.0 stride:2 ... 6)")
    sweep.add_argument("--steps-per-plan", type=int, default=3, help="rounds: iterations of each fixed plan")
    sweep.add_argument("--budgets", nargs="+", default=list(DEFAULT_BUDGETS), metavar="BUDGET",
                       help="unlimited, quarter (of the optimizer state) or GiB; one process each")
    rok = verbs.add_parser("rok", help="activation placements: time against activation memory")
    _common(rok, "none")
    rok.add_argument("--placements", nargs="+", default=RokSettings().placements, metavar="PLACEMENT",
                     help="keep recompute offload-host offload-nvme (default the first three)")
    rok.add_argument("--rows", metavar="FILE", help="the row table of --row (default configs/bench/compare.yaml)")
    rok.add_argument("--row", default=RokSettings.row, metavar="LABEL", help="the row every placement runs "
                     "(default dos(auto))")
    rok.add_argument("--nvme-path", metavar="DIR", help="a local NVMe directory (offload-nvme)")
    rok.add_argument("--activation-budget-gib", dest="budget_gib", type=float, metavar="GIB",
                     help="search each placement's largest micro-batch whose peak activation memory fits")
    rok.add_argument("--activation-min-tensor-bytes", dest="min_tensor_bytes", type=int,
                     default=RokSettings.min_tensor_bytes, metavar="N")
    rok.add_argument("--activation-keep-last-layers", dest="keep_last_layers", type=int,
                     default=RokSettings.keep_last_layers, metavar="N")
    rok.add_argument("--max-micro-batch", type=int, default=RokSettings.max_micro_batch, metavar="N")
    rok.add_argument("--disk-probe-mib", type=int, default=RokSettings.disk_probe_mib, metavar="MIB")
    sizes = verbs.add_parser("sizes", help="the largest GPT each strategy trains here")
    _common(sizes, "one")
    _rows(sizes, "sizes")
    sizes.add_argument("--sizes", type=lambda text: [s for s in text.split(",") if s], metavar="LxE,...",
                       help="n_layer x n_embd, in order, e.g. 32x2560,40x3200")
    sizes.add_argument("--from", dest="start", metavar="LxE", help=f"climb the ladder from this size "
                       f"(default: all of it, {', '.join(LADDER)})")
    sizes.add_argument("--head-dim", type=int, default=128, help="n_head = n_embd / head-dim (default 128)")
    return parser


#: Each study's own settings, made of its own options (the fields of the class that are not the invocation's).
STUDIES: dict[str, Any] = {"compare": None, "sweep": SweepSettings, "rok": RokSettings, "sizes": SizeSettings}


def parse_args(argv: list[str]) -> tuple[Settings, Any, bool, bool]:
    """``(settings, the study's own settings, resume, dry run)`` of ``argv``; bad values exit with status 2."""
    parser = build_parser()
    if not argv or argv[0] not in (*VERBS, "-h", "--help"):
        argv = ["compare", *argv]  # no verb: the comparison, as before the verbs
    given = vars(parser.parse_args(argv))
    resume, dry_run = given.pop("resume"), given.pop("dry_run")
    make = STUDIES[given["study"]]
    shared = {f.name for f in dataclasses.fields(Settings)}
    options = {f.name: given.pop(f.name) for f in dataclasses.fields(make or Settings) if f.name in given
               and f.name not in shared}
    devices = given.pop("devices", [1])
    settings = Settings(**given, options=options, devices=devices if isinstance(devices, list) else [devices],
                        command=shlex.join(["lightning-dos", "bench", *argv]))
    study = make(**options) if make else None
    if isinstance(study, SweepSettings):  # auto runs the invocation's iterations and warm-up
        study.auto_steps, study.warmup = settings.steps, settings.warmup
    problems = settings.window_problems() + (study.problems() if study is not None else [])
    if resume and not settings.out:
        problems.append("--resume: set --out to the directory of the study to continue")
    if not recipe_path(settings.recipe).is_file():
        problems.append(f"--recipe {settings.recipe}: no such file")
    if not all(is_count(d, 1) for d in settings.devices) or len(set(settings.devices)) < len(settings.devices):
        problems.append(f"--devices {settings.devices}: device counts >= 1, each once")
    if not is_count(settings.repeats, 1):
        problems.append(f"--repeats {settings.repeats}: give 1 or more")
    problems += _attempt(lambda: [parse_set(text) for text in settings.set])
    if settings.study in ("compare", "sizes"):
        problems += _attempt(lambda: load_rows(table_path(settings.study, settings.rows), settings.only))
    elif settings.study == "rok":
        problems += _attempt(lambda: load_rows(table_path("compare", settings.rows), [study.row]))
    if problems:
        parser.error("; ".join(problems))
    return settings, study, resume, dry_run


def _attempt(check: Any) -> list[str]:
    """The message of the ``ValueError`` (or missing file) ``check()`` raises, as a list; empty when none."""
    try:
        check()
    except (ValueError, OSError) as err:
        return [str(err)]
    return []
