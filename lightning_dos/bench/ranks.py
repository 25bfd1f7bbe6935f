"""Owns the ranks of a data-parallel worker (``--devices N``): who this process is, what it hands to rank 0, how a
rank's failure reaches the parent, and the child processes rank 0 must not leave behind.

Rank 0 is the worker the parent started; Lightning starts the others by running its command again. Each measures
itself; :func:`gather_to_rank0` collects them (``all_gather_object``) and rank 0 alone writes the result. A failed rank
writes its first error line beside it (:func:`write_failure`) for the launcher. No torch import at module level.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from lightning_dos.bench.results import read_json, write_json

#: Seconds rank 0 waits for its child ranks to exit after a successful run (they only have to leave).
CHILD_EXIT_S = 60.0
#: Seconds rank 0 gives its child ranks after its own failure (to write theirs), before stopping them.
CHILD_FAILURE_GRACE_S = 5.0
#: A non-zero rank's failure file, beside the result file: ``rank<R>.failure.json``.
FAILURE_PATTERN = "rank*.failure.json"

_launchers: list[Any] = []  # Lightning's launchers of this process: their ``procs`` are the ranks they started


def process_rank() -> int:
    """This process's rank on the host: Lightning sets ``LOCAL_RANK`` for the ranks it starts (and for rank 0 once
    it started them); 0 before that, or in a single-device run."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def write_failure(result_path: Path, rank: int, failure: dict[str, Any]) -> None:
    """Record a non-zero rank's failure (status and one-line reason) for the parent, beside the result file."""
    write_json(Path(result_path).with_name(f"rank{rank}.failure.json"), {"rank": rank, **failure})


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    """The failures non-zero ranks recorded in ``run_dir``, by rank (unreadable files are left out)."""
    failures = [read_json(path) for path in sorted(Path(run_dir).glob(FAILURE_PATTERN))]
    return sorted((f for f in failures if f is not None), key=lambda f: f.get("rank", 0))


def clear_failures(run_dir: Path) -> None:
    """Remove an earlier run's failure files from ``run_dir``."""
    for path in Path(run_dir).glob(FAILURE_PATTERN):
        path.unlink(missing_ok=True)


def gather_to_rank0(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``entry``, in rank order (a collective); ``[entry]`` without a process group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [entry]
    entries: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, entry)
    return sorted(entries, key=lambda e: e["rank"])


def watch_children(trainer: Any) -> None:
    """Follow the rank processes ``trainer``'s Lightning launcher starts from this one (call it once the Trainer is
    built, before ``fit``: the launcher fills its list as it starts them; none but on rank 0 of a multi-device run)."""
    launcher = getattr(trainer.strategy, "launcher", None)
    if launcher is not None and isinstance(getattr(launcher, "procs", None), list) and launcher not in _launchers:
        _launchers.append(launcher)


def wait_for_children(succeeded: bool) -> None:
    """Wait for the child ranks to exit (up to :data:`CHILD_EXIT_S` after a success, :data:`CHILD_FAILURE_GRACE_S`
    after a failure, when they may hang in a collective), then kill those still running: none is left behind."""
    deadline = time.monotonic() + (CHILD_EXIT_S if succeeded else CHILD_FAILURE_GRACE_S)
    for proc in [p for launcher in _launchers for p in launcher.procs]:  # the ranks started from this one
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
