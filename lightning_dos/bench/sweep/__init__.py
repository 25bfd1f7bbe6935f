"""Owns ``lightning-dos bench sweep``: every fixed DOS plan against ``auto``, interleaved in one process per memory
budget: is ``auto`` as fast as the best fixed plan, and does the performance model predict what it measures? Modules:
``config`` (settings, budgets, the schedule), ``worker`` (the callback), ``results``, ``study`` (runs, tables, chart).
"""
