"""An inf gradient skips the whole update on both lanes, as vanilla ZeRO-3 offload skips it, and training goes on.

DeepSpeed decides before any update: a global gradient norm that is not finite marks the step as an overflow and
no subgroup is updated. Under fp16 the dynamic loss scaler also lowers the scale; DeepSpeed's CPU accelerator has no
fp16 here, so this runs in fp32, where the same check skips the step at a fixed scale of 1. The gradient is made
infinite in the backward only (the loss stays finite), in one step of six, with half of the subgroups on each lane.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.support.overflow import INF_AT, InfGradAt, StateAround
from tests.support.parity import train


def _run(plan: Any) -> tuple[Any, StateAround]:
    around = StateAround()
    return train(plan, steps=6, clip=1.0, model=InfGradAt(), every_step=around), around


def test_an_inf_gradient_skips_the_update_on_both_lanes_like_vanilla() -> None:
    dos, around = _run(0.5)
    vanilla, _ = _run(None)
    assert len(dos.losses) == 6 and all(torch.isfinite(torch.tensor(dos.losses)))
    # the skipped step changed nothing: every subgroup's master, moments and step, bit for bit
    before, after = around.before[INF_AT], around.after[INF_AT]
    assert len(before) == len(after) >= 4
    for b, a in zip(before, after):
        assert len(b) == len(a) == 4 and all(torch.equal(x, y) for x, y in zip(b, a))
    # the steps around it did update, on both lanes (the plan puts half of the subgroups on the device lane)
    for k in (INF_AT - 1, INF_AT + 1):
        assert all(not torch.equal(b[0], a[0]) for b, a in zip(around.before[k], around.after[k]))
    assert {"H", "D"} <= set(around.lanes[-1])
    # and training went on exactly as vanilla's, which skips the same step
    assert [abs(a - b) <= 1e-5 * abs(b) for a, b in zip(dos.losses, vanilla.losses)] == [True] * 6
    assert (dos.masters - vanilla.masters).abs().max() <= 1e-5 * vanilla.masters.abs().max()
