"""Owns the Lightning strategies: Deep Optimizer States, the baselines it is measured against, and the peers.

``dos`` is :class:`DeepOptimizerStatesStrategy` (DOS defaults for ZeRO-3, registration, the dispatch hook), and
``options`` its arguments (``DOSOptions``, documented per field and checked all at once); ``deepspeed_base`` is the
base every DeepSpeed strategy here shares (CPU-only machines, the hook around ``deepspeed.initialize``, module state
onto the device: ``module_device``, atomic checkpoints: ``checkpoint``); ``baselines`` holds vanilla ZeRO-3 offload,
the static split and ZeRO-3 without offload; ``peers`` what a user could pick instead (plain, torchao's offload,
SuperOffload, ZenFlow), and ``fsdp_offload`` torch FSDP with CPU offload (the multi-GPU peer); ``host_binding`` shares
one host's CPU cores among its ranks. A strategy wires the other engine packages into Lightning (``update``, ``zero``,
``planning``, ``activations``) and imports nothing of the lab (``telemetry``, ``models``, ``data``, ``bench``).
"""

from lightning_dos.strategies.baselines import ZeRO3OffloadStrategy, ZeRO3Strategy
from lightning_dos.strategies.dos import STRATEGY_NAME, DeepOptimizerStatesStrategy
from lightning_dos.strategies.fsdp_offload import FSDPOffloadStrategy
from lightning_dos.strategies.peers import PlainStrategy, SuperOffloadStrategy, TorchaoOffloadStrategy, ZenFlowStrategy

__all__ = [
    "DeepOptimizerStatesStrategy",
    "FSDPOffloadStrategy",
    "PlainStrategy",
    "STRATEGY_NAME",
    "SuperOffloadStrategy",
    "TorchaoOffloadStrategy",
    "ZeRO3OffloadStrategy",
    "ZeRO3Strategy",
    "ZenFlowStrategy",
]
