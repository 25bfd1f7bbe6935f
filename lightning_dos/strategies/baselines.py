"""Owns the baseline strategies DOS is compared against: vanilla ZeRO-3 optimizer offload and the static split.

``ZeRO3OffloadStrategy`` is Lightning's ``DeepSpeedStrategy`` with ZeRO-3, the optimizer state offloaded to
pinned host memory and nothing else changed (``ratio < 1`` gives DeepSpeed's static split, "Twin-Flow",
which keeps the first subgroups' state permanently on the GPU). It can run on CPUs like the DOS strategy,
so CPU CI compares against the real control run.
"""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_dos.strategies.deepspeed_base import DeepSpeedBase


class ZeRO3OffloadStrategy(DeepSpeedBase):
    """DeepSpeed ZeRO-3 with ``offload_optimizer: cpu`` (pinned), optionally DeepSpeed's static split.

    Args:
        ratio: fraction of the optimizer state DeepSpeed keeps on the host; ``1.0`` is vanilla offload,
            ``0.75`` keeps a quarter of the subgroups' state permanently on the GPU ("Twin-Flow").
        sub_group_size: parameters per subgroup (Lightning's default of 1e12 makes a single subgroup).
        pin_memory: page-locked host buffers for the offloaded state.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``.
    """

    strategy_name = "zero3_offload"
    takes_torch_adam = True  # torch's Adam/AdamW run as DeepSpeed's CPU Adam, as under deep_optimizer_states

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        ratio: float = 1.0,
        sub_group_size: int = 100_000_000,
        pin_memory: bool = True,
        stage: int = 3,
        offload_optimizer: bool = True,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise MisconfigurationException(f"ratio: {ratio} is outside [0, 1]; set 1.0 for vanilla offload")
        if sub_group_size <= 0:
            raise ValueError(f"sub_group_size: {sub_group_size} must be a positive number of parameters, e.g. 1e8")
        # real parameters, not setdefault: a class_path config passes every DeepSpeedStrategy default explicitly
        if stage != 3 or not offload_optimizer:
            raise MisconfigurationException(
                "stage/offload_optimizer: zero3_offload is ZeRO stage 3 with the optimizer offloaded; set stage: 3 and "
                "offload_optimizer: true (or use Lightning's DeepSpeedStrategy for other stages)"
            )
        super().__init__(
            accelerator=accelerator,
            sub_group_size=int(sub_group_size),
            pin_memory=pin_memory,
            stage=3,
            offload_optimizer=True,
            **kwargs,
        )
        self.ratio = float(ratio)
        zero = self.config.get("zero_optimization", {})
        if ratio != 1.0 and isinstance(zero.get("offload_optimizer"), dict):
            zero["offload_optimizer"]["ratio"] = self.ratio

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            "zero3_offload", cls, description="DeepSpeed ZeRO-3, optimizer state offloaded to pinned host memory"
        )
        for ratio in (0.25, 0.5, 0.75):
            strategy_registry.register(
                f"static_split_{ratio}",
                cls,
                description=f"DeepSpeed ZeRO-3 offload with ratio={ratio} (static split)",
                ratio=ratio,
            )


class ZeRO3Strategy(DeepSpeedBase):
    """DeepSpeed ZeRO-3 with everything on the accelerator (the no-offload baseline).

    Args:
        sub_group_size: parameters per subgroup.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``.
    """

    strategy_name = "zero3"

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        sub_group_size: int = 100_000_000,
        stage: int = 3,
        **kwargs: Any,
    ) -> None:
        if sub_group_size <= 0:
            raise ValueError(f"sub_group_size: {sub_group_size} must be a positive number of parameters, e.g. 1e8")
        if stage != 3:
            raise MisconfigurationException(f"stage: zero3 is ZeRO stage 3, got {stage}; set stage: 3")
        super().__init__(accelerator=accelerator, sub_group_size=int(sub_group_size), stage=3, **kwargs)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register("zero3", cls, description="DeepSpeed ZeRO-3 without offload")
