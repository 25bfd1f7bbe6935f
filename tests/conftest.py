"""Test-run wiring: one DeepSpeed CPU Adam JIT build for the whole run, shared by every test and subprocess."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# set before anything imports deepspeed's op builder; subprocesses inherit it
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("LIGHTNING_DOS_CACHE", str(ROOT / ".cache" / "lightning-dos"))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


import pytest  # noqa: E402

_BASE_ENV = dict(os.environ)  # before any test: no rank variables yet


def _ask_for_the_cpu_once() -> None:
    """DeepSpeed's CPU Adam asks py-cpuinfo for the CPU's vendor each time one is built, i.e. at every in-process
    fit, and py-cpuinfo answers from a Python interpreter it starts for the purpose: 1.2 s each time on a 2-core
    machine, a third of a small fit. The CPU does not change during a test run, so the first answer (a real one)
    serves the rest; each caller gets its own copy. Child processes ask for themselves."""
    import copy
    import functools

    import cpuinfo

    first = functools.cache(cpuinfo.get_cpu_info)
    cpuinfo.get_cpu_info = lambda: copy.deepcopy(first())


_ask_for_the_cpu_once()


def _reset_environment() -> None:
    pytest_own = {k: v for k, v in os.environ.items() if k.startswith("PYTEST_")}  # pytest manages these itself
    os.environ.clear()
    os.environ.update(_BASE_ENV)
    os.environ.update(pytest_own)


@pytest.fixture(autouse=True)
def _restore_environment():
    """An in-process fit writes MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, ... into os.environ and keeps its
    process group listening on MASTER_PORT; a later child process must not inherit them. Module-scoped fixtures
    fit before this fixture runs, so the environment is reset to the one seen at import, before and after."""
    _reset_environment()
    yield
    _teardown_wandb()
    _reset_environment()


def _teardown_wandb() -> None:
    """wandb's service process outlives a run and keeps the environment of the test that started it (its HOME, its
    data dirs): the next test's offline runs then wrote no ``run-*.wandb`` file. Each test gets a service of its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every module the tests import is imported now (torch, Lightning, DeepSpeed, wandb, ...: millions of objects
    that live until the end). DeepSpeed's ZeRO-3 runs a full ``gc.collect()`` at every engine it builds (0.8 s of a
    2.5 s fit here, spent walking those objects); frozen, they are left out of every collection. What the tests
    create from here on is collected as before."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected: only the tests that will run are left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A run that selected GPU tests (``-m gpu``) on a machine where CUDA does not work stops with an error instead
    of skipping every one of them to a green exit (a CPU build of torch, a broken driver). Listing them
    (``--collect-only``) runs nothing, so it is let through."""
    if config.getoption("collectonly") or not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if not torch.cuda.is_available():
        pytest.exit(f"{sum(1 for i in items if i.get_closest_marker('gpu'))} GPU tests selected and CUDA is not "
                    "available here: run the GPU tier on a GPU host (pytest -m gpu)", returncode=1)
