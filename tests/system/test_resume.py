"""Checkpoints and resume from the command line: ``lightning-dos fit ... --ckpt_path last`` continues a recipe where it
stopped: the same batches, the same learning-rate schedule and the same plan state, so the losses after the resume
are those of a run that never stopped.

The runs go through the CLI in this process (tests/system/test_cli.py runs it in a fresh one, as a user does;
tests/system/test_crash_resume.py resumes runs killed in their own).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.support.recipe_run import debug_with_checkpoints, fit_here, metrics, series

# the runs in this process pass their arguments while pytest's own sit in sys.argv
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_resume_continues_like_an_uninterrupted_run(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                    debug_uninterrupted: tuple[dict, dict]) -> None:
    expected, lr_whole = debug_uninterrupted
    fit_here(debug_with_checkpoints(tmp_path, max_steps=4))
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "step=4.ckpt"  # a sharded ZeRO checkpoint: a directory
    assert (last / "checkpoint").is_dir()

    caplog.clear()
    with caplog.at_level(logging.INFO):
        fit_here(debug_with_checkpoints(tmp_path, max_steps=6), "--ckpt_path", "last")
    assert "resumed the plan state" in caplog.text
    after = series(metrics(tmp_path, "debug"), "train/loss")
    assert sorted(after) == [4, 5]  # it started at step 4: nothing was trained twice
    # same weights, optimizer state, batches and learning rate: the losses of the run that never stopped, bit for bit
    assert after == {step: expected[step] for step in (4, 5)}
    lr_after = series(metrics(tmp_path, "debug"), "train/lr")
    assert lr_after == {step: lr_whole[step] for step in (4, 5)}


def test_resume_keeps_autos_plan_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fit_here(debug_with_checkpoints(tmp_path, max_steps=4), "--trainer.strategy.init_args.plan", "auto")
    state = _plan_state(tmp_path / "checkpoints" / "last.ckpt")
    assert state["plan"] == "auto" and state["auto_steps"] == 4  # past the two probe steps
    assert state["calibrator"]["observations"] == 4

    caplog.clear()
    with caplog.at_level(logging.INFO):
        fit_here(debug_with_checkpoints(tmp_path, max_steps=6), "--trainer.strategy.init_args.plan", "auto",
                 "--ckpt_path", "last")
    assert "resumed the plan state" in caplog.text
    # the resumed run planned on from the saved state: auto counts its update phases from 4, not from a new probe
    state = _plan_state(tmp_path / "checkpoints" / "last.ckpt")
    assert last_step(tmp_path) == 6
    assert state["auto_steps"] == 6 and state["calibrator"]["observations"] == 6


def _plan_state(checkpoint: Path) -> dict:
    saved = torch.load(checkpoint / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt", map_location="cpu",
                       weights_only=False)
    return saved["callbacks"]["deep_optimizer_states"]["plan_state"]


def last_step(out: Path) -> int:
    return int((out / "checkpoints" / "last.ckpt").resolve().name.removeprefix("step=").removesuffix(".ckpt"))
