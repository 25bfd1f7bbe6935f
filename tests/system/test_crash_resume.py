"""Crashes and resume: a run SIGKILLed between checkpoints or while writing one continues from the last *complete*
checkpoint with ``--ckpt_path last``, with exactly the losses of a run that never stopped (CPU, fp32); a half-written
checkpoint is never taken (the checkpoint files on hand-made folders: tests/unit/test_checkpoint_files.py). The
killed runs have a process of their own; the resumes, and the uninterrupted run they are compared with (shared with
tests/system/test_resume.py), run in this one.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_dos.strategies.checkpoint import describe, newest_complete
from tests.support.recipe_run import debug_with_checkpoints, fit_here, metrics, run_fit, series
from tests.system.conftest import DEBUG_STEPS

# the runs in this process pass their arguments while pytest's own sit in sys.argv
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

SCRIPTS = Path(__file__).resolve().parents[1] / "support" / "scripts"
STEPS = DEBUG_STEPS


def _resume_and_compare(out: Path, uninterrupted: dict[int, float]) -> int:
    """Resume with --ckpt_path last to the end (in this process: only the killed run needs its own); the losses of
    every step it trained equal the uninterrupted run's. Returns the first step it trained (0: nothing was
    resumable)."""
    fit_here(debug_with_checkpoints(out, max_steps=STEPS, every=1), "--ckpt_path", "last")
    try:
        resumed = series(metrics(out, "debug"), "train/loss")
    except FileNotFoundError:  # the resumed run logged nothing: there was nothing left to train
        resumed = {}
    if not resumed:  # the stopped run had finished: its last checkpoint is the end
        assert newest_complete([out / "checkpoints"]).name == f"step={STEPS}.ckpt"
        return STEPS
    first = min(resumed)
    assert sorted(resumed) == list(range(first, STEPS))
    assert resumed == {step: uninterrupted[step] for step in resumed}  # bit for bit
    return first


def test_killed_while_writing_a_checkpoint(tmp_path: Path, debug_uninterrupted: tuple[dict, dict]) -> None:
    uninterrupted, _ = debug_uninterrupted
    config = debug_with_checkpoints(tmp_path, max_steps=STEPS, every=1)
    killed = run_fit([sys.executable, str(SCRIPTS / "fit_killed_during_save.py")], config,
                     env={"KILL_AT_SAVE": "3"})
    assert killed.returncode == -signal.SIGKILL
    folder = tmp_path / "checkpoints"
    # the third checkpoint (step 3) was being written: its shard is there, unpublished; steps 1 and 2 are complete
    assert describe(folder / "step=3.ckpt.partial") == "incomplete" and not (folder / "step=3.ckpt").exists()
    assert newest_complete([folder]).name == "step=2.ckpt"
    assert _resume_and_compare(tmp_path, uninterrupted) == 2
    assert not (folder / "step=3.ckpt.partial").exists()  # cleared by the next save


@pytest.mark.parametrize("seed", [0, 1])
def test_killed_at_a_random_point(tmp_path: Path, debug_uninterrupted: tuple[dict, dict], seed: int) -> None:
    """SIGKILL at a seeded point: once the checkpoint of a seeded step k (1 .. STEPS - 2) has appeared, after a seeded
    delay of up to 50 ms, so between checkpoints or inside the next one's save, with at least two steps left. The kill
    must hit a live run and the resume must have steps left to train (a point fixed in seconds, as it was, let a fast
    machine finish the run first)."""
    uninterrupted, _ = debug_uninterrupted
    rng = random.Random(seed)
    k, delay = rng.randint(1, STEPS - 2), rng.uniform(0.0, 0.05)
    config = debug_with_checkpoints(tmp_path, max_steps=STEPS, every=1)
    command = [sys.executable, "-m", "lightning_dos", "fit", "--config", str(config)]
    process = subprocess.Popen(command, cwd=config.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL, env=dict(os.environ))
    folder = tmp_path / "checkpoints"

    def reached() -> bool:
        steps = [int(m.group(1)) for p in (folder.iterdir() if folder.is_dir() else ())
                 if (m := re.fullmatch(r"step=(\d+)\.ckpt", p.name))]  # published
        return any(step >= k for step in steps)

    deadline = time.monotonic() + 300
    while not reached() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    assert process.poll() is None, f"the run ended before the kill at step {k}: nothing was interrupted"
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    first = _resume_and_compare(tmp_path, uninterrupted)
    assert k <= first < STEPS  # resumed from checkpoint k or the next one, with steps left
