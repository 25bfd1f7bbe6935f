"""GPU tier (``pytest -m gpu`` on a GPU host): a module returning ``torch.optim.AdamW`` under DOS on a real GPU.

The CPU tier's comparisons (tests/integration/test_torch_optimizers.py) with the device lane on CUDA: the host lane is
DeepSpeed's CPU Adam on pinned host state, the device lane torch's fused AdamW on the GPU, with and without overlap, and
vanilla ZeRO-3 offload. Bit for bit against the same module returning DeepSpeed's CPU Adam, under the same strategy;
against
plain torch AdamW on the GPU (no DeepSpeed) within the project's GPU parity bound (1e-5; the CPU tier's is 2e-7, and
this tier prints what it measured, to tighten the bound once seen).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.own_model import OwnModel, fit, max_loss_rel, rel  # noqa: E402
from tests.support.parity import make_strategy  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

TOL = 1e-5
CASES: dict[str, dict[str, Any]] = {
    "device": {"plan": "device"},
    "half": {"plan": 0.5},
    "half-overlap": {"plan": 0.5, "overlap": True},
    "zero3_offload": {"plan": None},
}


def _strategy(case: str) -> Any:
    return make_strategy(sub_group_size=3000, **CASES[case])


@pytest.fixture(scope="module")
def plain_torch() -> Any:
    return fit("auto", accelerator="cuda")


@pytest.mark.parametrize("case", list(CASES))
def test_torch_adamw_on_a_gpu(case: str, plain_torch: Any) -> None:
    run = fit(_strategy(case), accelerator="cuda")
    native = fit(_strategy(case), accelerator="cuda", module=OwnModel("ds-adamw"))
    assert run.losses == native.losses and torch.equal(run.flat, native.flat)
    assert run.lrs == plain_torch.lrs
    loss_rel, param_rel = max_loss_rel(run, plain_torch), rel(run.flat, plain_torch.flat)
    print(f"{case}: losses {loss_rel:.3g}, weights {param_rel:.3g} (relative) from plain torch AdamW on the GPU")
    assert loss_rel <= TOL and param_rel <= TOL
    assert run.extra["driven"] is run.extra["stepped"]
    if CASES[case]["plan"] is not None:
        records = run.trainer.strategy.manager.records
        assert len(records) == 6 and all(r.timings.device_params > 0 for r in records)  # the device lane ran
        assert run.trainer.strategy.root_device.type == "cuda"
