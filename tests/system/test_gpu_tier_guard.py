"""The GPU tier's guard (tests/conftest.py), in a fresh pytest as a user runs it: selecting GPU tests where CUDA does
not work stops with an error rather than skipping them all to a green exit; listing them runs nothing and is let
through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FILE = "tests/gpu/test_device_peak_gpu.py"


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_listing_the_gpu_tier_works_here_and_running_it_off_a_gpu_stops_with_an_error() -> None:
    listed = _pytest("--collect-only", "-m", "gpu", FILE)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "1 test collected" in listed.stdout and "test_the_census_finds_the_peak" in listed.stdout
    if torch.cuda.is_available():  # a GPU host: the tier runs; this test's subject is the host without one
        return
    ran = _pytest("-m", "gpu", FILE)
    assert ran.returncode == 1
    assert "1 GPU tests selected and CUDA is not available here" in ran.stdout + ran.stderr
