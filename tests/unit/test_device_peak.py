"""The device peak census: an allocator history replayed to its peak, what was live then by where it was allocated."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_dos.telemetry.device_peak import BEFORE, GIB, DevicePeakLog, describe, replay, where

MODEL = {"filename": "/venv/site-packages/lightning_dos/models/gpt.py", "line": 90, "name": "forward"}
HOOK = {"filename": "/venv/site-packages/deepspeed/runtime/zero/stage3.py", "line": 1200, "name": "partition_grads"}
TORCH = {"filename": "/venv/site-packages/torch/nn/functional.py", "line": 10, "name": "linear"}


def alloc(addr: int, size: int, *frames: dict[str, Any]) -> dict[str, Any]:
    return {"action": "alloc", "addr": addr, "size": size, "frames": list(frames)}


def free(addr: int, size: int, action: str = "free_requested") -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "frames": []}


def test_where_is_the_innermost_frame_outside_torch_from_its_package_down() -> None:
    assert where([TORCH, MODEL, HOOK]) == "lightning_dos/models/gpt.py:forward"
    assert where([TORCH, HOOK]) == "deepspeed/runtime/zero/stage3.py:partition_grads"
    assert where([{"filename": "/home/me/train.py", "name": "main"}]) == "train.py:main"
    assert where([TORCH, {"filename": "<string>", "name": "x"}]) == "(no Python frame)"
    assert where([]) == "(no Python frame)"


def test_the_peak_is_the_most_live_at_once_and_its_groups_are_what_was_live_then() -> None:
    trace = [
        alloc(1, 100, TORCH, MODEL),  # an activation
        alloc(2, 300, TORCH, MODEL),
        free(1, 100),
        free(1, 100, "free_completed"),  # completes the request above: counted once
        alloc(3, 500, HOOK),  # the peak: 2 and 3 live, with the 1000 held before -> 1800
        free(2, 300),
        free(3, 500, "free_completed"),  # completed with no request recorded: freed here
        alloc(4, 50, MODEL),
    ]
    census = replay(trace, held_before=1000)
    assert census.peak_bytes == 1800 and census.at_event == 4 and census.events == len(trace)
    assert census.end_bytes == 1050
    assert census.groups == ((BEFORE, 1000, 0), ("deepspeed/runtime/zero/stage3.py:partition_grads", 500, 1),
                             ("lightning_dos/models/gpt.py:forward", 300, 1))


def test_a_block_held_before_the_recording_and_freed_in_it_leaves_the_before_group() -> None:
    trace = [free(7, 400), {"action": "segment_alloc", "addr": 9, "size": 4096}, free(7, 400, "free_completed"),
             alloc(8, 100, MODEL)]
    census = replay(trace, held_before=1000)
    assert census.peak_bytes == 1000 and census.at_event == -1  # never above what was held at the start
    assert census.groups == ((BEFORE, 1000, 0),) and census.end_bytes == 700
    later = replay([free(7, 400), free(7, 400, "free_completed"), alloc(8, 900, MODEL)], held_before=1000)
    assert later.peak_bytes == 1500 and later.end_bytes == 1500
    assert later.groups == (("lightning_dos/models/gpt.py:forward", 900, 1), (BEFORE, 600, 0))


def test_describe_prints_the_peak_the_largest_groups_and_the_rest_summed() -> None:
    trace = [alloc(i, (i + 1) * GIB, {"filename": f"/x/lightning_dos/m{i}.py", "name": "f"}) for i in range(4)]
    text = describe(replay(trace, held_before=GIB), "training batch 1", top=2, max_allocated=12 * GIB)
    lines = text.splitlines()
    assert lines[0].startswith("device peak census (training batch 1): 11.00 GiB allocated at the peak (event 4 of 4")
    assert "the allocator's own peak since the process began 12.00 GiB" in lines[0]
    assert lines[1].split() == ["4.00", "GiB", "lightning_dos/m3.py:f", "(1", "allocations)"]
    assert lines[2].split()[:3] == ["3.00", "GiB", "lightning_dos/m2.py:f"]
    assert lines[3].split() == ["4.00", "GiB", "3", "other", "places"]  # 2 + 1 + the 1 held before


def test_off_a_cuda_device_it_says_so_and_records_nothing() -> None:
    log = DevicePeakLog()
    module = SimpleNamespace(device=torch.device("cpu"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        log.on_train_start(None, module)  # type: ignore[arg-type]
        log.on_train_batch_start(None, module, None, 0)  # type: ignore[arg-type]
        log.on_after_backward(None, module)  # type: ignore[arg-type]
        log.on_train_end(None, module)  # type: ignore[arg-type]
    assert "not a CUDA device: nothing recorded" in out.getvalue()
    assert log.held_before is None and log.census is None


@pytest.mark.parametrize("bad", [{"at": 0}, {"top": 0}, {"max_entries": 0}])
def test_bad_settings_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        DevicePeakLog(**bad)
