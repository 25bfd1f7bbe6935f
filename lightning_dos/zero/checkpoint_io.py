"""Owns how a DeepSpeed engine reads its checkpoint files: through a memory map.

DeepSpeed reads each rank's optimizer-state file whole into host memory (``torch.load``), so a resume briefly holds
the rank's whole state on the host a second time (12 bytes a parameter) before copying it where it lives: on a host
sized for the state, the resume of a run that trained is then killed by the kernel. Read through a memory map, the
loaded tensors are the file's pages (the page cache, which the kernel reclaims), and each subgroup's state is copied
from them into its home when it is placed (:mod:`lightning_dos.zero.homes`). Files in torch's legacy format, which
cannot be mapped, are read as DeepSpeed reads them.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine


def load_mapped(engine: Any) -> None:
    """Have ``engine`` read its checkpoint files through a memory map (DeepSpeed's torch checkpoint engine only)."""
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if type(checkpoint_engine) is not TorchCheckpointEngine:
        return
    read_whole = checkpoint_engine.load

    def load(path: str, map_location: Any = None) -> Any:
        try:
            return torch.load(path, map_location=map_location, weights_only=False, mmap=True)
        except (RuntimeError, pickle.UnpicklingError):  # a legacy (non-zip) file cannot be mapped
            return read_whole(path, map_location=map_location)

    checkpoint_engine.load = load
