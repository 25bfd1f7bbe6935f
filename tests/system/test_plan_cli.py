"""``lightning-dos plan`` as a user runs it: a recipe sized for a box, without training, with exit status 1 when the
run does not fit."""

from __future__ import annotations

import subprocess
import sys

from tests.support.parity import subprocess_env

PLAN = [sys.executable, "-m", "lightning_dos", "plan", "--config", "recipes/gpt-2.7b.yaml"]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PLAN, *args], env=subprocess_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)


def test_gpt_27b_fits_one_80_gib_gpu_and_a_128_gib_host_with_every_subgroup_resident() -> None:
    proc = _plan("--gpu-gib", "80", "--host-gib", "128")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2,780,451,840 parameters over 1 rank(s): 27 subgroups" in proc.stdout
    assert "GPU, resident                         27" in proc.stdout and "the run fits this box" in proc.stdout


def test_a_10b_gpt_on_a_small_host_does_not_fit_and_says_what_to_change() -> None:
    proc = _plan("--model.n_layer", "48", "--model.n_embd", "4096", "--model.n_head", "32", "--gpu-gib", "80",
                 "--host-gib", "64")
    assert proc.returncode == 1
    assert "does not fit: the host needs" in proc.stdout and "more GPUs" in proc.stdout
    assert "(14 bytes per parameter)" in proc.stdout  # the recipe's bf16-mixed: 16-bit host gradients


def test_gpt_12b_may_not_fit_by_the_estimated_peak_and_says_the_strategy_checks_the_measured_one() -> None:
    proc = _plan("--config", "recipes/gpt-12b.yaml", "--gpu-gib", "79.18", "--host-gib", "125.8")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "12,100,517,888 parameters" in proc.stdout
    assert "the run may NOT fit this box" in proc.stdout and "stops before its first update" in proc.stdout


def test_the_plan_follows_the_recipes_precision() -> None:
    proc = _plan("--model.n_layer", "48", "--model.n_embd", "4096", "--model.n_head", "32", "--gpu-gib", "80",
                 "--host-gib", "64", "--trainer.precision", "32-true")
    assert proc.returncode == 1
    assert "(16 bytes per parameter)" in proc.stdout  # fp32 gradients on the host
    assert "on each device 37.58 GiB" in proc.stdout  # fp32 parameters: 4 x 10.09B
