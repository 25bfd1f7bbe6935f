"""Owns the update phase: which plan runs each step, and running it over the host lane and the device lane.

``manager`` (:class:`~lightning_dos.update.manager.OptimizerStateManager`) picks each step's plan with
``planning``, demotes what would not fit in free device memory, runs the executor and records every step;
``executor`` (:class:`~lightning_dos.update.executor.UpdateExecutor`) runs one phase, composing ``host_lane``
(DeepSpeed's CPU Adam, then the upload of the new params), ``device_lane`` (prefetch -> fused Adam -> flush), the
``streams`` and events that order them and the ``timings`` they measure; ``phase`` is a phase in flight beside the
next forward (``overlap``), the worker thread that runs it and the per-subgroup gates its readers wait at;
``resident`` keeps some subgroups' state on the device for the whole run; ``subgroup`` is the plain view of one
subgroup's tensors that the seam (``zero``) hands over; ``device_adam`` is Adam on the device, whole or chunk by
chunk; ``host_memory`` page-locks host tensors in place. Nothing here imports DeepSpeed: the optimizer is
duck-typed. Import from the modules (this file imports none of them, so the seam can import ``subgroup`` alone).
"""
