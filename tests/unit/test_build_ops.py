"""scripts/build_ops.py: the one-time DeepSpeed JIT builds that scripts/test.sh makes before the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.script_loader import load_script


def test_it_needs_the_tests_extensions_folder(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert load_script("build_ops").main() == 2
    assert "set TORCH_EXTENSIONS_DIR" in capsys.readouterr().err


def test_it_loads_the_ops_the_tests_use_from_their_folder(capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(os.environ["TORCH_EXTENSIONS_DIR"])  # tests/conftest.py's, the one scripts/test.sh builds into
    assert load_script("build_ops").main() == 0
    printed = capsys.readouterr().out
    assert f"CPUAdamBuilder ready in {folder}" in printed
    assert (folder / "cpu_adam").is_dir()
    assert f"GIL-free CPU Adam ready in {folder}" in printed
    assert (folder / "dos_cpu_adam_nogil").is_dir()


def test_a_failed_build_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import deepspeed.accelerator

    class Broken:
        def load(self, verbose: bool = False) -> None:
            raise RuntimeError("ninja: build stopped")

    accelerator = deepspeed.accelerator.get_accelerator()
    monkeypatch.setattr(accelerator, "create_op_builder", lambda name: Broken())
    assert load_script("build_ops").main() == 1
    assert "building DeepSpeed's CPUAdamBuilder failed: ninja: build stopped" in capsys.readouterr().err
