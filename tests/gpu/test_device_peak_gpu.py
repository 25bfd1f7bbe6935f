"""GPU tier: the device peak census on a real CUDA allocator's history (torch's recording API as installed)."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import pytest
import torch

from lightning_dos.telemetry.device_peak import BEFORE, DevicePeakLog

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

MIB = 2**20


def spike() -> torch.Tensor:
    """256 MiB that live only across the peak."""
    return torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")


def keep() -> torch.Tensor:
    return torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")


def test_the_census_finds_the_peak_and_names_what_was_live_then() -> None:
    held = torch.empty(32 * MIB, dtype=torch.uint8, device="cuda")  # allocated before the recording
    log = DevicePeakLog(at=1)
    module = SimpleNamespace(device=torch.device("cuda", torch.cuda.current_device()))
    trainer = SimpleNamespace(global_rank=0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        log.on_train_start(trainer, module)  # type: ignore[arg-type]
        log.on_train_batch_start(trainer, module, None, 0)  # type: ignore[arg-type]
        kept = keep()
        big = spike()
        del big
        small = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        log.on_after_backward(trainer, module)  # type: ignore[arg-type]
        log.on_train_end(trainer, module)  # type: ignore[arg-type]
    census = log.census
    assert census is not None and log.held_before is not None and log.held_before >= held.numel()
    assert census.peak_bytes == log.held_before + 64 * MIB + 256 * MIB
    groups = {label: n for label, n, _ in census.groups}
    assert groups["test_device_peak_gpu.py:spike"] == 256 * MIB and groups["test_device_peak_gpu.py:keep"] == 64 * MIB
    assert groups[BEFORE] == log.held_before and "test_device_peak_gpu.py:test_the" not in str(groups)
    assert MIB <= census.end_bytes - (log.held_before + 64 * MIB) <= 2 * MIB  # the small block, as allocated
    assert "device peak census (training batch 1, after its backward, rank 0)" in out.getvalue()
    assert kept.numel() and small.numel()
