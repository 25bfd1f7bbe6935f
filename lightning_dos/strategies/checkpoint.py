"""Owns publishing sharded checkpoints atomically, finding the newest complete one, and refusing the wrong ones.

A DeepSpeed ZeRO-3 checkpoint is a directory (each rank's shard of the 16-bit weights and of the optimizer state,
DeepSpeed's ``latest`` file, Lightning's client state). Written in place, a crash halfway leaves a directory that
looks like a checkpoint and is not one; and Lightning's ``ModelCheckpoint`` removes the previous checkpoint before
it re-points ``last.ckpt``, so a crash between the two leaves ``last`` dangling and a resume silently starts over.

Here every rank writes into ``<name>.partial``; once all have, rank zero fsyncs every file, writes
:data:`COMPLETE_MARKER` last, and renames the directory to ``<name>`` (a rename within a directory is atomic). A
directory without the marker is never resumed from, and ``--ckpt_path last`` means the newest complete checkpoint in
the checkpoint folders, whatever ``last.ckpt`` points to at that moment.

A sharded checkpoint loads only at the world size that wrote it; ``lightning-dos to-universal CKPT OUT`` (``main``)
rewrites it in DeepSpeed's universal layout, which these strategies load at any world size.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

__all__ = ["COMPLETE_MARKER", "PARTIAL_SUFFIX", "describe", "newest_complete", "partial_path", "publish",
           "remove_partials", "to_universal", "validate_resume_path"]

#: Written last into a published checkpoint: its presence means every shard is on disk.
COMPLETE_MARKER = "dos_complete.json"
#: Suffix of the directory a checkpoint is written into before it is published.
PARTIAL_SUFFIX = ".partial"
_ZERO3_SHARD = "zero_pp_rank_0_mp_rank_00_model_states.pt"
_ZERO12_MODEL = "mp_rank_00_model_states.pt"


def partial_path(filepath: str | os.PathLike) -> Path:
    """Where the checkpoint that will be published at ``filepath`` is written first."""
    return Path(f"{os.fspath(filepath)}{PARTIAL_SUFFIX}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial: str | os.PathLike, final: str | os.PathLike, info: dict[str, Any]) -> Path:
    """Make the checkpoint written into ``partial`` durable and visible at ``final`` in one rename (rank zero only).

    Every file is fsynced, then :data:`COMPLETE_MARKER` (holding ``info``) is written and fsynced, then the directory
    is renamed. An existing ``final`` (a checkpoint of the same name, or a link) is moved aside first and removed
    after, so at every instant ``final`` is absent, the old complete checkpoint, or the new complete one.
    """
    partial, final = Path(partial), Path(final)
    for root, _dirs, files in os.walk(partial):
        for name in files:
            _fsync(Path(root) / name)
    marker = partial / COMPLETE_MARKER
    with open(marker, "w") as handle:
        json.dump(info, handle)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync(partial)
    aside = None
    if final.is_symlink() or final.exists():
        aside = final.with_name(final.name + ".replaced")
        _remove(aside)
        os.replace(final, aside)
    os.replace(partial, final)
    _fsync(final.parent)
    if aside is not None:
        _remove(aside)
    return final


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def remove_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete the unpublished checkpoints left in ``folder`` by a crash (call only while nothing is writing there)."""
    removed = []
    folder = Path(folder)
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.endswith(PARTIAL_SUFFIX) or path.name.endswith(".replaced"):
                _remove(path)
                removed.append(path)
    return removed


