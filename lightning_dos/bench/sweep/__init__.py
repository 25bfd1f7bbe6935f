"""Owns ``lightning-dos bench --sweep``: every fixed DOS plan against ``auto``, interleaved in one process per memory
budget: is ``auto`` as fast as the best fixed plan, and does the performance model predict what it measures?
Modules: ``config``, ``worker``, ``results``, ``report``, ``harness``; sweep.png is :mod:`lightning_dos.bench.chart`'s.
"""
