"""Test-run wiring: one DeepSpeed CPU Adam JIT build for the whole run, shared by every test and subprocess."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# set before anything imports deepspeed's op builder; subprocesses inherit it
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("LIGHTNING_DOS_CACHE", str(ROOT / ".cache" / "lightning-dos"))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_environment():
    """An in-process fit writes MASTER_ADDR, RANK, LOCAL_RANK, ... into os.environ; later subprocesses must not
    inherit them (a child that sees LOCAL_RANK thinks it was launched by someone else)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
