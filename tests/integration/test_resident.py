"""``resident_gib``: subgroups whose optimizer state stays on the device for the whole run, in neither lane.

On this CPU machine the host stands in for the device, so the resident copies are host tensors beside the homes: a
reader that saw a home before it was written, or an update that ran from a home a write had replaced, shows up as a
difference from the run without residents. Every run has clipping active and an lr that changes at every step.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.planning.planner import resident_subgroups
from tests.support.parity import assert_tracks, make_strategy, shared_run, train

CLIP = 0.05
TOL = 1e-5
GIB = 1024**3
RESIDENT = 3  # subgroups kept resident in these runs (the tiny model has more than that)


def _resident_gib(plan: Any = "host") -> float:
    """Room for the first ``RESIDENT`` subgroups of the tiny model, and not one parameter more."""
    sizes = train(plan, steps=1, clip=CLIP).strategy.manager.subgroup_sizes
    return 12 * sum(sizes[:RESIDENT]) / GIB


@pytest.fixture(scope="module")
def gib() -> float:
    return _resident_gib()


@pytest.fixture(scope="module")
def vanilla() -> dict[int, Any]:
    return {acc: shared_run(None, steps=6, accumulate=acc, clip=CLIP) for acc in (1, 2)}


def test_resident_subgroups_fill_the_budget_in_id_order() -> None:
    assert resident_subgroups([10, 20, 30, 5], 12 * 30) == (0, 1)
    assert resident_subgroups([10, 20, 30, 5], 12 * 35) == (0, 1, 3)  # 30 no longer fits; 5 still does
    assert resident_subgroups([10, 20], 0) == ()
    assert resident_subgroups([0, 10], 12 * 10) == (1,)  # an empty subgroup is nothing to keep


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("plan", ["host", "device", 0.5, "auto"], ids=str)
def test_every_plan_with_resident_subgroups_matches_vanilla(plan: Any, accumulate: int, gib: float,
                                                            vanilla: dict[int, Any]) -> None:
    run = train(plan, steps=6, accumulate=accumulate, clip=CLIP,
                strategy=make_strategy(plan, resident_gib=gib))
    assert_tracks(run, vanilla[accumulate], TOL)
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT))
    sizes = manager.subgroup_sizes
    kept = sum(sizes[:RESIDENT])
    assert len(manager.records) == 6
    for record in manager.records:
        t = record.timings
        assert t.resident_params == kept
        assert t.host_params + t.device_params == sum(sizes) - kept  # no resident subgroup in either lane
        per_param = 12 if accumulate == 1 else 16  # the device lane's state, and its gradient under accumulation
        assert t.h2d_bytes == per_param * t.device_params and t.d2h_bytes == 12 * t.device_params
    assert "resident on the device" in manager.describe()


def test_resident_subgroups_update_exactly_as_the_device_lane_does(gib: float,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fused Adam on the same values: bit for bit the device lane's result, also in chunks."""
    import lightning_dos.update.device_adam as device_adam

    ref = train("device", steps=5, clip=CLIP)
    # smaller than a subgroup, so several chunks each; a multiple of the vector width, as CHUNK is (a chunk edge
    # inside a vector would put its elements on the kernel's scalar tail: 100 gave a last-bit difference here)
    monkeypatch.setattr(device_adam, "CHUNK", 1024)
    run = train("device", steps=5, clip=CLIP, strategy=make_strategy("device", resident_gib=gib))
    assert run.losses == ref.losses
    assert torch.equal(run.masters, ref.masters)


def test_the_homes_are_stale_during_the_run_and_current_after_it(gib: float) -> None:
    """The point of residency: between steps nothing is written to the host. After ``fit`` the homes hold the
    run's state (the strategy writes them at the end of training)."""
    seen: list[bool] = []

    class Peek(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
            state = trainer.strategy.manager.executor.resident
            master = trainer.strategy.model.optimizer.fp32_partitioned_groups_flat[0]
            seen.append(torch.equal(master, state.blocks[0][0]))

    run = train("host", steps=3, clip=CLIP, strategy=make_strategy("host", resident_gib=gib), every_step=Peek())
    assert seen == [False, False, False]
    state = run.strategy.manager.executor.resident
    assert torch.equal(run.strategy.model.optimizer.fp32_partitioned_groups_flat[0], state.blocks[0][0])


def test_overlap_with_resident_subgroups_is_bit_identical_to_without_overlap(gib: float,
                                                                            vanilla: dict[int, Any]) -> None:
    run = train(0.5, steps=6, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib, overlap=True))
    serial = train(0.5, steps=6, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib))
    assert run.losses == serial.losses
    assert torch.equal(run.masters, serial.masters)
    assert_tracks(run, vanilla[1], TOL)


class _SaveAfter(pl.Callback):
    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_mid_run_holds_the_resident_state_and_resumes_to_the_uninterrupted_run(
        tmp_path: Any, gib: float) -> None:
    full = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib))
    path = str(tmp_path / "mid.ckpt")
    train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib),
          every_step=_SaveAfter(path, 3))
    resumed = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib),
                    ckpt_path=path)
    assert resumed.losses == full.losses[3:]
    assert torch.equal(resumed.masters, full.masters)


class _ReadAndWrite(pl.Callback):
    """At step 2: read every parameter's fp32 master and exp_avg through DeepSpeed's ``safe_get_*``, then scale
    the first parameter's master through ``safe_set_full_fp32_param``."""

    def __init__(self) -> None:
        self.read: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state, safe_set_full_fp32_param

        if trainer.global_step != 2:
            return
        params = [p for p in pl_module.parameters() if p.requires_grad]
        self.read = [safe_get_full_fp32_param(p).clone() for p in params]
        self.read += [safe_get_full_optimizer_state(p, "exp_avg").clone() for p in params]
        safe_set_full_fp32_param(params[0], safe_get_full_fp32_param(params[0]) * 0.5)


def test_deepspeeds_readers_see_the_resident_state_and_its_writers_reach_it(gib: float) -> None:
    """Against the same run without residents (all on the device lane, the same arithmetic): the same values read
    mid-run, and the same run after a write."""
    runs = {}
    for name, kwargs in (("resident", {"resident_gib": gib}), ("device", {})):
        cb = _ReadAndWrite()
        runs[name] = (train("device", steps=5, clip=CLIP, strategy=make_strategy("device", **kwargs), every_step=cb),
                      cb)
    (run, cb), (ref, ref_cb) = runs["resident"], runs["device"]
    assert len(cb.read) == len(ref_cb.read) > 0
    assert all(torch.equal(a, b) for a, b in zip(cb.read, ref_cb.read))
    assert run.losses == ref.losses  # the write reached the resident copy: the runs go on alike
    assert torch.equal(run.masters, ref.masters)


@pytest.mark.parametrize("bad", [-1, "4", True, float("inf"), float("nan")])
def test_resident_gib_must_be_a_size(bad: Any) -> None:
    with pytest.raises(ValueError, match="resident_gib: .* is not a size"):
        DeepOptimizerStatesStrategy(resident_gib=bad)
