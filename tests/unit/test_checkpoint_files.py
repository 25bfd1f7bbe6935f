"""The checkpoint files of a crash-safe save, on hand-made folders: a save is published by one rename and marked
complete, the newest complete checkpoint skips what a crash left, and a path that cannot be resumed is one clear
error (the crashes themselves, SIGKILLed runs: tests/system/test_crash_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dos.strategies.checkpoint import (
    COMPLETE_MARKER,
    describe,
    newest_complete,
    partial_path,
    publish,
    remove_partials,
    validate_resume_path,
)


def _shard(folder: Path, name: str = "zero_pp_rank_0_mp_rank_00_model_states.pt") -> Path:
    (folder / "checkpoint").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint" / name).write_bytes(b"shard")
    return folder


def test_publish_is_one_rename_and_marks_complete(tmp_path: Path) -> None:
    final = tmp_path / "step=2.ckpt"
    partial = _shard(partial_path(final))
    assert describe(partial) == "incomplete" and describe(final) == "missing"
    publish(partial, final, {"global_step": 2})
    assert not partial.exists() and describe(final) == "complete"
    assert json.loads((final / COMPLETE_MARKER).read_text()) == {"global_step": 2}
    # publishing over a checkpoint of the same name replaces it whole
    partial = _shard(partial_path(final), "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    publish(partial, final, {"global_step": 4})
    assert json.loads((final / COMPLETE_MARKER).read_text()) == {"global_step": 4}
    assert not (final / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=2.ckpt"]


def test_newest_complete_skips_what_a_crash_left(tmp_path: Path) -> None:
    publish(_shard(partial_path(tmp_path / "step=2.ckpt")), tmp_path / "step=2.ckpt", {"global_step": 2})
    publish(_shard(partial_path(tmp_path / "step=4.ckpt")), tmp_path / "step=4.ckpt", {"global_step": 4})
    _shard(partial_path(tmp_path / "step=6.ckpt"))  # killed while writing
    _shard(tmp_path / "step=8.ckpt")  # written in place by something else, unfinished: no latest file
    (tmp_path / "last.ckpt").symlink_to("step=9.ckpt")  # dangling: its target was removed
    assert newest_complete([tmp_path, tmp_path / "absent"]) == (tmp_path / "step=4.ckpt").resolve()
    (tmp_path / "last.ckpt").unlink()
    (tmp_path / "last.ckpt").symlink_to("step=2.ckpt")  # a link is followed; the step decides, not the name
    assert newest_complete([tmp_path]) == (tmp_path / "step=4.ckpt").resolve()
    # a ZeRO-3 checkpoint DeepSpeed finished without this module (its latest file) is resumable too
    legacy = _shard(tmp_path / "old" / "epoch=0.ckpt")
    (legacy / "latest").write_text("checkpoint")
    assert describe(legacy) == "deepspeed" and newest_complete([tmp_path / "old"]) == legacy.resolve()
    assert sorted(p.name for p in remove_partials(tmp_path)) == ["step=6.ckpt.partial"]
    assert newest_complete([tmp_path / "nothing-here"]) is None


@pytest.mark.parametrize(
    ("make", "kind", "words"),
    [
        (lambda p: p, "missing", ["does not exist", "'last'"]),
        (lambda p: (p.write_bytes(b"x"), p)[1], "file", ["single file", "load_full_weights"]),
        (lambda p: _shard(Path(f"{p}.partial")), "incomplete", ["unfinished", "'last'"]),
        (lambda p: _shard(p, "mp_rank_00_model_states.pt"), "zero12", ["ZeRO stage 1/2", "zero_to_fp32"]),
        (lambda p: (p.mkdir(), p)[1], "incomplete", ["unfinished"]),  # DeepSpeed made the folder, then the crash
        (lambda p: ((p.parent / "weights").mkdir(), p.parent / "weights")[1], "other", ["not a DeepSpeed checkpoint"]),
    ],
)
def test_a_checkpoint_that_cannot_be_resumed_is_one_clear_error(tmp_path: Path, make, kind: str,
                                                                 words: list[str]) -> None:
    path = make(tmp_path / "step=2.ckpt")
    assert describe(path) == kind, path
    with pytest.raises((FileNotFoundError, ValueError)) as info:
        validate_resume_path(path)
    assert str(info.value).startswith(f"ckpt_path: {path} ")
    for word in words:
        assert word in str(info.value)
