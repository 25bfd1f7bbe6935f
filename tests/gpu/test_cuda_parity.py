"""GPU tier (``pytest -m gpu`` on a GPU host): the same parity as the CPU tier, with real CUDA streams.

The device lane here is the real one: pinned host state, prefetch/adam/flush streams ordered by events,
fused AdamW on the GPU, 16-bit params written on the GPU. The control run is DeepSpeed's own ZeRO-3
optimizer offload in the same process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lightning_dos.planning.perf_model import PREFETCH_WINDOW  # noqa: E402
from tests.support.parity import RandomPlanEveryStep, make_strategy, rel, train  # noqa: E402
from tests.support.preamble_probes import NormProbe, ReleaseProbe  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]

CLIP = 0.05
RANDOM_LIST = ["device", "host", "host", "device", "device"]


@pytest.fixture(scope="module")
def vanilla() -> dict[str, object]:
    return {
        "fp32": train(None, steps=8, clip=CLIP, accelerator="cuda"),
        "acc2": train(None, steps=6, accumulate=2, clip=CLIP, accelerator="cuda"),
    }


@pytest.mark.parametrize("plan", ["host", "device", 0.5, "stride:2", "stride:3", RANDOM_LIST], ids=str)
def test_cuda_fp32_parity(plan: object, vanilla: dict[str, object]) -> None:
    ref = vanilla["fp32"]
    run = train(plan, steps=8, clip=CLIP, accelerator="cuda")
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert rel(run.masters, ref.masters) <= 1e-5
    _assert_state_pinned_in_place(run.strategy.model.optimizer)
    assert all(p.is_cuda for p in run.strategy.lightning_module.parameters())  # the end of fit left it on the device
    # every step's device-lane prefetches were issued at dispatch and used, the first's too (the homes exist by then)
    records = run.strategy.manager.records
    assert [r.timings.prefetched_ahead for r in records] == [
        min(r.plan.buffers, len(r.plan.device_subgroups()), PREFETCH_WINDOW) for r in records]


def test_cuda_step_preamble(monkeypatch: pytest.MonkeyPatch, vanilla: dict[str, object]) -> None:
    """On real streams: the subgroups' norms equal vanilla's from one all-reduce, and every persistent parameter
    stays a view of its partition on the device through the step (none freed), with parity to vanilla."""
    norms, releases = NormProbe(monkeypatch), ReleaseProbe(monkeypatch)
    run = train(0.5, steps=8, clip=CLIP, accelerator="cuda", every_step=[norms, releases])
    opt = run.strategy.model.optimizer
    assert norms.reduces == [(1, len(opt.fp16_groups))] * 8
    for ours, theirs in norms.pairs:
        assert [float(a) for a in ours] == pytest.approx([float(b) for b in theirs], rel=1e-6)
    assert releases.freed == [0] * 8 and releases.whole == [True] * 8 and releases.same_storage == [True] * 8
    assert releases.own_partition == [True] * 8
    assert opt.persistent_parameters
    ref = vanilla["fp32"]
    assert rel(run.masters, ref.masters) <= 1e-5


def _assert_state_pinned_in_place(opt: object) -> None:
    """Master, exp_avg, exp_avg_sq and the fp32 gradient CPU Adam reads, of every subgroup, are page-locked in place:
    exactly 16 bytes/param."""
    masters = opt.fp32_partitioned_groups_flat
    for master in masters:
        state = opt.optimizer.state[master]
        for tensor in (master, state["exp_avg"], state["exp_avg_sq"], master.grad):
            assert tensor.is_pinned() and tensor.device.type == "cpu"
    registry = opt._dos_pinned
    assert len(registry) == 4 * len(masters)
    assert registry.nbytes == 16 * sum(m.numel() for m in masters)  # no power-of-two rounding
    assert opt.fp16_partitioned_groups_flat[0].is_cuda


def test_cuda_checkpoint_resume_keeps_state_pinned(tmp_path: Path) -> None:
    full = train(0.5, steps=6, epoch_batches=3, clip=CLIP, accelerator="cuda")
    train(0.5, steps=3, epoch_batches=3, clip=CLIP, accelerator="cuda", save_to=str(tmp_path / "dos.ckpt"))
    resumed = train(0.5, steps=6, epoch_batches=3, clip=CLIP, accelerator="cuda", ckpt_path=str(tmp_path / "dos.ckpt"))
    assert len(resumed.losses) == 3
    for a, b in zip(resumed.losses, full.losses[3:]):
        assert abs(a - b) <= 1e-6 * abs(b)  # GPU kernels may reduce in another order between processes' runs
    assert rel(resumed.masters, full.masters) <= 1e-6
    _assert_state_pinned_in_place(resumed.strategy.model.optimizer)


def test_cuda_accumulation_parity(vanilla: dict[str, object]) -> None:
    ref = vanilla["acc2"]
    run = train(0.5, steps=6, accumulate=2, clip=CLIP, accelerator="cuda")
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert rel(run.masters, ref.masters) <= 1e-5


def test_200_steps_random_plan_every_step_bf16() -> None:
    ref = train(None, steps=200, precision="bf16-mixed", clip=CLIP, accelerator="cuda")
    cb = RandomPlanEveryStep(seed=11)
    run = train("host", steps=200, precision="bf16-mixed", clip=CLIP, accelerator="cuda", every_step=cb)
    assert len(set(cb.seen)) > 20
    assert sum(r.timings.prefetched_ahead > 0 for r in run.strategy.manager.records) > 100  # issued at dispatch
    diffs = [abs(a - b) for a, b in zip(run.losses, ref.losses)]
    assert len(diffs) == 200
    assert max(diffs) <= 1e-2, f"max loss difference {max(diffs)} at step {diffs.index(max(diffs))}"
    # it trains: on uniformly random tokens the floor is ln(vocab) = ln(97) = 4.575
    assert run.losses[-1] < run.losses[0] - 0.2 and run.losses[-1] < 4.7
    assert rel(run.masters, ref.masters) <= 1e-2
    # the host homes keep the backward's bf16 gradients, page-locked in place: 14 bytes a parameter
    opt = run.strategy.model.optimizer
    grads = [opt.update_grad(i) for i in range(len(opt.fp32_partitioned_groups_flat))]
    assert all(g.dtype == torch.bfloat16 and g.device.type == "cpu" and g.is_pinned() for g in grads)
    assert opt._dos_pinned.nbytes == 14 * sum(m.numel() for m in opt.fp32_partitioned_groups_flat)


def test_200_steps_random_plan_every_step_fp32() -> None:
    ref = train(None, steps=200, clip=CLIP, accelerator="cuda")
    cb = RandomPlanEveryStep(seed=3)
    run = train("host", steps=200, clip=CLIP, accelerator="cuda", every_step=cb)
    rels = [abs(a - b) / abs(b) for a, b in zip(run.losses, ref.losses)]
    assert max(rels) <= 1e-4, f"max relative loss difference {max(rels)}"
    assert rel(run.masters, ref.masters) <= 1e-4


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_pieces_on_real_streams_match_whole_subgroups(overlap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Subgroups through the slots in pieces of 128 parameters (each subgroup of the tiny model in about 16, through
    1 to 3 slots) on real streams, with a random plan every step: a piece's prefetch must wait for the flush that last
    used its slot, or it overwrites state still being flushed. 100 steps, against whole subgroups per slot."""
    import lightning_dos.update.device_lane as device_lane

    def run() -> object:
        return train("host", steps=100, clip=CLIP, accelerator="cuda", strategy=make_strategy("host", overlap=overlap),
                     every_step=RandomPlanEveryStep(seed=9))

    whole = run()
    monkeypatch.setattr(device_lane, "PIECE", 128)
    pieces = run()
    assert max(pieces.strategy.manager.subgroup_sizes) > 8 * 128
    rels = [abs(a - b) / abs(b) for a, b in zip(pieces.losses, whole.losses)]
    assert len(rels) == 100 and max(rels) <= 1e-6, f"max relative loss difference {max(rels)}"
    assert rel(pieces.masters, whole.masters) <= 1e-6
