"""Owns ``lightning-dos bench --sweep``: every fixed DOS plan against ``auto``, interleaved in one process per memory
budget, to check that ``auto`` picks a plan as fast as the best fixed one and that the performance model predicts what
it measures.

Modules: ``config`` (the settings, the budgets, the order of the plans), ``worker`` (inside a budget's process: the
plan switching callback), ``results`` (figures, ratios, sweep.json), ``report`` (sweep.md) and ``harness`` (the
invocation, on the bench's :mod:`~lightning_dos.bench.pipeline`); sweep.png is drawn by
:mod:`lightning_dos.bench.chart`. docs/bench.md ("Plan sweep") is the user's guide.
"""
