"""Owns what an invocation and each of its runs are, as data, with no torch import: :class:`Settings` (the study, the
recipe, the ``--set`` overrides, the rows, the iteration windows, the study's own options) and :class:`Run` (one
worker process: a label, a strategy fragment, what it sets over the recipe and the fragment, its windows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The checkout the package runs from: its recipes, fragments and row tables, and the code workers import.
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = "recipes/gpt-2.7b.yaml"
FRAGMENTS = ROOT / "configs" / "strategy"
ROW_TABLES = ROOT / "configs" / "bench"
#: Where the strategy arguments of a fragment are, as LightningCLI keys.
STRATEGY_ARG = "trainer.strategy.init_args."


@dataclass
class Windows:
    """Which iterations of a run are warm-up, timed end to end (unsynchronised) and timed phase by phase."""

    steps: int = 10  # training iterations, warm-up included
    warmup: int = 3  # leading iterations left out of every figure
    e2e_steps: int | None = None  # after the warm-up, timed end to end (None: half the measured ones)

    @property
    def e2e_count(self) -> int:
        return (self.steps - self.warmup) // 2 if self.e2e_steps is None else self.e2e_steps

    @property
    def e2e_iterations(self) -> range:
        """Indices (from 0) of the iterations timed end to end: right after the warm-up."""
        return range(self.warmup, self.warmup + self.e2e_count)

    @property
    def phase_iterations(self) -> range:
        """Indices (from 0) of the iterations timed phase by phase: every one after the end-to-end window."""
        return range(self.warmup + self.e2e_count, self.steps)

    def window_problems(self) -> list[str]:
        """What keeps these windows from measuring anything."""
        if not (is_count(self.steps, 1) and is_count(self.warmup, 0)):
            return [f"--steps {self.steps!r} must be >= 1 and --warmup {self.warmup!r} >= 0"]
        if self.warmup >= self.steps:
            return [f"--warmup {self.warmup} leaves no measured iteration of --steps {self.steps}"]
        if self.e2e_steps is not None and (not is_count(self.e2e_steps, 0)
                                           or self.steps <= self.warmup + self.e2e_steps):
            return [f"--e2e-steps {self.e2e_steps!r} after --warmup {self.warmup} leaves no synchronised iteration of "
                    f"--steps {self.steps}: set --steps to {self.warmup + max(0, int(self.e2e_steps)) + 1} or more"]
        return []


@dataclass
class Settings(Windows):
    """One invocation: the study and what every run of it shares."""

    study: str = "compare"  # compare, sweep, rok or sizes
    recipe: str = DEFAULT_RECIPE  # the recipe every run starts from (lightning-dos fit --config RECIPE)
    set: list[str] = field(default_factory=list)  # KEY=VALUE: LightningCLI keys over the recipe and the fragment
    rows: str | None = None  # a row table (compare, rok, sizes); None: the study's own under configs/bench/
    only: list[str] = field(default_factory=list)  # the labels of the rows to run; empty: every row
    repeats: int = 1  # fresh-process runs of each configuration, round-robin
    devices: list[int] = field(default_factory=lambda: [1])  # data-parallel device counts
    timeout_s: float = 1800.0  # wall-clock limit of one worker process, start-up included
    out: str = ""  # the output directory; empty: runs/<study>/<name>_<time>
    command: str = ""  # the invocation, as typed
    options: dict[str, Any] = field(default_factory=dict)  # the study's own options, by name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {**{k: v for k, v in data.items() if k != "options"}, **data["options"]}


@dataclass
class Run(Windows):
    """One worker process: a row (or a study's own run) on some devices, repeat ``repeat``."""

    label: str = ""  # unique in a study, e.g. zero3_offload, dos(auto), dos(auto)@dp2, 32x2560/plain
    strategy: str = ""  # the strategy kind results name (deep_optimizer_states, static_split, ...)
    plan: Any = None  # a DOS plan, a split's ratio, else None
    fragment: str = ""  # configs/strategy/<fragment>.yaml
    args: dict[str, Any] = field(default_factory=dict)  # strategy arguments set over the fragment
    sets: dict[str, Any] = field(default_factory=dict)  # other LightningCLI keys, over the recipe and the fragment
    devices: int = 1
    repeat: int = 0
    skip: str | None = None  # why it is not run, if it is not
    extra: dict[str, Any] = field(default_factory=dict)  # a study's worker entries: {"sweep": ...} or {"activations"}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def slug(self) -> str:
        return slug(self.label)


def slug(text: str) -> str:
    """``text`` as a file-name-safe string."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text).strip("_")


def recipe_path(recipe: str) -> Path:
    """A recipe as given, from the current directory, else from the checkout (``recipes/gpt-2.7b.yaml`` anywhere)."""
    path = Path(recipe)
    return path.resolve() if path.is_absolute() or path.is_file() else ROOT / path


def parse_set(text: str) -> tuple[str, Any]:
    """``"model.n_layer=40"`` -> ``("model.n_layer", 40)``; ``ValueError`` without a key."""
    import yaml

    key, sep, value = str(text).partition("=")
    if not sep or not key.strip() or " " in key.strip():
        raise ValueError(f"--set {text!r}: give KEY=VALUE with a LightningCLI key, e.g. model.n_layer=40")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        return key.strip(), value


def is_count(value: Any, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
