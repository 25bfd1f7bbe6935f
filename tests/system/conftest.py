"""Runs shared by the system tier's modules: each is deterministic and only read after, so the tests that compare
with it read one run instead of making their own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ranks import run_two_ranks, run_two_ranks_together
from tests.support.recipe_run import debug_with_checkpoints, fit_here, metrics, series

#: ``resident_gib`` of the two-rank run with resident subgroups: room for 3,000 parameters' state per rank (a few of
#: each rank's subgroups of at most 2,000)
RESIDENT_GIB = str(12 * 3000 / 1024**3)
#: the two-rank runs that tests/system/test_two_ranks.py and test_universal_checkpoint.py read: made together, in one
#: launch of the script, the first time one is asked for
TWO_RANK_RUNS: list[tuple[str, dict[str, str]]] = [
    ("vanilla", {}),
    ("0.5", {}),
    ("0.5", {"RESIDENT_GIB": RESIDENT_GIB}),
    ("host", {"RANDOM_PLAN": "11"}),
    ("host", {"RANDOM_PLAN": "11", "OVERLAP": "1"}),
    ("host", {"RANDOM_PLAN": "3", "PERSIST": "1", "FLAT_GATHER": "0"}),
    ("host", {"RANDOM_PLAN": "3", "PERSIST": "1", "FLAT_GATHER": "1"}),
    ("host", {"RANDOM_PLAN": "3", "PERSIST": "1", "FLAT_GATHER": "1", "OVERLAP": "1"}),
]


def _key(plan: str, env: dict[str, str]) -> tuple:
    return plan, tuple(sorted(env.items()))


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, list[dict]]]:
    """``two_ranks(plan, **switches)``: the folder and ranks' records of that two-rank run, made once per session
    (vanilla is the control of several tests; plan 0.5 also feeds the universal checkpoint's). The runs of
    ``TWO_RANK_RUNS`` come from one launch; any other configuration runs on its own."""
    runs: dict[tuple, tuple[Path, list[dict]]] = {}

    def run(plan: str, **env: str) -> tuple[Path, list[dict]]:
        if not runs and _key(plan, env) in {_key(p, e) for p, e in TWO_RANK_RUNS}:
            root = tmp_path_factory.mktemp("two_ranks")
            batch = [(p, root / f"run{i}", e) for i, (p, e) in enumerate(TWO_RANK_RUNS)]
            for (p, out, e), records in zip(batch, run_two_ranks_together(batch)):
                runs[_key(p, e)] = (out, records)
        if _key(plan, env) not in runs:
            out = tmp_path_factory.mktemp(f"two_ranks_{plan}")
            runs[_key(plan, env)] = (out, run_two_ranks(plan, out, **env))
        return runs[_key(plan, env)]

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
