"""lightning-dos: Deep Optimizer States for PyTorch Lightning.

``import lightning_dos`` checks the DeepSpeed and Lightning versions and registers the strategy name
``"deep_optimizer_states"`` with Lightning (idempotently), plus the baselines ``"zero3_offload"``,
``"static_split_{0.25,0.5,0.75}"`` and ``"zero3"`` (no offload) and the peers ``"plain"``, ``"torchao_offload"``,
``"superoffload"`` and ``"zenflow"`` (:mod:`lightning_dos.strategies.peers`) and ``"fsdp_offload"``
(:mod:`lightning_dos.strategies.fsdp_offload`), so
``Trainer(strategy="deep_optimizer_states")`` works.

The package has two halves. The engine trains: ``strategies`` (the Lightning strategies), ``update`` (the update
phase: manager and executor), ``planning`` (pure: plans and the performance model), ``zero`` (the DeepSpeed seam)
and ``activations`` (activation offload). The lab measures and drives it: ``telemetry`` (metrics, run identity,
comparisons), ``models``, ``data`` and ``bench``. The lab imports the engine, never the reverse; ``cli`` (the
``lightning-dos`` command) and ``optim`` (the AdamW a model builds) sit at the root. docs/architecture.md follows
one training iteration through it.
"""

from lightning_dos._versions import check_versions

check_versions()

from lightning.pytorch.strategies import StrategyRegistry  # noqa: E402

from lightning_dos.strategies import (  # noqa: E402
    STRATEGY_NAME,
    DeepOptimizerStatesStrategy,
    FSDPOffloadStrategy,
    PlainStrategy,
    SuperOffloadStrategy,
    TorchaoOffloadStrategy,
    ZenFlowStrategy,
    ZeRO3OffloadStrategy,
    ZeRO3Strategy,
)

__version__ = "0.1.0"


def register() -> None:
    """Register ``deep_optimizer_states``, the baselines and the peers with Lightning's strategy registry (safe to
    call repeatedly)."""
    if STRATEGY_NAME not in StrategyRegistry:
        DeepOptimizerStatesStrategy.register_strategies(StrategyRegistry)
    for other in (ZeRO3OffloadStrategy, ZeRO3Strategy, PlainStrategy, TorchaoOffloadStrategy, SuperOffloadStrategy,
                  ZenFlowStrategy, FSDPOffloadStrategy):
        if other.strategy_name not in StrategyRegistry:
            other.register_strategies(StrategyRegistry)


register()

__all__ = [
    "DeepOptimizerStatesStrategy",
    "FSDPOffloadStrategy",
    "PlainStrategy",
    "SuperOffloadStrategy",
    "TorchaoOffloadStrategy",
    "ZeRO3OffloadStrategy",
    "ZeRO3Strategy",
    "ZenFlowStrategy",
    "STRATEGY_NAME",
    "register",
    "__version__",
]
