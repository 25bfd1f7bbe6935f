"""Owns ``lightning-dos bench rok``: the recompute-offload-keep (ROK) curve and what the memory buys.

Every activation placement (``keep``, ``recompute``, ``offload-host``, ``offload-nvme``) runs under one row in a worker
of its own, giving its times, tokens/s, peak activation memory and ``act/*`` counters; with ``--activation-budget-gib``
each one's largest micro-batch within the budget is searched for, one short run a probe. Modules: ``study`` (the
settings and the runs), ``meter`` (inside a worker), ``disk`` (the NVMe directory's bandwidth), ``search``,
``results``, ``chart``.
"""
