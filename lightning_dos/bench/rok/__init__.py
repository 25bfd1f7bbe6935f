"""Owns ``lightning-dos bench rok``: the recompute-offload-keep (ROK) curve of the activations and what the memory
buys (``study`` says how it runs). Modules: ``study`` (the settings and the runs), ``meter`` (inside a worker), ``disk``
(the NVMe directory's bandwidth), ``search``, ``results``, ``chart``.
"""
