"""Owns ``lightning-dos compare``: runs of different strategies drawn side by side from their local logs.

For people without a W&B account (or offline): each RUN_DIR is a CSV logger version dir (``metrics.csv`` and
``hparams.yaml``), an offline W&B run dir (``wandb/offline-run-*`` holding ``run-*.wandb``), or a dir holding
several of either (``runs/``). One PNG (``--out``) with train/val loss and ``perf/tokens_per_s`` against the
step, a panel per ``--metric``, and peak GPU and host memory per run as bars; a summary table on stdout
(median iteration time and tokens/s, peak memory, last losses). Runs are labelled by their run name
(``<recipe>-<strategy>[-<plan>]``, from the run config that :mod:`lightning_dos.telemetry.run_info` logs), else by their
directory name.

Offline W&B runs are read from their transaction log (``run-*.wandb``): the installed wandb (0.31) has no
Python reader for it any more (its internal ``DataStore`` went with the move to the Go core), so
:func:`wandb_records` reads the LevelDB-style log format wandb writes and parses each record with wandb's own
protobuf ``Record``. Checksums are not verified (CRC-32C is not in the standard library); a record cut off by
a crash ends the read.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

__all__ = [
    "CompareError",
    "Run",
    "draw",
    "find_run_dirs",
    "load_runs",
    "main",
    "read_csv_run",
    "read_run",
    "read_wandb_run",
    "summary_table",
    "wandb_records",
]

#: The step panels drawn by default: (title, keys drawn in it).
DEFAULT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("train/loss", "val/loss")),
    ("perf/tokens_per_s", ("perf/tokens_per_s",)),
)
#: Per-run bars: the peak of each over the run.
BAR_METRICS = ("perf/peak_gpu_gib", "perf/peak_host_gib")
#: What a run must have logged at least one of to be compared.
EXPECTED_KEYS = ("train/loss", "val/loss", "perf/iteration_ms", "perf/tokens_per_s", "perf/peak_host_gib")
RUN_DIR_HINT = ("expected a CSV logger version dir (metrics.csv), an offline W&B run dir (holding run-*.wandb) "
                "or a dir holding such dirs (e.g. runs/)")

# the W&B transaction log: LevelDB's log format behind a 7-byte file header
_WANDB_IDENT = b":W&B"
_WANDB_MAGIC = 0xBEE1
_BLOCK = 32768
_HEADER = struct.Struct("<IHB")  # checksum, length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class CompareError(ValueError):
    """A RUN_DIR or a metric that cannot be compared; the message names it and what would work."""


@dataclass
class Run:
    """One run's logs: its label, run config, and every numeric metric as ``(step, value)`` points."""

    path: Path
    source: str
    """``"csv"`` or ``"wandb"``."""
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    wandb: dict[str, Any] = field(default_factory=dict)
    """For W&B runs: ``name``, ``group``, ``job_type``, ``tags``, ``project``, ``id`` of the run."""

    def values(self, key: str) -> list[float]:
        return [value for _, value in self.history.get(key, ())]

    def last(self, key: str) -> Optional[float]:
        points = self.history.get(key)
        return points[-1][1] if points else None

    def median(self, key: str) -> Optional[float]:
        values = self.values(key)
        return statistics.median(values) if values else None

    def peak(self, key: str) -> Optional[float]:
        values = self.values(key)
        return max(values) if values else None


# ---------------------------------------------------------------------------------------------- finding runs
def _is_csv_run(path: Path) -> bool:
    return (path / "metrics.csv").is_file()


def _wandb_log(path: Path) -> Optional[Path]:
    logs = sorted(path.glob("run-*.wandb"))
    return logs[0] if logs else None


