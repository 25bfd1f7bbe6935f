"""DOS plans against vanilla ZeRO-3 optimizer offload: same data, seed and steps, same losses and fp32 masters.

The control run is DeepSpeed's own ZeRO-3 offload (``ZeRO3OffloadStrategy``). Every run has gradient
clipping active (a small threshold, so the clip factor is not 1) and an LR scheduler whose lr changes at
every step: a device-lane subgroup that missed either would drift from the control at once.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_dos.planning.plan import Lane
from tests.support.parity import RandomPlanEveryStep, TinyLM, assert_tracks, make_strategy, rel, shared_run, train

CLIP = 0.05
FP32_TOL = 1e-5
RANDOM_LIST = ["device", "host", "host", "device", "device"]
PLANS = ["host", "device", 0.5, "stride:2", "stride:3", RANDOM_LIST, "auto"]


def _ids(plan: object) -> str:
    return "list" if isinstance(plan, list) else str(plan)


@pytest.fixture(scope="module")
def vanilla_fp32() -> dict[int, object]:
    return {acc: shared_run(None, steps=6, accumulate=acc, clip=CLIP) for acc in (1, 2)}


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("plan", PLANS, ids=_ids)
def test_fp32_parity_with_vanilla(plan: object, accumulate: int, vanilla_fp32: dict[int, object]) -> None:
    ref = vanilla_fp32[accumulate]
    run = shared_run(plan, steps=6, accumulate=accumulate, clip=CLIP)  # the serial runs test_overlap.py reads too
    assert len(run.masters) == len(ref.masters)
    assert len(run.losses) == len(ref.losses) == 6 * accumulate
    assert_tracks(run, ref, FP32_TOL)
    # the run really changed the weights (a no-op update would also "match" a broken control)
    assert rel(run.masters, train_init_masters()) > 1e-3
    records, sizes = run.extra["records"], run.extra["sizes"]
    assert len(records) == 6
    n_device = sum(1 for lane in records[-1].plan.lanes if lane == Lane.DEVICE)
    expected = {"host": 0, "device": len(sizes)}.get(plan if isinstance(plan, str) else "", None)
    if expected is not None:
        assert n_device == expected
    elif plan is RANDOM_LIST:
        assert [lane.value for lane in records[-1].plan.lanes] == RANDOM_LIST


_INIT: dict[str, torch.Tensor] = {}


def train_init_masters() -> torch.Tensor:
    """fp32 masters of the tiny model before any step (ZeRO-3 flattens params in module order)."""
    if "m" not in _INIT:
        model = TinyLM()
        model.configure_model()
        _INIT["m"] = torch.cat([p.detach().float().flatten() for p in model.net.parameters()])
    return _INIT["m"]


def test_device_lane_follows_the_lr_schedule(vanilla_fp32: dict[int, object]) -> None:
    """Without the scheduler the device lane ends elsewhere: the parity above depends on the current lr."""
    ref = vanilla_fp32[1]
    assert len(set(ref.lrs)) == len(ref.lrs), "the schedule must change the lr every step"
    constant = train("device", steps=6, clip=CLIP, model=TinyLM(schedule=False))
    assert rel(constant.masters, ref.masters) > 1e-3


def test_clipping_is_active(vanilla_fp32: dict[int, object]) -> None:
    unclipped = train(None, steps=6, clip=None)
    assert rel(unclipped.masters, vanilla_fp32[1].masters) > 1e-4


def test_random_plan_every_step_matches_vanilla(vanilla_fp32: dict[int, object]) -> None:
    cb = RandomPlanEveryStep()
    run = train("host", steps=6, clip=CLIP, every_step=cb)
    assert len(set(cb.seen)) > 1
    ref = vanilla_fp32[1]
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= FP32_TOL * abs(b)
    assert rel(run.masters, ref.masters) <= FP32_TOL
    # each host lane ran in its plan's order, and some of those orders were not ascending
    records = run.strategy.manager.records
    for record in records:
        host = sorted((e for e in record.timings.events if e["lane"] == "host"), key=lambda e: e["adam"][0])
        assert tuple(e["subgroup"] for e in host) == record.plan.host_order
    assert any(list(r.plan.host_order) != sorted(r.plan.host_order) for r in records)


def test_bf16_losses_track_vanilla_over_30_steps() -> None:
    ref = train(None, steps=30, precision="bf16-mixed", clip=CLIP)
    for plan in ("device", 0.5, RANDOM_LIST):
        run = train(plan, steps=30, precision="bf16-mixed", clip=CLIP)
        diffs = [abs(a - b) for a, b in zip(run.losses, ref.losses)]
        assert max(diffs) <= 1e-2, f"plan {plan}: max loss difference {max(diffs)}"
        # 16-bit params are written in their own dtype
        assert run.strategy.model.optimizer.fp16_partitioned_groups_flat[0].dtype == torch.bfloat16


def test_device_lane_gradients_stay_on_the_device() -> None:
    """Without accumulation a device-lane subgroup's gradient never visits the host: 12 bytes/param prefetched."""
    run = train("device", steps=2, clip=CLIP)
    for record in run.strategy.manager.records:
        assert record.timings.device_params > 0
        assert record.timings.h2d_bytes == 12 * record.timings.device_params
    # the host buffers of device-lane gradients were never written
    opt = run.strategy.model.optimizer
    assert all(float(m.grad.abs().sum()) == 0.0 for m in opt.fp32_partitioned_groups_flat)
    # with accumulation vanilla's gradient path runs: every gradient reaches the host and is prefetched
    acc = train("device", steps=2, accumulate=2, clip=CLIP)
    for record in acc.strategy.manager.records:
        assert record.timings.h2d_bytes == 16 * record.timings.device_params


