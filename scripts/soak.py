"""The soak (docs/reliability.md): a long run of a small GPT with the plan changing at every step, against vanilla.

Three processes, one after the other, train the same model on the same batches: DOS with a new random plan before
every backward (random lanes, buffering depth and host order; seeded), the same with ``overlap=True`` (the update
phase beside the next forward), and vanilla ZeRO-3 offload. Every step each records its loss, its host RSS, its GPU
memory (allocated and reserved), its threads (Python's, less the launcher's own, and the process's) and, on a GPU,
the page-locked host memory the caching host allocator holds. The analysis fits a line to each series past the
warm-up and reports its slope per 1,000 steps: a leak shows as a slope that does not vanish.

    python scripts/soak.py --steps 2000 --out runs/soak                 # on a GPU host
    python scripts/soak.py --out runs/soak --analyse-only               # redraw from the runs already there

Writes ``soak.json`` (the figures) and ``soak.png`` (the series of both runs) into ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("dos-random-plan", "dos-random-plan-overlap", "vanilla")
#: the control every DOS run's losses are compared with
CONTROL = "vanilla"
#: the per-step series each run records (besides the loss)
SERIES = ("rss_gib", "gpu_allocated_gib", "gpu_reserved_gib", "pinned_host_gib", "python_threads", "os_threads")
#: steps at the start left out of the slopes (allocator and calibration warm-up)
DEFAULT_WARMUP = 50


#: Lightning's launcher starts this thread with every fit; without child processes it ends by itself about 5 s later,
#: which may fall inside the run: it is not the run's, and is left out of ``python_threads``.
LAUNCHER_THREAD = "child-process-observer"


def _python_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name != LAUNCHER_THREAD)


def _os_threads() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def _rss_gib() -> float:
    with open("/proc/self/status", encoding="utf-8") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024**2


def _pinned_host_gib() -> float | None:
    import torch

    if not torch.cuda.is_available() or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    stats = torch.cuda.host_memory_stats()
    held = stats.get("reserved_bytes.current", stats.get("allocated_bytes.current"))
    return None if held is None else held / 1024**3


def train_one(label: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.steps`` steps under ``label``'s strategy in this process; every step's samples."""
    import lightning.pytorch as pl
    import torch

    import lightning_dos  # noqa: F401  (registers the strategies)
    from lightning_dos import DeepOptimizerStatesStrategy, ZeRO3OffloadStrategy
    from lightning_dos.data.synthetic import SyntheticDataModule
    from lightning_dos.models.module import GPTModule
    from lightning_dos.planning.plan import random_plan

    class RandomPlan(pl.Callback):
        """A new random plan before every backward (set at batch start), from a seeded generator."""

        def __init__(self, seed: int) -> None:
            self.rng = random.Random(seed)
            self.lanes: list[str] = []

        def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
            manager = trainer.strategy.manager
            plan = random_plan(self.rng, len(manager.sizes), source="soak")
            manager.set_plan(plan)
            self.lanes.append(plan.lane_letters())

    class Sampler(pl.Callback):
        def __init__(self) -> None:
            self.samples: dict[str, list[Any]] = {key: [] for key in ("loss", *SERIES)}

        def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, *_: Any) -> None:
            cuda = trainer.strategy.root_device.type == "cuda"
            sample = {
                "loss": float(outputs["loss"]),
                "rss_gib": _rss_gib(),
                "gpu_allocated_gib": torch.cuda.memory_allocated() / 1024**3 if cuda else None,
                "gpu_reserved_gib": torch.cuda.memory_reserved() / 1024**3 if cuda else None,
                "pinned_host_gib": _pinned_host_gib() if cuda else None,
                "python_threads": _python_threads(),
                "os_threads": _os_threads(),
            }
            for key, value in sample.items():
                self.samples[key].append(value)

    pl.seed_everything(args.seed, verbose=False)
    if label == "vanilla":
        strategy: Any = ZeRO3OffloadStrategy(sub_group_size=args.sub_group_size)
        callbacks: list[pl.Callback] = []
    else:
        strategy = DeepOptimizerStatesStrategy(plan="host", sub_group_size=args.sub_group_size,
                                               overlap=label.endswith("-overlap"))
        callbacks = [RandomPlan(args.seed)]
    sampler = Sampler()
    module = GPTModule(args.model, vocab_size=args.vocab_size, block_size=args.seq_len, learning_rate=args.lr,
                       warmup_steps=10, max_steps=args.steps)
    data = SyntheticDataModule(vocab_size=args.vocab_size, seq_len=args.seq_len, batch_size=args.micro_batch,
                               num_batches=args.steps, seed=args.seed)
    trainer = pl.Trainer(accelerator=args.accelerator, devices=1, strategy=strategy, precision=args.precision,
                         max_steps=args.steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, gradient_clip_val=1.0,
                         enable_progress_bar=sys.stderr.isatty(), callbacks=[*callbacks, sampler])
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    plans = callbacks[0].lanes if callbacks else []
    return {"label": label, "steps": len(sampler.samples["loss"]), "wall_s": time.perf_counter() - started,
            "device": str(trainer.strategy.root_device), "distinct_plans": len(set(plans)),
            "plan_changes": sum(a != b for a, b in zip(plans, plans[1:])), **sampler.samples}


