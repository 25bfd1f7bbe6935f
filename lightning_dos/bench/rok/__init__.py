"""Owns ``lightning-dos bench --activations ...``: the recompute-offload-keep (ROK) curve and what the memory buys.

For one model, sequence length and micro-batch under one training strategy, every activation placement asked for
(``keep``, ``recompute``, ``offload-host``, ``offload-nvme``: :mod:`~lightning_dos.bench.rok.placements`) runs in a
worker process of its own; each gives its iteration time, phase times, tokens/s, peak activation memory
(:mod:`~lightning_dos.bench.rok.meter`) and the ``act/*`` counters of the activation offload. With
``--activation-budget-gib``, each placement's largest micro-batch whose peak activation memory fits the budget is
then searched for, doubling and bisecting (:mod:`~lightning_dos.bench.rok.search`), one short worker run a probe.

Modules, one job each: ``placements`` (the four placements), ``config`` (the mode's settings and their checks),
``meter`` (inside a worker: activation memory per iteration), ``worker`` (a worker's body), ``disk`` (the NVMe
directory's write and read bandwidth), ``search`` (the micro-batch search), ``harness`` (the invocation),
``results`` (figures, rok.json), ``report`` (rok.md) and ``chart`` (rok.png). Worker launching, the progress
bar, the hardware and version description and JSON writing are the bench's own (:mod:`lightning_dos.bench`).
docs/bench.md ("ROK curve") is the user's guide.
"""
