"""GPU tier (``pytest -m gpu`` on a GPU host): one home per subgroup, the resident ones in device memory only.

The resident subgroups' updates run on the ``adam`` stream ahead of the device lane, their 16-bit writes are what the
next forward waits for, and they have no host copy: checkpoints and DeepSpeed's readers read them where they live. The
others live in page-locked host memory. The controls are DeepSpeed's own ZeRO-3 optimizer offload and the same plan
without residents, in the same process, for 200 steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lightning_dos.planning.placement import Home  # noqa: E402
from tests.support.homes import RESIDENT, ReadAndWrite, SaveAfter  # noqa: E402
from tests.support.parity import make_strategy, rel, train  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

CLIP = 0.05
STEPS = 200
GIB = 1024**3


@pytest.fixture(scope="module")
def gib() -> float:
    sizes = train("host", steps=1, clip=CLIP, accelerator="cuda").strategy.manager.subgroup_sizes
    return 12 * sum(sizes[:RESIDENT]) / GIB


@pytest.fixture(scope="module")
def vanilla() -> object:
    return train(None, steps=STEPS, clip=CLIP, accelerator="cuda")


def _assert_close(run: object, ref: object, tol: float) -> None:
    rels = [abs(a - b) / abs(b) for a, b in zip(run.losses, ref.losses)]
    assert len(rels) == len(ref.losses) and max(rels) <= tol, max(rels)
    assert rel(run.masters, ref.masters) <= tol


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("plan", ["host", "device", 0.5], ids=str)
def test_200_steps_with_resident_subgroups_track_vanilla(plan: object, overlap: bool, gib: float,
                                                         vanilla: object) -> None:
    run = train(plan, steps=STEPS, clip=CLIP, accelerator="cuda",
                strategy=make_strategy(plan, resident_gib=gib, overlap=overlap))
    _assert_close(run, vanilla, 1e-4)  # the 200-step fp32 bound of test_cuda_parity
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT))
    assert all(r.timings.resident_params > 0 for r in manager.records)
    opt = run.strategy.model.optimizer
    for i, (home, master) in enumerate(zip(opt.homes(), opt.fp32_partitioned_groups_flat)):
        state = opt.optimizer.state[master]
        tensors = (master, state["exp_avg"], state["exp_avg_sq"])
        if home == Home.DEVICE:  # resident: on the GPU only, no host gradient
            assert i < RESIDENT and all(t.is_cuda for t in tensors) and master.grad is None
        else:  # on the host, page-locked in place, with the fp32 gradient CPU Adam reads
            assert all(t.device.type == "cpu" and t.is_pinned() for t in (*tensors, master.grad))


def test_resident_subgroups_on_the_device_equal_the_device_lane(gib: float) -> None:
    """The device lane's fused Adam on the same values, bit for bit (serial: no reduction order differs)."""
    ref = train("device", steps=20, clip=CLIP, accelerator="cuda")
    run = train("device", steps=20, clip=CLIP, accelerator="cuda", strategy=make_strategy("device", resident_gib=gib))
    assert run.losses == ref.losses
    assert torch.equal(run.masters, ref.masters)


def test_checkpoint_and_deepspeed_readers_with_the_state_on_the_device(tmp_path: Path, gib: float) -> None:
    full = train(0.5, steps=6, epoch_batches=3, clip=CLIP, accelerator="cuda",
                 strategy=make_strategy(0.5, resident_gib=gib))
    path = str(tmp_path / "mid.ckpt")
    train(0.5, steps=6, epoch_batches=3, clip=CLIP, accelerator="cuda", strategy=make_strategy(0.5, resident_gib=gib),
          every_step=SaveAfter(path, 3))
    resumed = train(0.5, steps=6, epoch_batches=3, clip=CLIP, accelerator="cuda",
                    strategy=make_strategy(0.5, resident_gib=gib), ckpt_path=path)
    assert resumed.losses == full.losses[3:]
    assert torch.equal(resumed.masters, full.masters)
    runs = []
    for kwargs in ({"resident_gib": gib}, {}):
        cb = ReadAndWrite()
        runs.append((train("device", steps=5, clip=CLIP, accelerator="cuda",
                           strategy=make_strategy("device", **kwargs), every_step=cb), cb))
    (run, cb), (ref, ref_cb) = runs
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(cb.read, ref_cb.read)) and cb.read
    assert run.losses == ref.losses and torch.equal(run.masters, ref.masters)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_auto_keeps_the_tiny_model_whole_on_the_device_and_tracks_vanilla(overlap: bool, vanilla: object) -> None:
    """``resident_gib="auto"`` (the default) reads the device's memory after the first step: the tiny model's whole
    state fits, every subgroup is resident from the first update phase on, and 200 steps track vanilla."""
    run = train("auto", steps=STEPS, clip=CLIP, accelerator="cuda",
                strategy=make_strategy("auto", resident_gib="auto", overlap=overlap))
    _assert_close(run, vanilla, 1e-4)
    manager = run.strategy.manager
    memory = manager.placement.memory
    assert memory is not None and memory.total > memory.peak > 0
    assert manager.resident == tuple(range(len(manager.subgroup_sizes)))
    assert all(r.timings.host_params == r.timings.device_params == 0 for r in manager.records)


class _FirstBatch(pl.Callback):
    """Before the first update: each subgroup's home and the gradient its update will read."""

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.global_step == 0 and not hasattr(self, "homes"):
            opt = trainer.strategy.model.optimizer
            self.homes = opt.homes()
            self.grads = [opt.update_grad(i) for i in range(len(self.homes))]
            self.candidates = trainer.strategy.manager.candidates


def test_auto_under_a_budget_keeps_what_the_budget_holds_and_tracks_vanilla(gib: float, vanilla: object) -> None:
    """``memory_budget_gib`` covers the residents and the device lane's two slots: a budget of the slots plus the first
    subgroups' state keeps exactly those resident; the rest run in the lanes the plan gives them, overlapped. Before
    the first update no subgroup has a home; those the budget could never hold have only their host gradient,
    page-locked, which placement keeps."""
    sizes = train("host", steps=1, clip=CLIP, accelerator="cuda").strategy.manager.subgroup_sizes
    budget = (2 * max(sizes) * 16) / GIB + gib
    first = _FirstBatch()
    run = train(0.5, steps=STEPS, clip=CLIP, accelerator="cuda", every_step=first,
                strategy=make_strategy(0.5, resident_gib="auto", memory_budget_gib=budget, overlap=True))
    _assert_close(run, vanilla, 1e-4)
    assert run.strategy.manager.resident == tuple(range(RESIDENT))
    never = [i for i in range(len(sizes)) if i not in first.candidates]
    assert never and first.homes == (None,) * len(sizes)
    assert all(first.grads[i].is_pinned() and first.grads[i].numel() == sizes[i] for i in never)
    opt = run.strategy.model.optimizer
    assert all(opt.homes()[i] == Home.HOST and opt.update_grad(i) is first.grads[i] for i in never)
