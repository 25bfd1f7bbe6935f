"""The host-memory census: /proc fields in bytes, every host storage counted once, and the log's lines."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_dos.telemetry.host_census import GIB, HostCensusLog, describe, last_reading, read_kb_fields, take


def test_read_kb_fields_reads_the_keys_asked_in_bytes(tmp_path: Path) -> None:
    f = tmp_path / "status"
    f.write_text("Name:\tpython\nVmRSS:\t   2048 kB\nRssAnon:\t1024 kB\nThreads:\t7\n")
    assert read_kb_fields(str(f), ("VmRSS", "RssAnon", "VmPin")) == {"VmRSS": 2048 * 1024, "RssAnon": 1024 * 1024}
    assert read_kb_fields(str(tmp_path / "absent"), ("VmRSS",)) == {}


def test_a_storage_is_counted_once_whatever_views_reach_it() -> None:
    before = take()
    big = torch.zeros(3 * 2**20, dtype=torch.float64)  # 24 MiB
    views = [big[:10], big.view(3, -1), big.narrow(0, 5, 100)]
    after = take(largest=50)
    grown = after["tensors"].get("float64 pageable", 0) - before["tensors"].get("float64 pageable", 0)
    assert grown == big.untyped_storage().nbytes()
    mine = [t for t in after["largest"] if t["bytes"] == 24 * 2**20 and t["dtype"] == "float64"]
    assert len(mine) == 1 and not mine[0]["pinned"]
    assert after["tensor_bytes"] >= sum(after["tensors"].values()) - 1 and views


def test_describe_names_the_process_the_tensors_and_the_largest() -> None:
    keep = torch.ones(2**20, dtype=torch.bfloat16)
    text = describe(take(), "after training batch 1")
    assert text.startswith("host census (after training batch 1): host in use ")
    assert "bfloat16 pageable" in text and "largest: " in text and keep.numel()


def test_the_log_takes_a_census_at_the_batches_asked_and_a_line_at_the_others(
        capsys: pytest.CaptureFixture[str]) -> None:
    log = HostCensusLog(at=(2,))
    trainer = SimpleNamespace(is_global_zero=True)
    for batch in range(3):
        log.on_train_batch_end(trainer, None, None, None, batch)
    log.on_train_end(trainer, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("host in use after training batch 1: ") and out[0].endswith(" GiB")
    assert out[1].startswith("host census (after training batch 2)")
    assert any(line.startswith("host in use after training batch 3: ") for line in out)
    assert list(log.censuses) == ["after training batch 2", "at the end of training"]
    assert all(c["host"]["MemTotal"] > GIB // 16 for c in log.censuses.values())


def test_the_last_reading_of_a_log_is_what_the_log_wrote_last() -> None:
    log = HostCensusLog(at=(1,))
    trainer = SimpleNamespace(is_global_zero=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        log.on_train_batch_end(trainer, None, None, None, 0)
        log.on_train_batch_end(trainer, None, None, None, 1)
    when, gib = last_reading("warning\n" + out.getvalue() + "Traceback (most recent call last):\n")
    assert when == "after training batch 2" and 0 < gib < 1e4
    assert last_reading(out.getvalue().split("host in use after")[0])[0] == "after training batch 1"
    assert last_reading("no readings here\n") is None


def test_the_page_locked_allocator_is_read_where_torch_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "host_memory_stats",
                        lambda: {"allocated_bytes.current": 3 * GIB, "reserved_bytes.current": 4 * GIB}, raising=False)
    census = take()
    assert census["pinned_allocator"] == {"allocated": 3 * GIB, "reserved": 4 * GIB}
    assert "torch's page-locked allocator: 3.00 GiB allocated, 4.00 reserved" in describe(census, "now")
