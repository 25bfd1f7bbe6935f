"""The converging check (docs/converging.md): one recipe under DOS, under vanilla ZeRO-3 offload, then vanilla again.

The second vanilla run is the control: bf16 training on a GPU is not bit-reproducible (atomics in the backward
kernels), so two vanilla runs with the same seed and data already differ. DOS converges like vanilla when its
distance from vanilla stays of the order of that control's.

    python scripts/converging.py --recipe recipes/gpt2-124m.yaml --out runs/converging
    python scripts/converging.py --out runs/converging --analyse-only      # redraw from the runs already there

Writes ``converging.png`` (the three loss curves, and |delta loss| of DOS vs vanilla beside vanilla vs vanilla) and
``converging.json`` (the figures) into ``--out``, and prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: run label -> extra configs composed after the recipe
RUNS: dict[str, tuple[str, ...]] = {
    "dos-auto": (),
    "vanilla": ("configs/strategy/zero3_offload.yaml",),
    "vanilla-control": ("configs/strategy/zero3_offload.yaml",),
}
#: windows of steps over which the distances are summarised, to show how they evolve
WINDOWS = 4
#: the longest one fit may take (a hung fit fails the comparison instead of blocking it for ever)
FIT_TIMEOUT_S = 3 * 3600


def run(recipe: Path, out: Path, extra: Sequence[str]) -> dict[str, float]:
    """Fit the recipe once per entry of :data:`RUNS`, one after the other; returns the wall time of each."""
    seconds = {}
    for label, configs in RUNS.items():
        command = [sys.executable, "-m", "lightning_dos", "fit", "--config", str(recipe)]
        for config in configs:
            command += ["--config", str(ROOT / config)]
        command += ["--trainer.logger.init_args.save_dir", str(out), "--trainer.logger.init_args.name", label,
                    "--trainer.log_every_n_steps", "1", *extra]
        print(f"converging: {label}: {' '.join(command[2:])}", flush=True)
        start = time.perf_counter()
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, timeout=FIT_TIMEOUT_S)
        seconds[label] = time.perf_counter() - start
    return seconds


def read_run(out: Path, label: str) -> dict[str, dict[int, float]]:
    """``train/loss`` and ``val/loss`` by step from the newest version of the run ``label``."""
    versions = sorted((out / label).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise FileNotFoundError(f"no run {label!r} under {out}; run this script without --analyse-only first")
    with open(versions[-1] / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    series: dict[str, dict[int, float]] = {"train/loss": {}, "val/loss": {}}
    for row in rows:
        for key, values in series.items():
            if row.get(key):
                values[int(row["step"])] = float(row[key])
    return series


def distances(a: dict[int, float], b: dict[int, float]) -> dict[str, object]:
    """max and mean |a - b| over the steps both logged, overall and per window of steps."""
    steps = sorted(set(a) & set(b))
    if not steps:
        raise ValueError("the two runs share no logged step")
    deltas = [abs(a[s] - b[s]) for s in steps]
    size = max(1, -(-len(steps) // WINDOWS))
    windows = []
    for start in range(0, len(steps), size):
        part = deltas[start:start + size]
        windows.append({"steps": [steps[start], steps[start + len(part) - 1]], "max": max(part),
                        "mean": statistics.fmean(part)})
    return {"steps": len(steps), "max": max(deltas), "mean": statistics.fmean(deltas), "windows": windows,
            "per_step": dict(zip(steps, deltas))}


def analyse(out: Path) -> dict[str, object]:
    runs = {label: read_run(out, label) for label in RUNS}
    result: dict[str, object] = {"final": {label: {key: values[max(values)] for key, values in run.items() if values}
                                           for label, run in runs.items()}}
    for key in ("train/loss", "val/loss"):
        control = runs["vanilla-control"][key]
        on_control = {step: v for step, v in runs["dos-auto"][key].items() if step in control}
        result[key] = {
            "dos_vs_vanilla": distances(runs["dos-auto"][key], runs["vanilla"][key]),
            "vanilla_vs_vanilla": distances(control, runs["vanilla"][key]),
            # over the control's steps only: the like-for-like comparison when the control run is shorter
            "dos_vs_vanilla_on_control_steps": distances(on_control, runs["vanilla"][key]),
        }
    _plot(runs, result, out / "converging.png")
    summary = {k: v for k, v in result.items()}
    for key in ("train/loss", "val/loss"):
        for pair in summary[key].values():
            pair.pop("per_step")
    (out / "converging.json").write_text(json.dumps(summary, indent=2))
    return summary


def _plot(runs: dict[str, dict[str, dict[int, float]]], result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, deltas) = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = {"dos-auto": "-", "vanilla": "--", "vanilla-control": ":"}
    for label, run in runs.items():
        steps = sorted(run["train/loss"])
        losses.plot(steps, [run["train/loss"][s] for s in steps], styles[label], label=f"{label} train", lw=1)
        if run["val/loss"]:
            v = sorted(run["val/loss"])
            losses.plot(v, [run["val/loss"][s] for s in v], styles[label], marker="o", label=f"{label} val", lw=1)
    losses.set(xlabel="step", ylabel="loss", title="loss curves")
    losses.legend(fontsize=7)
    for pair, name in (("dos_vs_vanilla", "|DOS - vanilla|"), ("vanilla_vs_vanilla", "|vanilla - vanilla| (control)")):
        per_step = result["train/loss"][pair]["per_step"]
        steps = sorted(per_step)
        deltas.plot(steps, [per_step[s] for s in steps], lw=0.8, label=name)
    deltas.set(xlabel="step", ylabel="|delta train loss|", title="distance between runs, per step")
    deltas.set_yscale("symlog", linthresh=1e-6)  # zero (bit-identical runs) stays drawable
    deltas.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(summary: dict[str, object]) -> str:
    lines = ["| loss | pair | steps | max abs delta | mean abs delta | mean abs delta per window |",
             "| --- | --- | --- | --- | --- | --- |"]
    for key in ("train/loss", "val/loss"):
        for pair, name in (("dos_vs_vanilla", "DOS vs vanilla"), ("vanilla_vs_vanilla", "vanilla vs vanilla"),
                           ("dos_vs_vanilla_on_control_steps", "DOS vs vanilla, the control's steps")):
            d = summary[key][pair]
            windows = ", ".join(f"{w['steps'][0]}-{w['steps'][1]}: {w['mean']:.2e}" for w in d["windows"])
            lines.append(f"| {key} | {name} | {d['steps']} | {d['max']:.2e} | {d['mean']:.2e} | {windows} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "gpt2-124m.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/converging"))
    parser.add_argument("--analyse-only", action="store_true", help="only read the runs in --out and draw")
    args, extra = parser.parse_known_args(argv)
    out = args.out.resolve()
    if not args.analyse_only:
        if not args.recipe.is_file():
            parser.error(f"--recipe: {args.recipe} does not exist; pass a recipe YAML such as recipes/gpt2-124m.yaml")
        seconds = run(args.recipe.resolve(), out, extra)
        print("converging: wall time " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    summary = analyse(out)
    print(table(summary))
    print("final losses: " + json.dumps(summary["final"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
