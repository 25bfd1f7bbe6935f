"""Activation offload to disk after a crash: the files of a run that died between forward and backward (a child
process) are removed at the next start, and a live run's are not (the rest of activation offload:
tests/integration/test_activation_offload.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from lightning_dos.activations import ActivationOffload
from lightning_dos.activations.store import RUN_DIR_PREFIX, NVMeStore
from tests.support.parity import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def make_offload(placement: str, tmp_path: Path, **kwargs) -> ActivationOffload:
    kwargs.setdefault("min_tensor_bytes", 0)
    nvme = {"nvme_path": tmp_path} if placement == "nvme" else {}
    return ActivationOffload(placement, record_decisions=True, **nvme, **kwargs)


CRASHING_CHILD = """
import os, sys, torch
from lightning_dos.activations import ActivationOffload
from lightning_dos.models.gpt import GPT, GPTConfig
model = GPT(GPTConfig(n_layer=3, n_embd=32, n_head=4, vocab_size=64, block_size=16))
offload = ActivationOffload("nvme", nvme_path=sys.argv[1], min_tensor_bytes=0, layers=model)
offload.begin_step()
loss = model(torch.randint(0, 64, (2, 16))).sum()
offload.store.drain()
os._exit(3)  # dies between forward and backward: files written, never removed
"""


def test_files_of_a_crashed_run_are_removed_on_the_next_start(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASHING_CHILD), str(tmp_path)],
                           env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == 3, child.stderr[-2000:]
    (stale,) = tmp_path.glob(RUN_DIR_PREFIX + "*")
    assert list(stale.glob("*.act"))
    fresh = make_offload("nvme", tmp_path).open()
    assert [p.name for p in fresh.store.stale_removed] == [stale.name] and not stale.exists()
    again = NVMeStore(tmp_path)  # another start while that run lives: its directory is not stale
    assert again.stale_removed == [] and fresh.store.dir.exists()
    fresh.close()
    again.close()
    assert list(tmp_path.iterdir()) == []