def find_run_dirs(path: Path) -> list[Path]:
    """The run dirs at or under ``path`` (a run dir itself, a ``.wandb`` file, or a dir holding run dirs)."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"RUN_DIR {str(path)!r} does not exist; {RUN_DIR_HINT}")
    if path.is_file():
        if path.suffix == ".wandb":
            return [path.parent]
        raise CompareError(f"RUN_DIR {str(path)!r} is a file; {RUN_DIR_HINT}")
    if _is_csv_run(path) or _wandb_log(path) is not None:
        return [path]
    found: dict[Path, Path] = {}
    for marker in sorted([*path.rglob("metrics.csv"), *path.rglob("run-*.wandb")]):
        found.setdefault(marker.parent.resolve(), marker.parent)  # wandb's latest-run link repeats a run
    if not found:
        raise CompareError(f"RUN_DIR {str(path)!r}: no run found; {RUN_DIR_HINT}")
    return sorted(found.values())


# ---------------------------------------------------------------------------------------------- CSV runs
class _HparamsLoader(yaml.SafeLoader):
    """Reads Lightning's hparams.yaml: tuples (``!!python/tuple``) as lists, other Python tags as None."""


_HparamsLoader.add_constructor("tag:yaml.org,2002:python/tuple", lambda loader, node: loader.construct_sequence(node))
_HparamsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value


