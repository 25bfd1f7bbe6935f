"""Owns a study's rows as data: a YAML table of label -> a strategy fragment of ``configs/strategy/`` and what the row
sets over it (LightningCLI keys), as torchtitan's ``OverrideDefinitions`` tables; the default tables are under
``configs/bench/``. :func:`make_run` turns a row into a worker's :class:`~lightning_dos.bench.settings.Run`.

A row: ``fragment`` (required unless ``cannot_run``), ``strategy`` (the kind results name, default the fragment's
name), ``set`` ({KEY: value}), ``single_device`` (trains on one device: not run above one), ``cannot_run`` (why the
row is never run: it stays in the report with that reason). No torch import here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_dos.bench.settings import FRAGMENTS, ROW_TABLES, STRATEGY_ARG, Run

KEYS = ("fragment", "strategy", "set", "single_device", "cannot_run")


@dataclass(frozen=True)
class Row:
    label: str
    fragment: str = ""
    strategy: str = ""
    sets: dict[str, Any] = field(default_factory=dict)
    single_device: bool = False
    cannot_run: str | None = None


@functools.cache
def load_yaml(path: str) -> dict[str, Any]:
    """A YAML mapping (a recipe, a fragment, a row table); ``ValueError`` for anything else."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    return data


def fragment_path(name: str) -> Path:
    """``configs/strategy/<name>.yaml``; ``FileNotFoundError`` naming where it looked."""
    path = FRAGMENTS / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"strategy fragment {path} not found: the bench runs the fragments of the checkout it "
                                "is installed from (pip install -e .)")
    return path


def fragment_args(name: str) -> dict[str, Any]:
    """The strategy arguments a fragment lists (``trainer.strategy.init_args``)."""
    strategy = load_yaml(str(fragment_path(name))).get("trainer", {}).get("strategy") or {}
    return dict(strategy.get("init_args") or {}) if isinstance(strategy, dict) else {}


def table_path(study: str, rows: str | None) -> Path:
    """The row table of a study: ``rows`` as given, else ``configs/bench/<study>.yaml``."""
    return Path(rows) if rows else ROW_TABLES / f"{study}.yaml"


def load_rows(path: Path, only: list[str] | None = None) -> list[Row]:
    """The rows of a table, in its order (``only``: those labels, in the table's order); ``ValueError`` listing every
    problem."""
    problems, rows = [], []
    for label, entry in load_yaml(str(path)).items():
        entry = entry or {}
        unknown = sorted(set(entry) - set(KEYS)) if isinstance(entry, dict) else ["(not a mapping)"]
        if unknown:
            problems.append(f"{label}: unknown keys {unknown}; a row has {', '.join(KEYS)}")
            continue
        fragment = str(entry.get("fragment") or "")
        if not entry.get("cannot_run") and not (FRAGMENTS / f"{fragment}.yaml").is_file():
            problems.append(f"{label}: fragment {fragment!r} is not in {FRAGMENTS}")
        rows.append(Row(str(label), fragment, str(entry.get("strategy") or fragment or label),
                        dict(entry.get("set") or {}), bool(entry.get("single_device")), entry.get("cannot_run")))
    missing = sorted(set(only or ()) - {row.label for row in rows})
    if missing:
        problems.append(f"--only {missing}: not in {path}; its rows: {', '.join(row.label for row in rows)}")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return [row for row in rows if not only or row.label in only]


def make_run(row: Row, overrides: list[tuple[str, Any]], label: str | None = None, devices: int = 1,
             sets: dict[str, Any] | None = None, **windows: Any) -> Run:
    """``row`` as a worker's run: the invocation's ``--set`` pairs, then the row's own, then ``sets`` (a study's, e.g.
    a model size). A ``--set`` of a strategy argument reaches only the fragments that list it (``plain`` has no
    ``sub_group_size``); the row's own always do."""
    listed = fragment_args(row.fragment) if row.fragment else {}
    args: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for key, value in overrides:
        if key.startswith(STRATEGY_ARG):
            if key.removeprefix(STRATEGY_ARG) in listed:
                args[key.removeprefix(STRATEGY_ARG)] = value
        else:
            other[key] = value
    for key, value in {**row.sets, **(sets or {})}.items():
        (args if key.startswith(STRATEGY_ARG) else other)[key.removeprefix(STRATEGY_ARG)] = value
    resolved = {**listed, **args}
    plan = resolved.get("plan", resolved.get("ratio"))
    skip = row.cannot_run or (f"single-GPU only: {row.label} trains on one device; not run at {devices} devices"
                              if row.single_device and devices > 1 else None)
    return Run(label=label or row.label, strategy=row.strategy, plan=plan, fragment=row.fragment, args=args,
               sets=other, devices=devices, skip=skip, **windows)