def test_parity_without_clipping_skips_the_unit_unscale() -> None:
    """No clipping and no loss scale: the factor is exactly 1 and the unscale pass is skipped, same result."""
    ref = train(None, steps=4, clip=None)
    run = train(0.5, steps=4, clip=None)
    for a, b in zip(run.losses, ref.losses):
        assert abs(a - b) <= FP32_TOL * abs(b)
    assert rel(run.masters, ref.masters) <= FP32_TOL


class _KeptGradDtypes(pl.Callback):
    """Records the dtypes of the gradients kept on the device when the update phase is about to run; with
    ``to_host`` it sends every gradient to the host instead (decided before each backward, as the manager does)."""

    def __init__(self, to_host: bool = False) -> None:
        self.to_host = to_host
        self.dtypes: list[set[torch.dtype]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, idx: int) -> None:
        if self.to_host:  # every subgroup lives on the host here, from the start: each has its host gradient
            trainer.strategy.manager.device_grad_subgroups = frozenset()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: object, optimizer: object) -> None:
        self.dtypes.append({g.dtype for g in trainer.strategy.model.optimizer._device_grads().values()})


def test_bf16_gradients_kept_on_the_device_in_16_bits_give_the_same_update_as_via_the_host() -> None:
    """A bf16 run keeps device-lane gradients in bf16 (2 bytes/param, what the planner budgets) and widens them
    in the slot: the masters are bit-identical to the same run with every gradient sent to the host (in bf16 there
    too, prefetched as it is and widened in the slot)."""
    kept_cb, host_cb = _KeptGradDtypes(), _KeptGradDtypes(to_host=True)
    kept = train("device", steps=3, precision="bf16-mixed", clip=CLIP, every_step=kept_cb)
    via_host = train("device", steps=3, precision="bf16-mixed", clip=CLIP, every_step=host_cb)
    assert kept_cb.dtypes == [{torch.bfloat16}] * 3 and host_cb.dtypes == [set()] * 3
    manager = kept.strategy.manager
    assert manager.cost.device_grad_bytes_per_param == 2
    for a, b in zip(manager.records, via_host.strategy.manager.records):
        assert a.timings.h2d_bytes == 12 * a.timings.device_params  # kept: no gradient prefetched
        assert b.timings.h2d_bytes == 14 * b.timings.device_params  # the state and a bf16 gradient
    assert kept.losses == via_host.losses
    assert torch.equal(kept.masters, via_host.masters)
    assert rel(kept.masters, train_init_masters()) > 1e-3  # the weights did change


