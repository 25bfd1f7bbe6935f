"""Owns ``lightning-dos bench``: measure optimizer-offload strategies on this host, in one of three modes.

* **Strategy comparison** (the default, :mod:`~lightning_dos.bench.harness`): one recipe under every strategy kind,
  each configuration in its own worker process, once per device count: results.json, report.md, chart.png.
* **Plan sweep** (``--sweep``, :mod:`lightning_dos.bench.sweep`): per memory budget, every fixed DOS plan and ``auto``
  interleaved in one process: sweep.json, sweep.md, sweep.png.
* **ROK curve** (``--activations``, :mod:`lightning_dos.bench.rok`): time against peak activation memory per
  activation placement, and the largest micro-batch each fits in a budget: rok.json, rok.md, rok.png.

Every run is what ``lightning-dos fit`` runs: a recipe, a strategy fragment of ``configs/strategy/`` and the flags
given, built by the same LightningCLI (:mod:`~lightning_dos.bench.compose`), on one pipeline for the three modes
(:mod:`~lightning_dos.bench.pipeline`). The project's own targets are not here: ``scripts/targets.py``. docs/bench.md is
the user's guide.
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
    """Treat SIGTERM (a job's time limit, ``timeout``) like Ctrl-C while the block runs: the running worker is
    stopped and the report still written."""
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
    """Run ``lightning-dos bench`` with ``argv``; the exit status: 0 when a run completed, 1 when none did, 2 for a
    usage error, 130 when interrupted (the outputs cover what ran)."""
    from lightning_dos.bench.arguments import parse_args

    try:
        invocation = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:  # --help or a usage error
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    with sigterm_as_interrupt():
        return _run(invocation)


def _run(invocation: Invocation) -> int:
    """The bench, the sweep or the ROK curve of a parsed invocation; returns the exit status."""
    from lightning_dos.bench import harness
    from lightning_dos.bench.pipeline import default_out_dir
    from lightning_dos.bench.rok import harness as rok
    from lightning_dos.bench.sweep import harness as sweep

    config = invocation.config
    mode, module, settings = (("sweep", sweep, invocation.sweep) if invocation.sweep is not None
                              else ("rok", rok, invocation.rok) if invocation.rok is not None
                              else ("bench", harness, config))
    if invocation.dry_run:
        print(module.dry_run_text(settings))
        return 0
    now = datetime.now(timezone.utc)
    out_dir = Path(config.out) if config.out else default_out_dir(mode, config, now)
    config.out = str(out_dir)
    if invocation.sweep is not None:
        doc = sweep.run_sweep(invocation.sweep, out_dir, now=now, resume=invocation.resume)
        statuses, files = [b["fixed"]["status"] for b in doc["budgets"]], "sweep.json, sweep.md, sweep.png"
        lines = [f"  {b['budget']['label']}: auto / best swept plan "
                 + ("not measured" if b.get("auto_vs_best") is None else f"{b['auto_vs_best']:.3f}x")
                 for b in doc["budgets"]]
    elif invocation.rok is not None:
        doc = rok.run_rok(invocation.rok, out_dir, now=now, resume=invocation.resume)
        statuses, files = [p["status"] for p in doc["placements"]], "rok.json, rok.md, rok.png"
        lines = [f"  {s['placement']}: largest micro-batch within {invocation.rok.budget_gib:g} GiB: "
                 f"{s['largest_micro_batch']} ({s['status']})" for s in (doc.get("budget") or {}).get("searches", [])]
    else:
        doc = harness.run_bench(config, out_dir, now=now, resume=invocation.resume)
        statuses, files, lines = [r["status"] for r in doc["results"]], "results.json, report.md, chart.png", []
    completed = sum(status == "ok" for status in statuses)
    unit = {"bench": "configurations", "sweep": "processes", "rok": "placements"}[mode]
    print("\n".join([f"{completed}/{len(statuses)} {unit} completed; results in {out_dir}: {files}", *lines]))
    if doc.get("interrupted"):
        return 130
    return 0 if completed else 1
