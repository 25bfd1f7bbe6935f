"""Runs of tests/support/scripts/two_ranks.py: a tiny LM trained by two gloo ranks on this host (Lightning starts the
second rank), each rank's losses, plans and gathered state written under ``out``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.parity import subprocess_env

SCRIPT = Path(__file__).resolve().parent / "scripts" / "two_ranks.py"


def run_two_ranks(plan: str, out: Path, *args: str, **env_vars: str) -> list[dict]:
    """Train ``plan`` ("vanilla" or a DOS plan) at two ranks into ``out`` (``args``: a checkpoint to resume from;
    ``env_vars``: the script's switches); each rank's record."""
    proc = subprocess.run([sys.executable, str(SCRIPT), plan, str(out), *args], env=subprocess_env(**env_vars),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def run_two_ranks_together(runs: list[tuple[str, Path, dict[str, str]]], **env_vars: str) -> list[list[dict]]:
    """Several runs ``(plan, out, switches)`` one after the other in one launch of the script (two processes that
    start, import and join their process group once; ``env_vars``: the launch's own, e.g. ``ACCELERATOR``); each
    run's ranks' records, in order."""
    spec = runs[0][1].parent / "two_ranks_runs.json"
    spec.write_text(json.dumps([{"plan": plan, "out": str(out), "env": env} for plan, out, env in runs]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(spec)], env=subprocess_env(**env_vars),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [[json.loads((out / f"rank{r}.json").read_text()) for r in range(2)] for _, out, _ in runs]