def test_fp32_gradients_are_kept_in_fp32() -> None:
    """Gradients that accumulate in fp32 (a 32-true run) are kept as they are: 4 bytes/param budgeted."""
    cb = _KeptGradDtypes()
    run = train("device", steps=1, clip=CLIP, every_step=cb)
    assert cb.dtypes == [{torch.float32}]
    assert run.strategy.manager.cost.device_grad_bytes_per_param == 4


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("plan", ["device", RANDOM_LIST], ids=_ids)
def test_subgroups_through_the_slots_in_pieces_train_bit_identically(
        plan: object, precision: str, overlap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device lane's pieces (384 MB of state on a real run; 128 parameters here, so every subgroup of the tiny
    model is several) through DeepSpeed, serial and overlapped: the same losses and masters, bit for bit, as whole
    subgroups per slot without overlap."""
    import lightning_dos.update.device_lane as device_lane

    whole = train(plan, steps=4, precision=precision, clip=CLIP)
    monkeypatch.setattr(device_lane, "PIECE", 128)
    pieces = train(plan, steps=4, precision=precision, clip=CLIP, strategy=make_strategy(plan, overlap=overlap))
    sizes = pieces.strategy.manager.subgroup_sizes
    assert max(sizes) > 2 * 128  # the largest subgroup went through in at least three pieces
    assert pieces.losses == whole.losses
    assert torch.equal(pieces.masters, whole.masters)
    slots = [r.timings.device_buffer_bytes for r in pieces.strategy.manager.records if r.timings.device_params]
    assert slots and max(slots) < min(r.timings.device_buffer_bytes for r in whole.strategy.manager.records
                                      if r.timings.device_params)


@pytest.mark.parametrize("plan", ["host", "device"])
def test_the_users_lr_scheduler_sees_the_optimizer_step(plan: str) -> None:
    """The update phase steps no client optimizer, but the user's LR scheduler (stepped every iteration) must not warn
    that it was stepped before the optimizer, as it does not under vanilla ZeRO-3 offload."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(plan, steps=2)
    assert not [w for w in caught if "before `optimizer.step()`" in str(w.message)]


def test_deepspeeds_gradient_readers_widen_the_16_bit_host_gradients() -> None:
    """DeepSpeed's readers of the fp32 gradient partitions (``safe_get_full_grad``, ``get_fp32_grad_partitions``) read
    a bf16 host home's gradient widened: fp32, the same values."""
    from deepspeed.utils import safe_get_full_grad

    run = train("host", steps=2, precision="bf16-mixed", clip=CLIP)
    opt = run.strategy.model.optimizer
    assert {opt.update_grad(i).dtype for i in range(len(opt.fp16_groups))} == {torch.bfloat16}
    partitions = opt.get_fp32_grad_partitions()
    checked = 0
    for group in opt.fp16_groups:
        for param_idx, param in enumerate(group):
            i, offset, numel = opt.grad_position[opt.get_param_id(param)]
            host = opt.update_grad(i).narrow(0, offset, numel).float()
            assert partitions[i][param_idx].dtype == torch.float32 and torch.equal(partitions[i][param_idx], host)
            full = safe_get_full_grad(param)
            assert full.dtype == torch.float32 and torch.equal(full.reshape(-1)[:numel], host)
            checked += 1
    assert checked == sum(len(g) for g in opt.fp16_groups) > 0
    assert any(float(opt.update_grad(i).float().abs().sum()) > 0 for i in range(len(opt.fp16_groups)))
