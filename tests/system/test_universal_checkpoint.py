"""A checkpoint written at one world size resumes at another: ``lightning-dos to-universal`` rewrites it in
DeepSpeed's universal layout, and the strategies load that at any world size, every subgroup's fp32 master and Adam
moments as they were (CPU, gloo: two ranks to one, and one to two)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from lightning_dos.cli import main
from lightning_dos.strategies.checkpoint import describe
from tests.support.parity import subprocess_env, train

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "scripts" / "two_ranks.py"
pytestmark = pytest.mark.slow


def _two_ranks(out: Path, *ckpt: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), "0.5", str(out), *ckpt], env=subprocess_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out / "masters_rank0.pt")


def _full_state(run) -> dict[str, torch.Tensor]:
    params = list(run.strategy.model.module.parameters())
    return {"full": torch.cat([safe_get_full_fp32_param(p).float().flatten() for p in params]),
            "exp_avg": torch.cat([safe_get_full_optimizer_state(p, "exp_avg").float().flatten() for p in params])}


def test_two_ranks_to_one_and_one_to_two(tmp_path: Path) -> None:
    # two ranks train 4 steps and save; the universal copy resumes on one rank with the same state
    saved = _two_ranks(tmp_path / "dp2")
    universal = tmp_path / "dp2-universal"
    assert main(["to-universal", str(tmp_path / "dp2" / "step=4.ckpt"), str(universal)]) == 0
    assert describe(universal) == "universal"
    resumed = train(0.5, steps=4, clip=0.05, ckpt_path=str(universal))  # at step 4 already: loads, trains nothing
    state = _full_state(resumed)
    assert torch.equal(state["full"], saved["full"]) and torch.equal(state["exp_avg"], saved["exp_avg"])
    assert state["exp_avg"].abs().sum() > 0  # real Adam state, not a fresh one
    # and on: one rank saves, two ranks resume from its universal copy
    one = train(0.5, steps=4, clip=0.05, save_to=str(tmp_path / "dp1" / "step=4.ckpt"))
    expected = _full_state(one)
    assert main(["to-universal", str(tmp_path / "dp1" / "step=4.ckpt"), str(tmp_path / "dp1-universal")]) == 0
    loaded = _two_ranks(tmp_path / "dp2-resumed", str(tmp_path / "dp1-universal"))
    assert torch.equal(loaded["full"], expected["full"]) and torch.equal(loaded["exp_avg"], expected["exp_avg"])


def test_to_universal_refuses_what_it_cannot_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["to-universal", str(tmp_path / "absent"), str(tmp_path / "out")]) == 2
    assert "CHECKPOINT:" in capsys.readouterr().err and not (tmp_path / "out").exists()
