"""Runs shared by the system tier's modules: each is deterministic and only read after, so the tests that compare
with it read one run instead of making their own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ranks import run_two_ranks
from tests.support.recipe_run import debug_with_checkpoints, fit_here, metrics, series


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, list[dict]]]:
    """``two_ranks(plan, **env)``: its folder and ranks' records, run once per configuration in the session (vanilla
    is the control of several tests; plan 0.5 also feeds the universal checkpoint's)."""
    runs: dict[tuple, tuple[Path, list[dict]]] = {}

    def run(plan: str, **env: str) -> tuple[Path, list[dict]]:
        key = (plan, tuple(sorted(env.items())))
        if key not in runs:
            out = tmp_path_factory.mktemp(f"two_ranks_{plan}")
            runs[key] = (out, run_two_ranks(plan, out, **env))
        return runs[key]

    return run


#: steps of the debug recipe's uninterrupted run, which the resume and crash tests continue to
DEBUG_STEPS = 6


@pytest.fixture(scope="session")
def debug_uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, float], dict[int, float]]:
    """The debug recipe trained for ``DEBUG_STEPS`` steps without a stop (a checkpoint every step, as the runs that
    are killed write them): its train loss and learning rate by step, which a resumed run must give bit for bit."""
    out = tmp_path_factory.mktemp("debug_uninterrupted")
    fit_here(debug_with_checkpoints(out, max_steps=DEBUG_STEPS, every=1))
    rows = metrics(out, "debug")
    losses, lrs = series(rows, "train/loss"), series(rows, "train/lr")
    assert sorted(losses) == sorted(lrs) == list(range(DEBUG_STEPS))
    return losses, lrs
