"""A checkpoint written at one world size resumes at another: ``lightning-dos to-universal`` rewrites it in
DeepSpeed's universal layout, and the strategies load that at any world size, every subgroup's fp32 master and Adam
moments as they were (CPU, gloo: two ranks to one, and one to two)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from lightning_dos.cli import main
from lightning_dos.strategies.checkpoint import describe
from tests.support.parity import train
from tests.support.ranks import run_two_ranks


def _full_state(run) -> dict[str, torch.Tensor]:
    params = list(run.strategy.model.module.parameters())
    return {"full": torch.cat([safe_get_full_fp32_param(p).float().flatten() for p in params]),
            "exp_avg": torch.cat([safe_get_full_optimizer_state(p, "exp_avg").float().flatten() for p in params])}


def test_two_ranks_to_one_and_one_to_two(tmp_path: Path, two_ranks: Callable[..., tuple[Path, list[dict]]]) -> None:
    # two ranks train 4 steps and save (the run tests/system/test_two_ranks.py compares with vanilla); the universal
    # copy resumes on one rank with the same state
    dp2, _ = two_ranks("0.5")
    saved = torch.load(dp2 / "masters_rank0.pt")
    universal = tmp_path / "dp2-universal"
    assert main(["to-universal", str(dp2 / "step=4.ckpt"), str(universal)]) == 0
    assert describe(universal) == "universal"
    resumed = train(0.5, steps=4, clip=0.05, ckpt_path=str(universal))  # at step 4 already: loads, trains nothing
    state = _full_state(resumed)
    assert torch.equal(state["full"], saved["full"]) and torch.equal(state["exp_avg"], saved["exp_avg"])
    assert state["exp_avg"].abs().sum() > 0  # real Adam state, not a fresh one
    # and on: one rank saves, two ranks resume from its universal copy
    one = train(0.5, steps=4, clip=0.05, save_to=str(tmp_path / "dp1" / "step=4.ckpt"))
    expected = _full_state(one)
    assert main(["to-universal", str(tmp_path / "dp1" / "step=4.ckpt"), str(tmp_path / "dp1-universal")]) == 0
    run_two_ranks("0.5", tmp_path / "dp2-resumed", str(tmp_path / "dp1-universal"))
    loaded = torch.load(tmp_path / "dp2-resumed" / "masters_rank0.pt")
    assert torch.equal(loaded["full"], expected["full"]) and torch.equal(loaded["exp_avg"], expected["exp_avg"])


def test_to_universal_refuses_what_it_cannot_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["to-universal", str(tmp_path / "absent"), str(tmp_path / "out")]) == 2
    assert "CHECKPOINT:" in capsys.readouterr().err and not (tmp_path / "out").exists()
