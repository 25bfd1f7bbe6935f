"""GPU tier (``pytest -m gpu`` on a GPU host): ``overlap=True`` with real CUDA streams.

The same parity as the CPU tier's ``tests/integration/test_overlap.py``, for 200 steps: the worker thread issues the
device lane on its own streams and the host lane's uploads on ``h2d``/``convert``, and the next forward's kernels wait
for each subgroup's write through stream waits on its event. The control runs are DeepSpeed's own ZeRO-3 optimizer
offload
and the same plan without overlap, in the same process.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.hold_subgroup import HoldOneSubgroup  # noqa: E402
from tests.support.parity import (  # noqa: E402
    RandomPlanEveryStep,  # noqa: E402
    make_strategy,
    rel,
    train,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

CLIP = 0.05
STEPS = 200
RANDOM_LIST = ["device", "host", "host", "device", "device"]


def _overlap(plan: object) -> object:
    return make_strategy(plan, overlap=True)


def _assert_close(run: object, ref: object, tol: float) -> None:
    assert len(run.losses) == len(ref.losses) and run.losses
    rels = [abs(a - b) / abs(b) for a, b in zip(run.losses, ref.losses)]
    assert max(rels) <= tol, f"max relative loss difference {max(rels)} at step {rels.index(max(rels))}"
    assert rel(run.masters, ref.masters) <= tol


@pytest.fixture(scope="module")
def vanilla() -> object:
    return train(None, steps=STEPS, clip=CLIP, accelerator="cuda")


@pytest.mark.parametrize("plan", ["host", "device", 0.5, "stride:2", RANDOM_LIST], ids=str)
def test_200_steps_with_overlap_track_vanilla_and_match_no_overlap(plan: object, vanilla: object) -> None:
    run = train(plan, steps=STEPS, clip=CLIP, accelerator="cuda", strategy=_overlap(plan))
    _assert_close(run, vanilla, 1e-4)  # the 200-step fp32 bound of tests/gpu/test_cuda_parity.py
    # the same arithmetic as without overlap (the backward's kernels may reduce in another order between runs)
    _assert_close(run, train(plan, steps=STEPS, clip=CLIP, accelerator="cuda"), 1e-6)
    assert len(run.strategy.manager.records) == STEPS


def test_200_steps_with_a_random_plan_every_step(vanilla: object) -> None:
    cb = RandomPlanEveryStep(seed=5)
    run = train("host", steps=STEPS, clip=CLIP, accelerator="cuda", strategy=_overlap("host"), every_step=cb)
    assert len(set(cb.seen)) > 20
    _assert_close(run, vanilla, 1e-4)


def test_a_delayed_host_lane_on_real_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's subgroup held on the worker until the next forward reaches it: that forward's other modules run
    first, the head's kernels wait for its upload on the device, and the run is the run without overlap."""
    reference = train("host", steps=20, clip=CLIP, accelerator="cuda",
                      every_step=HoldOneSubgroup(monkeypatch, hold=False))
    held = HoldOneSubgroup(monkeypatch)
    run = train("host", steps=20, clip=CLIP, accelerator="cuda", strategy=_overlap("host"), every_step=held)
    assert not held.timed_out and all(held.pending_after_step)
    assert all(written for _, holds, written in held.forwards if holds)
    assert any(not written for _, holds, written in held.forwards if not holds)
    _assert_close(run, reference, 1e-6)


def test_the_throughput_timer_no_longer_synchronises_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's throughput timer synchronises the device at every forward and step by default (it would wait for
    the update the forward overlaps); with overlap the strategy turns that off. Only the timer's calls are counted:
    others (an engine's teardown, measured once in a run's window) are not the forward's."""
    calls = {"n": 0}
    synchronize = torch.cuda.synchronize

    def counting(*args: object, **kwargs: object) -> None:
        if any(frame.filename.endswith(os.path.join("deepspeed", "utils", "timer.py"))
               for frame in traceback.extract_stack()):
            calls["n"] += 1
        synchronize(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "synchronize", counting)
    train(0.5, steps=20, clip=CLIP, accelerator="cuda")
    without = calls["n"]
    calls["n"] = 0
    train(0.5, steps=20, clip=CLIP, accelerator="cuda", strategy=_overlap(0.5))
    assert without >= 2 * 18  # start and stop of every step from the third on
    assert calls["n"] == 0
