"""Checkpoints and resume from the command line: ``lightning-dos fit ... --ckpt_path last`` continues a recipe where it
stopped: the same batches, the same learning-rate schedule and the same plan state, so the losses after the resume
are those of a run that never stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.recipe_run import debug_with_checkpoints, fit, metrics, series

pytestmark = pytest.mark.slow


def _ok(result) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


def test_resume_continues_like_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = debug_with_checkpoints(tmp_path / "whole", max_steps=6)
    _ok(fit(whole))
    expected = series(metrics(tmp_path / "whole", "debug"), "train/loss")
    assert sorted(expected) == list(range(6))

    stopped = debug_with_checkpoints(tmp_path / "parts", max_steps=4)
    _ok(fit(stopped))
    last = tmp_path / "parts" / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "step=4.ckpt"  # a sharded ZeRO checkpoint: a directory
    assert (last / "checkpoint").is_dir()

    resumed = debug_with_checkpoints(tmp_path / "parts", max_steps=6)
    result = fit(resumed, "--ckpt_path", "last")
    _ok(result)
    assert "resumed the plan state" in result.stdout + result.stderr
    after = series(metrics(tmp_path / "parts", "debug"), "train/loss")
    assert sorted(after) == [4, 5]  # it started at step 4: nothing was trained twice
    # same weights, optimizer state, batches and learning rate: the losses of the run that never stopped, bit for bit
    assert after == {step: expected[step] for step in (4, 5)}
    lr_whole = series(metrics(tmp_path / "whole", "debug"), "train/lr")
    lr_after = series(metrics(tmp_path / "parts", "debug"), "train/lr")
    assert lr_after == {step: lr_whole[step] for step in (4, 5)}


def test_resume_keeps_autos_plan_state(tmp_path: Path) -> None:
    config = debug_with_checkpoints(tmp_path, max_steps=4)
    _ok(fit(config, "--trainer.strategy.init_args.plan", "auto"))
    state = _plan_state(tmp_path / "checkpoints" / "last.ckpt")
    assert state["plan"] == "auto" and state["auto_steps"] == 4  # past the two probe steps
    assert state["calibrator"]["observations"] == 4

    config = debug_with_checkpoints(tmp_path, max_steps=6)
    result = fit(config, "--trainer.strategy.init_args.plan", "auto", "--ckpt_path", "last")
    _ok(result)
    assert "resumed the plan state" in result.stdout + result.stderr
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
