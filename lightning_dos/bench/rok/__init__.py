"""Owns ``lightning-dos bench --activations ...``: the recompute-offload-keep (ROK) curve and what the memory buys.

Every activation placement (``keep``, ``recompute``, ``offload-host``, ``offload-nvme``) runs under one strategy in a
worker of its own, giving its times, tokens/s, peak activation memory and ``act/*`` counters; with
``--activation-budget-gib`` each one's largest micro-batch within the budget is searched for, one short run a probe.
Modules: ``config`` (settings, the placements), ``meter`` (inside a worker), ``disk`` (the NVMe directory's
bandwidth), ``search``, ``harness``, ``results``, ``report``, ``chart``.
"""