def read_csv_run(path: Path) -> Run:
    """A CSV logger version dir: ``metrics.csv`` (``step`` column and one column per key) and ``hparams.yaml``."""
    path = Path(path)
    history: dict[str, list[tuple[int, float]]] = {}
    with open(path / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            step = _number(row.get("step", ""))
            if step is None:
                continue
            for key, text in row.items():
                if key in ("step", "epoch") or key is None:
                    continue
                value = _number(text)
                if value is not None:
                    history.setdefault(key, []).append((int(step), value))
    config: dict[str, Any] = {}
    hparams = path / "hparams.yaml"
    if hparams.is_file():
        config = yaml.load(hparams.read_text(), Loader=_HparamsLoader) or {}
    return Run(path=path, source="csv", label=_label(config, {}, path), config=config, history=history)


# ---------------------------------------------------------------------------------------------- W&B runs
def _chunks(data: bytes, path: Path) -> Iterator[bytes]:
    if len(data) < 7 or data[:4] != _WANDB_IDENT:
        raise CompareError(f"{path}: not a W&B transaction log (no ':W&B' header); {RUN_DIR_HINT}")
    magic, version = struct.unpack("<HB", data[4:7])
    if magic != _WANDB_MAGIC or version != 0:
        raise CompareError(f"{path}: W&B log format {magic:#x}/{version} is not the one this reader knows (0xbee1/0)")
    position, pending = 7, b""
    while position + _HEADER.size <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER.size:
            position += left  # a block's tail too short for a header is padding
            continue
        _, length, kind = _HEADER.unpack_from(data, position)
        position += _HEADER.size
        if kind == 0 and length == 0:
            position += left - _HEADER.size  # zero-filled rest of a block
            continue
        if position + length > len(data):
            return  # cut off mid-record: the run died while writing
        chunk = data[position:position + length]
        position += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def wandb_records(path: Path) -> Iterator[Any]:
    """The records (``wandb.proto.wandb_internal_pb2.Record``) of a W&B transaction log ``run-*.wandb``."""
    from wandb.proto import wandb_internal_pb2

    path = Path(path)
    for chunk in _chunks(path.read_bytes(), path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        yield record


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _set_nested(config: dict[str, Any], item: Any) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    target = config
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = json.loads(item.value_json)


def _remove_nested(config: dict[str, Any], item: Any) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    target = config
    for key in keys[:-1]:
        target = target.get(key, {})
    target.pop(keys[-1], None)


def _apply_config(config: dict[str, Any], record: Any) -> None:
    for item in record.update:
        _set_nested(config, item)
    for item in record.remove:
        _remove_nested(config, item)


def read_wandb_run(path: Path) -> Run:
    """An offline W&B run dir (or its ``run-*.wandb`` file): run identity, run config and history."""
    path = Path(path)
    log = path if path.is_file() else _wandb_log(path)
    if log is None:
        raise CompareError(f"{path}: no run-*.wandb file; {RUN_DIR_HINT}")
    config: dict[str, Any] = {}
    history: dict[str, list[tuple[int, float]]] = {}
    meta: dict[str, Any] = {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            meta = {"name": run.display_name, "group": run.run_group, "job_type": run.job_type,
                    "tags": list(run.tags), "project": run.project, "id": run.run_id}
            _apply_config(config, run.config)  # each run record carries the whole config so far
        elif kind == "config":
            _apply_config(config, record.config)
        elif kind == "history":
            # a multi-part key is a field of a logged object (a table's size, an image's path), not a metric
            row = {_item_key(item): json.loads(item.value_json) for item in record.history.item
                   if item.key or len(item.nested_key) == 1}
            step = row.get("trainer/global_step", row.get("_step", record.history.step.num))
            for key, value in row.items():
                if key.startswith("_") or key in ("trainer/global_step", "epoch"):
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    history.setdefault(key, []).append((int(step), float(value)))
    config.pop("_wandb", None)
    run_dir = log.parent
    return Run(path=run_dir, source="wandb", label=_label(config, meta, run_dir), config=config, history=history,
               wandb=meta)


# ---------------------------------------------------------------------------------------------- loading
def _label(config: dict[str, Any], meta: dict[str, Any], path: Path) -> str:
    run = config.get("run")
    if isinstance(run, dict) and run.get("name"):
        return str(run["name"])
    return str(meta.get("name") or path.name)


def read_run(path: Path) -> Run:
    """One run dir, CSV or offline W&B."""
    path = Path(path)
    if path.is_dir() and _is_csv_run(path):
        return read_csv_run(path)
    return read_wandb_run(path)


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run at or under ``paths``, labels made unique (a repeated label gets its directory name)."""
    runs = [read_run(run_dir) for path in paths for run_dir in find_run_dirs(Path(path))]
    for run in runs:
        if not any(key in run.history for key in EXPECTED_KEYS):
            logged = ", ".join(sorted(run.history)[:12]) or "nothing"
            raise CompareError(f"{run.path}: logged none of {', '.join(EXPECTED_KEYS)} (it logged: {logged}); "
                               "compare runs of lightning-dos fit (its callbacks log perf/*)")
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({run.path.name})"
    return runs


# ---------------------------------------------------------------------------------------------- summary
def _cell(value: Optional[float], digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


SUMMARY_COLUMNS = ("run", "source", "steps", "median iter ms", "median tokens/s", "peak GPU GiB", "peak host GiB",
                   "last train/loss", "last val/loss")


def summary_table(runs: Sequence[Run]) -> str:
    """One row per run: median iteration ms and tokens/s, peak GPU and host GiB, last train and val loss."""
    rows = [SUMMARY_COLUMNS]
    for run in runs:
        # the last training step logged: with overlap the last update phase's dos/* come a step after it
        points = run.history.get("train/loss") or [point for points in run.history.values() for point in points]
        steps = max((step for step, _ in points), default=None)
        rows.append((run.label, run.source, "n/a" if steps is None else str(steps),
                     _cell(run.median("perf/iteration_ms"), 1), _cell(run.median("perf/tokens_per_s"), 0),
                     _cell(run.peak("perf/peak_gpu_gib")), _cell(run.peak("perf/peak_host_gib")),
                     _cell(run.last("train/loss"), 3), _cell(run.last("val/loss"), 3)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(SUMMARY_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- chart
def _check_metrics(runs: Sequence[Run], metrics: Sequence[str]) -> list[str]:
    """Notes for runs without a requested metric; an error when no run has it."""
    notes = []
    for key in metrics:
        missing = [run.label for run in runs if key not in run.history]
        if len(missing) == len(runs):
            logged = sorted({k for run in runs for k in run.history})
            raise CompareError(f"--metric {key}: no run logged it; the runs logged: {', '.join(logged)}")
        notes += [f"note: {label} has no {key} (its panel shows the other runs)" for label in missing]
    return notes


def draw(runs: Sequence[Run], out: Path, metrics: Sequence[str] = ()) -> Path:
    """Draw the comparison of ``runs`` to ``out`` (PNG): the default step panels, one per ``metrics`` key, and the
    peak-memory bars. Returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [*DEFAULT_PANELS, *((key, (key,)) for key in metrics)]
    line_rows = math.ceil(len(panels) / 2)
    # the step panels two by two, then the memory bars side by side on the last row
    fig, axes = plt.subplots(line_rows + 1, 2, figsize=(13.0, 4.2 * (line_rows + 1)), squeeze=False)
    line_axes = list(axes[:line_rows].flat)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {run.label: colours[i % len(colours)] for i, run in enumerate(runs)}
    styles = {0: dict(linestyle="-"), 1: dict(linestyle="--", marker="o", markersize=4)}

    for ax, (title, keys) in zip(line_axes, panels):
        drawn = False
        for run in runs:
            for i, key in enumerate(keys):
                points = run.history.get(key)
                if not points:
                    continue
                label = run.label if len(keys) == 1 else f"{run.label} {key.split('/')[0]}"
                ax.plot([s for s, _ in points], [v for _, v in points], color=colour[run.label],
                        label=label, **styles[min(i, 1)])
                drawn = True
        ax.set_title(title if len(keys) == 1 else f"{title}: {' (solid), '.join(keys)} (dashed)")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small", framealpha=0.8)
        else:
            ax.text(0.5, 0.5, f"no run logged {' or '.join(keys)}", ha="center", va="center", transform=ax.transAxes)
    for ax in line_axes[len(panels):]:
        ax.set_visible(False)

    positions = list(range(len(runs)))
    for ax, key in zip(axes[line_rows], BAR_METRICS):
        peaks = [run.peak(key) for run in runs]
        ax.bar(positions, [p or 0.0 for p in peaks], color=[colour[run.label] for run in runs], width=0.6)
        for x, peak in zip(positions, peaks):
            ax.text(x, peak or 0.0, "n/a" if peak is None else f"{peak:.2f}", ha="center", va="bottom",
                    fontsize="small")
        ax.set_xticks(positions, [run.label for run in runs], rotation=20, ha="right", fontsize="small")
        what = "GPU" if "gpu" in key else "host"
        ax.set_title(f"peak {what} memory ({key}; n/a: not logged{', e.g. on CPU' if what == 'GPU' else ''})")
        ax.set_ylabel("GiB")
        ax.set_ylim(bottom=0.0, top=max([p for p in peaks if p is not None] + [0.0]) * 1.15 or 1.0)
        ax.grid(axis="y", alpha=0.3)

    fig.suptitle(f"lightning-dos compare: {len(runs)} runs")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-dos compare",
        description="Draw runs of different strategies side by side from CSV logs or offline W&B runs: loss, "
                    "tokens/s and peak memory in one PNG, and a summary table.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="a CSV logger version dir, an offline W&B run dir (wandb/offline-run-*), or a dir "
                             "holding several (e.g. runs/)")
    parser.add_argument("--out", type=Path, default=Path("comparison.png"), help="the PNG to write "
                        "(default comparison.png)")
    parser.add_argument("--metric", action="append", default=[], metavar="KEY",
                        help="another logged key to draw against the step, e.g. perf/iteration_ms or dos/update_ms "
                             "(repeatable)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``lightning-dos compare RUN_DIR... [--out comparison.png] [--metric KEY]``; returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        runs = load_runs(args.run_dirs)
        notes = _check_metrics(runs, args.metric)
        out = draw(runs, args.out, args.metric)
    except CompareError as error:
        print(f"lightning-dos compare: error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    print(summary_table(runs))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
