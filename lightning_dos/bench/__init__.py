"""Owns ``lightning-dos bench``: measure optimizer-offload strategies on this host, in one of three modes.

* **Strategy comparison** (the default): the same model, data, seed and batch under every strategy kind
  (vanilla ZeRO-3 optimizer offload, DeepSpeed's static split, Deep Optimizer States with ``auto`` and any fixed
  plans, no offload), each configuration in its own worker process, once per device count of ``--devices`` (data
  parallel). Outputs: ``results.json``, ``report.md`` (plus a copy named after model, hardware and date) and
  ``chart.png``.
* **Plan sweep** (``--sweep``): per memory budget, one DOS process runs every fixed plan and ``auto`` interleaved,
  to check the performance model. Outputs: ``sweep.json``, ``sweep.md`` and ``sweep.png``.
* **ROK curve** (``--activations keep recompute offload-host offload-nvme``): iteration time against peak activation
  memory per activation placement under one strategy, and with ``--activation-budget-gib`` the largest micro-batch
  each placement fits in that budget (:mod:`lightning_dos.bench.rok`). Outputs: ``rok.json``, ``rok.md`` and
  ``rok.png``.

Modules, each serving every mode: ``arguments`` (command line, recipes), ``config`` (settings), ``strategies``
(the strategy kinds compared: one entry per kind), ``workload`` (model and data), ``harness`` (the invocation),
``launcher`` (one worker process), ``worker`` (inside it, with ``timing``; ``ranks`` for its data-parallel ranks),
``stats``, ``results`` (figures and ratios, documents), ``report``, ``chart``; the ROK
curve's own modules are in the ``rok`` package. Peak memory and the host's hardware and versions are measured by
:mod:`lightning_dos.telemetry.peak_memory` and :mod:`lightning_dos.telemetry.environment`, which training runs use
too. docs/bench.md is the user's guide.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_dos.bench.arguments import Invocation

__all__ = ["main"]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM (a job's time limit, ``timeout``, a scheduler) like Ctrl-C while the block runs.

    The harness stops the running worker on ``KeyboardInterrupt`` and still write their report for what
    ran; without this a SIGTERM ended the parent at once and left no report at all.
    """
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
    """Run ``lightning-dos bench`` with ``argv`` (default: the process's arguments); return the exit status.

    0 when at least one configuration completed (failed ones are part of the report), 1 when none did,
    2 for a usage error, 130 when interrupted by Ctrl-C or SIGTERM (the report covers what ran).
    """
    from lightning_dos.bench.arguments import parse_args

    try:
        invocation = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:  # --help or a usage error
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    with sigterm_as_interrupt():
        return _run(invocation)


def _run(invocation: Invocation) -> int:
    """The bench, the sweep or the ROK curve of a parsed invocation; returns the exit status."""
    from lightning_dos.bench.harness import default_out_dir, dry_run_text, run_bench

    config = invocation.config
    if invocation.sweep is not None:
        return _sweep(invocation)
    if invocation.rok is not None:
        return _rok(invocation)
    if invocation.dry_run:
        print(dry_run_text(config))
        return 0
    now = datetime.now(timezone.utc)
    out_dir = Path(config.out) if config.out else default_out_dir(config, now)
    config.out = str(out_dir)
    doc = run_bench(config, out_dir, now=now, resume=invocation.resume)
    completed = sum(r["status"] == "ok" for r in doc["results"])
    print(f"{completed}/{len(doc['results'])} configurations completed; results in {out_dir}: results.json, "
          "report.md, chart.png")
    if doc.get("interrupted"):
        return 130
    return 0 if completed else 1


def _sweep(invocation: Invocation) -> int:
    """``--sweep``: the plan sweep; 0 when at least one process completed, 1 when none did, 130 when interrupted."""
    from lightning_dos.bench.harness import default_out_dir, run_sweep, sweep_dry_run_text

    sweep = invocation.sweep
    assert sweep is not None
    if invocation.dry_run:
        print(sweep_dry_run_text(sweep))
        return 0
    now = datetime.now(timezone.utc)
    out_dir = Path(sweep.bench.out) if sweep.bench.out else default_out_dir(sweep.bench, now, sweep=True)
    sweep.bench.out = str(out_dir)
    doc = run_sweep(sweep, out_dir, now=now)
    processes = [b["fixed"]["status"] for b in doc["budgets"]]  # one process per budget: fixed plans and auto
    completed = sum(status == "ok" for status in processes)
    print(f"{completed}/{len(processes)} processes completed; results in {out_dir}: sweep.json, sweep.md, sweep.png")
    for budget in doc["budgets"]:
        ratio = budget.get("auto_vs_best")
        print(f"  {budget['budget']['label']}: auto / best swept plan "
              + ("not measured" if ratio is None else f"{ratio:.3f}x"))
    if doc.get("interrupted"):
        return 130
    return 0 if completed else 1


def _rok(invocation: Invocation) -> int:
    """``--activations``: the ROK curve; 0 when at least one placement completed, 1 when none did, 130 when
    interrupted."""
    from lightning_dos.bench.rok.harness import default_out_dir, dry_run_text, run_rok

    rok = invocation.rok
    assert rok is not None
    if invocation.dry_run:
        print(dry_run_text(rok))
        return 0
    now = datetime.now(timezone.utc)
    out_dir = Path(rok.bench.out) if rok.bench.out else default_out_dir(rok, now)
    rok.bench.out = str(out_dir)
    doc = run_rok(rok, out_dir, now=now, resume=invocation.resume)
    completed = sum(p["status"] == "ok" for p in doc["placements"])
    print(f"{completed}/{len(doc['placements'])} placements completed; results in {out_dir}: rok.json, rok.md, "
          "rok.png")
    for search in (doc.get("budget") or {}).get("searches", []):
        print(f"  {search['placement']}: largest micro-batch within {rok.budget_gib:g} GiB: "
              f"{search['largest_micro_batch']} ({search['status']})")
    if doc.get("interrupted"):
        return 130
    return 0 if completed else 1