def slope_per_1000(values: Sequence[float | None], warmup: int) -> float | None:
    """Least-squares slope of ``values`` against the step, past ``warmup``, per 1,000 steps (None: too few)."""
    points = [(step, value) for step, value in enumerate(values) if step >= warmup and value is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx * 1000 if sxx else None


def analyse(runs: dict[str, dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Slopes of every series per run, and how far DOS's losses are from vanilla's."""
    out: dict[str, Any] = {"warmup": warmup, "runs": {}}
    for label, run in runs.items():
        entry = {"steps": run["steps"], "wall_s": run["wall_s"], "device": run["device"]}
        for key in SERIES:
            values = run[key]
            present = [v for v in values[warmup:] if v is not None]
            entry[key] = {
                "slope_per_1000_steps": slope_per_1000(values, warmup),
                "first": present[0] if present else None,
                "last": present[-1] if present else None,
                "max": max(present) if present else None,
            }
        if label != CONTROL:
            entry["distinct_plans"] = run["distinct_plans"]
            entry["plan_changes"] = run["plan_changes"]
        out["runs"][label] = entry
    vanilla = runs[CONTROL]["loss"]
    out["loss"] = {}
    for label in runs:
        if label == CONTROL:
            continue
        dos = runs[label]["loss"]
        diffs = [abs(a - b) for a, b in zip(dos, vanilla)]
        out["loss"][label] = {
            "steps_compared": len(diffs),
            "mean_abs_diff": sum(diffs) / len(diffs) if diffs else None,
            "max_abs_diff": max(diffs) if diffs else None,
            "max_rel_diff": max((d / abs(b) for d, b in zip(diffs, vanilla) if b), default=None),
            "final": {"dos": dos[-1] if dos else None, "vanilla": vanilla[-1] if vanilla else None},
        }
    return out


def _plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("loss", "loss"), ("rss_gib", "host RSS (GiB)"), ("gpu_reserved_gib", "GPU reserved (GiB)"),
              ("os_threads", "threads (process)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels)), sharex=True)
    for ax, (key, title) in zip(axes, panels):
        for label, run in runs.items():
            values = run[key]
            steps = [s for s, v in enumerate(values) if v is not None]
            if steps:
                ax.plot(steps, [values[s] for s in steps], label=label, linewidth=1)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[-1].set_xlabel("step")
    fig.suptitle("soak: DOS with a random plan every step (overlap off and on), and vanilla ZeRO-3 offload")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(summary: dict[str, Any]) -> str:
    rows = ["| run | steps | host RSS / 1k steps | GPU reserved / 1k steps | pinned host / 1k steps | "
            "threads first -> last |", "| --- | --- | --- | --- | --- | --- |"]

    def fmt(value: float | None, unit: str = " GiB") -> str:
        return "n/a" if value is None else f"{value:+.4f}{unit}"

    for label, run in summary["runs"].items():
        threads = run["os_threads"]
        rows.append(f"| {label} | {run['steps']} | {fmt(run['rss_gib']['slope_per_1000_steps'])} | "
                    f"{fmt(run['gpu_reserved_gib']['slope_per_1000_steps'])} | "
                    f"{fmt(run['pinned_host_gib']['slope_per_1000_steps'])} | "
                    f"{threads['first']} -> {threads['last']} |")
    rows.append("")
    for label, loss in summary["loss"].items():
        rows.append(f"loss, {label} vs {CONTROL} over {loss['steps_compared']} steps: "
                    f"mean |delta| {loss['mean_abs_diff']:.3g}, max |delta| {loss['max_abs_diff']:.3g} "
                    f"(max relative {loss['max_rel_diff']:.3g})")
    return "\n".join(rows)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--model", default="gpt-10m", help="model preset (lightning_dos.models.gpt.PRESETS)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--sub-group-size", type=int, default=1_000_000)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="steps left out of the slopes")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--analyse-only", action="store_true")
    parser.add_argument("--only", choices=RUNS, help=argparse.SUPPRESS)  # one run, in this process
    args = parser.parse_args(argv)
    if args.steps < 2 or args.warmup < 0 or args.warmup >= args.steps:
        parser.error(f"--steps {args.steps} and --warmup {args.warmup}: need steps >= 2 and 0 <= warmup < steps")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:  # a child: one run, its samples to <out>/<label>.json
        result = train_one(args.only, args)
        (args.out / f"{args.only}.json").write_text(json.dumps(result), encoding="utf-8")
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown: a library's lingering thread must not hang a finished run
    if not args.analyse_only:
        for label in RUNS:
            command = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:]),
                       "--only", label]
            print(f"soak: {label}: {args.steps} steps", flush=True)
            subprocess.run(command, check=True, stdin=subprocess.DEVNULL, cwd=str(ROOT))
    runs = {}
    for label in RUNS:
        path = args.out / f"{label}.json"
        if not path.is_file():
            raise SystemExit(f"soak: no {path}; run without --analyse-only first")
        runs[label] = json.loads(path.read_text(encoding="utf-8"))
    summary = analyse(runs, min(args.warmup, min(run["steps"] for run in runs.values()) - 2))
    (args.out / "soak.json").write_text(json.dumps(summary, indent=2, default=_finite), encoding="utf-8")
    _plot(runs, args.out / "soak.png")
    print(table(summary))
    return 0


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


if __name__ == "__main__":
    raise SystemExit(main())