def _info(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None


def describe(path: str | os.PathLike) -> str:
    """What ``path`` is, as a resume source: ``"complete"`` (published here), ``"deepspeed"`` (a ZeRO-3 checkpoint
    written without this module: DeepSpeed's ``latest`` file marks it finished), ``"universal"`` (DeepSpeed's
    world-size-independent layout: ``lightning-dos to-universal``), ``"incomplete"``, ``"zero12"`` (a ZeRO stage 1/2
    or non-ZeRO DeepSpeed checkpoint), ``"file"`` (a single-file checkpoint), ``"missing"`` or ``"other"``."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if path.is_file():
        return "file"
    info = _info(path)
    if info is not None:
        return "universal" if info.get("universal") else "complete"
    tags = [p for p in path.iterdir() if p.is_dir()]
    if (path / "latest_universal").is_file() and any((tag / "zero").is_dir() for tag in tags):
        return "universal"
    if any((tag / _ZERO3_SHARD).is_file() for tag in tags):
        return "deepspeed" if (path / "latest").is_file() else "incomplete"
    if any((tag / _ZERO12_MODEL).is_file() for tag in tags):
        return "zero12"
    return "incomplete" if path.name.endswith((".ckpt", PARTIAL_SUFFIX)) else "other"


def newest_complete(folders: Iterable[str | os.PathLike]) -> Optional[Path]:
    """The newest resumable checkpoint in ``folders``: complete ones by the global step they saved, then by time;
    links (``last.ckpt``) are followed, unpublished and incomplete directories skipped. None when there is none."""
    best: Optional[tuple[tuple[int, float], Path]] = None
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if not entry.name.endswith(".ckpt") or describe(entry) not in ("complete", "deepspeed"):
                continue
            target = entry.resolve()
            info = _info(target) or {}
            key = (int(info.get("global_step", -1)), target.stat().st_mtime)
            if best is None or key > best[0]:
                best = (key, target)
    return None if best is None else best[1]


def validate_resume_path(path: str | os.PathLike, key: str = "ckpt_path") -> None:
    """Raise one clear error, naming ``key``, when ``path`` cannot be resumed under a ZeRO-3 strategy here."""
    kind = describe(path)
    if kind in ("complete", "deepspeed", "universal"):
        return
    fixes = {
        "missing": "does not exist; pass a checkpoint directory (e.g. runs/<recipe>/checkpoints/step=100.ckpt) or "
                   "'last' for the newest complete one",
        "file": "is a single file, not a sharded ZeRO-3 checkpoint directory; pass the directory a ZeRO-3 run wrote, "
                "or load these weights with DeepSpeedStrategy(load_full_weights=True)",
        "incomplete": "is an unfinished checkpoint (the run stopped while writing it); pass an older one, or 'last'",
        "zero12": "is a DeepSpeed ZeRO stage 1/2 checkpoint; these strategies are ZeRO-3: resume it under the "
                  "strategy that wrote it, or convert it (DeepSpeed's zero_to_fp32.py) and start from the weights",
        "other": "is not a DeepSpeed checkpoint directory (no shard files found); pass the directory a ZeRO-3 run "
                 "wrote",
    }
    raise (FileNotFoundError if kind == "missing" else ValueError)(f"{key}: {os.fspath(path)} {fixes[kind]}")


def to_universal(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Rewrite the sharded checkpoint ``checkpoint`` in DeepSpeed's universal layout at ``out``, published like a
    checkpoint (written into ``<out>.partial``, marked complete, renamed). Returns ``out``."""
    from lightning_dos.zero.universal import convert_to_universal

    checkpoint, out = Path(checkpoint), Path(out)
    validate_resume_path(checkpoint, key="CHECKPOINT")
    if describe(checkpoint) == "universal":
        raise ValueError(f"CHECKPOINT: {checkpoint} is universal already; resume from it directly")
    if out.exists():
        raise FileExistsError(f"OUT: {out} exists; choose another folder or remove it")
    tag = (checkpoint / "latest").read_text().strip() if (checkpoint / "latest").is_file() else "checkpoint"
    partial = partial_path(out)
    _remove(partial)
    partial.mkdir(parents=True)
    convert_to_universal(checkpoint / tag, partial / tag)
    info = _info(checkpoint) or {}
    publish(partial, out, {"global_step": info.get("global_step"), "universal": True, "from": str(checkpoint)})
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """``lightning-dos to-universal CHECKPOINT OUT``: a checkpoint that resumes at any world size."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="lightning-dos to-universal",
        description="Rewrite a sharded ZeRO-3 checkpoint (written at one world size) in DeepSpeed's universal layout, "
                    "which resumes at any world size: lightning-dos fit ... --ckpt_path OUT")
    parser.add_argument("checkpoint", help="a checkpoint directory, e.g. runs/<recipe>/checkpoints/step=100.ckpt")
    parser.add_argument("out", help="the folder to write (must not exist)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        out = to_universal(args.checkpoint, args.out)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"lightning-dos to-universal: error: {err}", file=sys.stderr)
        return 2
    print(f"universal checkpoint written to {out}; resume with --ckpt_path {out} at any number of devices")
    return 0
