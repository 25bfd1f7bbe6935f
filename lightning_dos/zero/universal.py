"""Owns DeepSpeed's universal checkpoints in the seam: converting a sharded ZeRO checkpoint into one, and loading one.

A ZeRO-3 checkpoint holds one shard per rank; it loads only at the world size that wrote it. DeepSpeed's
``ds_to_universal`` rewrites it per parameter (fp32 master, ``exp_avg``, ``exp_avg_sq``), which loads at any world
size when the engine is told so (``checkpoint.load_universal`` in its config, read once at construction). Here the
engine is told for one load only, so a run resumes from a universal checkpoint without a config change.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["convert_to_universal", "loading_universal"]


def convert_to_universal(tag_folder: Path, output_tag_folder: Path, workers: int = 4) -> None:
    """DeepSpeed's ``ds_to_universal`` from ``tag_folder`` (``<checkpoint>/<tag>``) into ``output_tag_folder``; it
    also writes ``latest_universal`` beside the output."""
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=str(tag_folder), output_folder=str(output_tag_folder),
                              num_extract_workers=workers, num_merge_workers=max(1, workers // 2),
                              keep_temp_folder=False, strict=True, inject_missing_state=False)
    ds_to_universal.main(args)


@contextlib.contextmanager
def loading_universal(engine: Any) -> Iterator[None]:
    """While inside, ``engine.load_checkpoint`` reads a universal checkpoint (DeepSpeed reads the flag per load)."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        yield
    finally:
        config.load_universal_checkpoint = before
