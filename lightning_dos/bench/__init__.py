"""Owns ``lightning-dos bench``: studies over ``lightning-dos fit`` on this host, one verb each.

* ``compare`` (also with no verb, :mod:`~lightning_dos.bench.compare`): every row of a row table side by side.
* ``sweep`` (:mod:`lightning_dos.bench.sweep`): every fixed DOS plan against ``auto``, per memory budget.
* ``rok`` (:mod:`lightning_dos.bench.rok`): the recompute-offload-keep curve of the activations.
* ``sizes`` (:mod:`~lightning_dos.bench.sizes`): growing GPT sizes, until every strategy has failed.

A run is a recipe (default ``recipes/gpt-2.7b.yaml``), a strategy fragment of ``configs/strategy/`` and LightningCLI
overrides (``--set`` and the row's), built by the same LightningCLI as ``lightning-dos fit``
(:mod:`~lightning_dos.bench.compose`); rows are data (``configs/bench/*.yaml``, :mod:`~lightning_dos.bench.rows`); one
runner (:mod:`~lightning_dos.bench.runner`) makes every study's runs, each in a fresh worker process, and writes its
JSON, report and chart. docs/bench.md is the user's guide.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["main"]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM (a job's time limit, ``timeout``) like Ctrl-C while the block runs: the running worker is
    stopped and the outputs still written."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Run ``lightning-dos bench`` with ``argv``; the exit status: 0 when a run completed (or a dry run), 1 when none
    did, 2 for a usage error, 130 when interrupted (the outputs cover what ran)."""
    from lightning_dos.bench.arguments import parse_args
    from lightning_dos.bench.compare import run_compare
    from lightning_dos.bench.rok.study import run_rok
    from lightning_dos.bench.runner import Runner
    from lightning_dos.bench.sizes import run_sizes
    from lightning_dos.bench.sweep.study import run_sweep

    try:
        settings, study, resume, dry_run = parse_args(list(sys.argv[1:] if argv is None else argv))
        runner = Runner(settings, resume=resume, dry_run=dry_run)  # resolves the recipe: a wrong --set stops here
    except SystemExit as exit_:  # --help or a usage error
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    if dry_run:
        print(json.dumps({"config": {**settings.to_dict(), **runner.workload}, "model": runner.model}, indent=2))
    with sigterm_as_interrupt(), runner:
        if settings.study == "compare":
            run_compare(runner)
        else:
            {"sweep": run_sweep, "rok": run_rok, "sizes": run_sizes}[settings.study](runner, study)
    if dry_run:
        return 0
    print(f"{runner.completed}/{runner.made} runs completed; results in {runner.out_dir}")
    return 130 if runner.interrupted else 0 if runner.completed else 1
