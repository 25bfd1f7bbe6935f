"""One home per subgroup, through DeepSpeed and Lightning: nothing is allocated for the optimizer state before the
first update boundary; then each subgroup's master, moments and (on the host) fp32 gradient exist exactly once, where
it lives; residents (``resident_gib``, a number or ``"auto"``) have no host copy and update exactly; checkpoints save
and resume from wherever the state lives; the memory plan refuses a run the box cannot hold before anything is
allocated for it.

On this CPU machine the host stands in for the device, so both homes are host memory: what is checked here is that
each subgroup's state is one set of tensors in the home the plan gave it, and that every run is exact. ``auto`` has no
device memory to read here, so the runs that need residents hand the manager a device-memory reading (what
``torch.cuda`` gives on a GPU host). Every run has clipping and an lr that changes at every step.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.planning.placement import (
    GIB,
    DeviceMemory,
    DoesNotFit,
    Home,
    HostMemory,
    resident_room,
    slot_bytes,
)
from lightning_dos.update import manager as manager_module
from lightning_dos.update.manager import OptimizerStateManager
from tests.support.homes import RESIDENT, ReadAndWrite, SaveAfter
from tests.support.parity import RandomPlanEveryStep, assert_tracks, make_strategy, shared_run, train

CLIP = 0.05
TOL = 1e-5
#: A device far larger than the tiny model: only a budget decides how many subgroups fit.
HUGE = DeviceMemory(total=1024 * GIB, peak=0, other=0)


@pytest.fixture(scope="module")
def sizes() -> list[int]:
    return train("host", steps=1, clip=CLIP).strategy.manager.subgroup_sizes


@pytest.fixture(scope="module")
def gib(sizes: list[int]) -> float:
    """``resident_gib`` with room for the first ``RESIDENT`` subgroups of the tiny model, and not one parameter more."""
    return 12 * sum(sizes[:RESIDENT]) / GIB


@pytest.fixture(scope="module")
def vanilla() -> dict[int, Any]:
    return {acc: shared_run(None, steps=6, accumulate=acc, clip=CLIP) for acc in (1, 2)}


def _reading_for(sizes: list[int], n: int, peak: int | None = None) -> DeviceMemory:
    """A small device with room for the first ``n`` subgroups' state beside the peak, the headroom and two slots, and
    no more. The peak holds every gradient (fp32 on this CPU tier, 4 bytes a parameter), as after a first backward;
    ``peak=0`` is the reading at start, where a resident subgroup also needs room for its gradient. (A budget would
    choose the same residents, but under a budget the dispatch demotes device-lane subgroups by the calibrated model,
    from measured timings: two runs would not run the same lanes, so bitwise comparisons use a reading.)"""
    if peak == 0:
        return DeviceMemory(total=2 * GIB + slot_bytes(sizes) + 16 * sum(sizes[:n]), peak=0, other=0)
    grads = 4 * sum(sizes)
    return DeviceMemory(total=2 * GIB + grads + slot_bytes(sizes) + 12 * sum(sizes[:n]), peak=grads, other=0)


def _read_as(memory: DeviceMemory | None, at_start: DeviceMemory | None = HUGE) -> Any:
    """``OptimizerStateManager.device_memory`` reading ``at_start`` when the engine is built (where the device could
    hold every subgroup: all are candidates), then ``memory``, as after the first forward and backward."""
    return lambda self: memory if self.memory_plans else at_start


def _auto(plan: Any, **kwargs: Any) -> Any:
    """The strategy with ``resident_gib="auto"`` (the tests' ``make_strategy`` keeps none resident: its control)."""
    return make_strategy(plan, resident_gib="auto", **kwargs)


def _state_tensors(optimizer: Any, i: int) -> list[torch.Tensor]:
    master = optimizer.fp32_partitioned_groups_flat[i]
    state = optimizer.optimizer.state.get(master, {})
    return [t for t in (master, state.get("exp_avg"), state.get("exp_avg_sq"), master.grad) if t is not None]


class _BeforeTheFirstStep(pl.Callback):
    """What exists of the optimizer state once the engine is built and before the first update boundary."""

    def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step == 0:
            opt = trainer.strategy.model.optimizer
            self.masters = [m.numel() for m in opt.fp32_partitioned_groups_flat]
            self.state = len(opt.optimizer.state)
            self.early = [opt.update_grad(i) for i in range(len(self.masters))]
            self.grads = [None if g is None else g.numel() for g in self.early]
            self.held = opt.home_bytes()[Home.HOST]
            self.flat = opt.grad_partitions_flat_buffer.numel()
            self.homes = opt.homes()
            self.kept = trainer.strategy.manager.device_grad_subgroups
            self.candidates = trainer.strategy.manager.candidates


# ---------------------------------------------------------------------------------------------- one home
def test_no_state_exists_where_it_will_not_live_and_each_subgroup_once(sizes: list[int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """At start the device could hold the first few subgroups (the candidates): they get nothing until the first
    dispatch, and their gradients stay on the device through the first backward; the others can never be resident:
    they get only the host gradient that backward writes. After the first step's peak, the candidates that fit are
    resident (no host copy, no host gradient), every other subgroup gets its host home, the others keeping the
    gradient made at start."""
    n = len(sizes)
    candidates, resident = RESIDENT + 1, RESIDENT
    monkeypatch.setattr(OptimizerStateManager, "device_memory",
                        _read_as(_reading_for(sizes, resident), at_start=_reading_for(sizes, candidates, peak=0)))
    seen = _BeforeTheFirstStep()
    run = train("host", steps=2, clip=CLIP, strategy=_auto("host"), every_step=seen)
    opt = run.strategy.model.optimizer
    assert seen.homes == (None,) * n and seen.masters == [0] * n and seen.state == 0  # placeholders, no moments
    assert seen.grads == [None] * candidates + sizes[candidates:]  # a host gradient for those that live there
    assert seen.held == 4 * sum(sizes[candidates:])  # all this rank holds on the host (fp32 gradients on this tier)
    assert seen.flat == 0  # no whole-partition host gradient buffer without accumulation
    assert set(range(candidates)) <= seen.kept  # the first backward keeps the candidates' gradients on the device
    assert opt.homes() == (Home.DEVICE,) * resident + (Home.HOST,) * (n - resident)
    assert all(opt.update_grad(i) is seen.early[i] for i in range(candidates, n))  # placement kept them
    storages: dict[int, int] = {}
    for i in range(n):
        tensors = _state_tensors(opt, i)
        assert len(tensors) == (3 if i < resident else 4)  # a resident subgroup has no fp32 host gradient
        assert all(t.numel() == sizes[i] and t.dtype == torch.float32 for t in tensors)
        for t in tensors:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    on_device, on_host = sum(sizes[:resident]), sum(sizes[resident:])
    assert sum(storages.values()) == 12 * on_device + 16 * on_host  # each tensor once: no twins, no host copies
    assert opt.home_bytes() == {Home.DEVICE: 12 * on_device, Home.HOST: 16 * on_host}
    assert run.strategy.manager.metrics()["dos/host_state_gib"] == pytest.approx(16 * on_host / GIB)
    plans = run.strategy.manager.memory_plans
    assert [p.placement.resident for p in plans] == [tuple(range(candidates)), tuple(range(resident))]


def test_the_executor_works_on_the_optimizers_own_tensors(gib: float) -> None:
    run = train(0.5, steps=2, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib))
    opt = run.strategy.model.optimizer
    for sg, master in zip(opt.subgroups(), opt.fp32_partitioned_groups_flat):
        state = opt.optimizer.state[master]
        assert sg.master is master and sg.exp_avg is state["exp_avg"] and sg.exp_avg_sq is state["exp_avg_sq"]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}  # nothing else in DeepSpeed's state dict


# ---------------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("plan", ["host", "device", 0.5, "auto"], ids=str)
def test_every_plan_with_resident_subgroups_matches_vanilla(plan: Any, accumulate: int, gib: float, sizes: list[int],
                                                            vanilla: dict[int, Any]) -> None:
    run = train(plan, steps=6, accumulate=accumulate, clip=CLIP, strategy=make_strategy(plan, resident_gib=gib))
    assert_tracks(run, vanilla[accumulate], TOL)
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT))
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


def test_overlap_with_resident_subgroups_is_bit_identical_to_without_overlap(gib: float,
                                                                            vanilla: dict[int, Any]) -> None:
    run = train(0.5, steps=6, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib, overlap=True))
    serial = train(0.5, steps=6, clip=CLIP, strategy=make_strategy(0.5, resident_gib=gib))
    assert run.losses == serial.losses
    assert torch.equal(run.masters, serial.masters)
    assert_tracks(run, vanilla[1], TOL)


def test_deepspeeds_readers_and_writers_reach_the_state_where_it_lives(gib: float) -> None:
    """Against the same run without residents (all on the device lane, the same arithmetic): the same values read
    mid-run, and the same run after a write."""
    runs = {}
    for name, kwargs in (("resident", {"resident_gib": gib}), ("device", {})):
        cb = ReadAndWrite()
        runs[name] = (train("device", steps=5, clip=CLIP, strategy=make_strategy("device", **kwargs), every_step=cb),
                      cb)
    (run, cb), (ref, ref_cb) = runs["resident"], runs["device"]
    assert len(cb.read) == len(ref_cb.read) > 0
    assert all(torch.equal(a, b) for a, b in zip(cb.read, ref_cb.read))
    assert run.losses == ref.losses  # the write reached the resident state: the runs go on alike
    assert torch.equal(run.masters, ref.masters)


@pytest.mark.parametrize("bad", [-1, "4", True, float("inf"), float("nan")])
def test_resident_gib_must_be_a_size(bad: Any) -> None:
    with pytest.raises(ValueError, match="resident_gib: .* is not a size"):
        DeepOptimizerStatesStrategy(resident_gib=bad)


# ---------------------------------------------------------------------------------------------- auto
def test_auto_is_the_default_and_keeps_nothing_where_the_host_stands_in(vanilla: dict[int, Any]) -> None:
    assert DeepOptimizerStatesStrategy().resident_gib == "auto"
    run = train(0.5, steps=3, clip=CLIP, strategy=_auto(0.5))
    manager = run.strategy.manager
    assert manager.resident_auto and manager.placement is not None and manager.placement.memory is None
    assert manager.resident == () and manager.executor.resident is None


@pytest.mark.parametrize("plan", ["host", "device", 0.5, "auto"], ids=str)
def test_auto_keeps_what_fits_and_runs_exactly_as_residents_set_by_hand(plan: Any, sizes: list[int],
                                                                        vanilla: dict[int, Any],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    reading = _reading_for(sizes, RESIDENT)
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(reading))
    run = train(plan, steps=6, clip=CLIP, strategy=_auto(plan))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT)) and manager.placement.resident == manager.resident
    # the device lane gets what the measured peak left beside the residents (here its two slots), not the memory
    # free at a dispatch, which the next forward and backward take back
    assert manager.lane_budget_bytes == resident_room(reading, slot_bytes=0) - 12 * sum(sizes[:RESIDENT])
    assert manager.lane_budget_bytes == slot_bytes(sizes)
    assert_tracks(run, vanilla[1], TOL)
    kept = sum(sizes[:RESIDENT])
    assert all(r.timings.resident_params == kept for r in manager.records)  # from the first update phase on
    assert manager.metrics()["dos/resident_gib"] == pytest.approx(12 * kept / GIB)
    assert "after the first forward and backward" in manager.memory_plans[-1].when
    if plan == "auto":
        return  # auto's plans follow measured timings: two runs need not choose alike, so no bitwise comparison
    by_hand = train(plan, steps=6, clip=CLIP, strategy=make_strategy(plan, resident_gib=12 * kept / GIB))
    assert by_hand.strategy.manager.resident == manager.resident
    assert run.losses == by_hand.losses and torch.equal(run.masters, by_hand.masters)


def test_auto_overlapped_with_a_random_plan_every_step_is_exact(sizes: list[int], vanilla: dict[int, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    runs = [train("host", steps=6, clip=CLIP, every_step=RandomPlanEveryStep(seed=5),
                  strategy=_auto("host", overlap=overlap)) for overlap in (True, False)]
    assert runs[0].strategy.manager.overlap and runs[0].strategy.manager.resident == tuple(range(RESIDENT))
    assert runs[0].losses == runs[1].losses and torch.equal(runs[0].masters, runs[1].masters)
    assert_tracks(runs[0], vanilla[1], TOL)


def test_every_subgroup_resident_leaves_both_lanes_empty_and_the_host_without_state(
        vanilla: dict[int, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(HUGE))
    run = train("auto", steps=6, clip=CLIP, strategy=_auto("auto"))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(len(manager.subgroup_sizes)))
    assert all(r.timings.host_params == r.timings.device_params == 0 for r in manager.records)
    assert run.strategy.model.optimizer.home_bytes()[Home.HOST] == 0
    assert_tracks(run, vanilla[1], TOL)


def test_the_budget_covers_the_residents_and_leaves_the_rest_to_the_device_lane(
        sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(HUGE))
    budget = (slot_bytes(sizes) + 12 * sum(sizes[:RESIDENT])) / GIB
    run = train("device", steps=4, clip=CLIP, strategy=_auto("device", memory_budget_gib=budget))
    manager = run.strategy.manager
    assert manager.resident == tuple(range(RESIDENT))
    assert manager.lane_budget_bytes == int(budget * GIB) - 12 * sum(sizes[:RESIDENT])
    assert_tracks(run, shared_run(None, steps=4, clip=CLIP), TOL)


def test_resident_gib_above_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="resident_gib: 4.0 GiB is more than memory_budget_gib"):
        DeepOptimizerStatesStrategy(resident_gib=4.0, memory_budget_gib=2)


# ---------------------------------------------------------------------------------------------- under pressure
def _pressure_at_the_third_dispatch(monkeypatch: pytest.MonkeyPatch, memory: DeviceMemory) -> None:
    free = {1: memory.headroom // 2, 2: memory.headroom // 2 - 1}  # by update phases recorded before the dispatch

    def free_device_bytes(self: OptimizerStateManager) -> int | None:
        return free.get(len(self.records))

    monkeypatch.setattr(OptimizerStateManager, "free_device_bytes", free_device_bytes)


def test_under_memory_pressure_residents_move_to_the_host_exactly(sizes: list[int], vanilla: dict[int, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """At the third dispatch the device has less free than half the headroom: residents go to the host, newest first,
    until the headroom would be free (here, the tiny model's subgroups being far smaller than the 2 GiB headroom, all
    of them); their state moves into host homes and the run goes on exactly. At the second dispatch, just above half
    the headroom, nothing moves."""
    memory = _reading_for(sizes, RESIDENT)
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(memory))
    _pressure_at_the_third_dispatch(monkeypatch, memory)
    run = train("host", steps=6, clip=CLIP, strategy=_auto("host"))
    manager = run.strategy.manager
    assert manager.released == tuple(reversed(range(RESIDENT))) and manager.resident == ()
    assert manager.executor.resident is None
    assert run.strategy.model.optimizer.homes() == (Home.HOST,) * len(sizes)
    assert run.strategy.model.optimizer.home_bytes()[Home.HOST] == 16 * sum(sizes)
    kept = [r.timings.resident_params for r in manager.records]
    assert kept == [sum(sizes[:RESIDENT])] * 2 + [0] * 4
    assert all(r.timings.host_params == sum(sizes) for r in manager.records[2:])  # back in the host lane
    assert_tracks(run, vanilla[1], TOL)


def test_under_pressure_without_host_room_the_run_stops_with_the_numbers(sizes: list[int],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    memory = _reading_for(sizes, RESIDENT)
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(memory))
    _pressure_at_the_third_dispatch(monkeypatch, memory)
    readings = iter([HostMemory(total=8 * GIB, available=8 * GIB)] * 2)  # at start and at placement: room enough
    reserve = HostMemory(total=8 * GIB, available=0).reserve
    short = HostMemory(total=8 * GIB, available=reserve + 16 * sum(sizes[:RESIDENT]) - 1)  # then: not for residents

    def host_memory(self: OptimizerStateManager) -> HostMemory:
        return next(readings, short)

    monkeypatch.setattr(OptimizerStateManager, "host_memory", host_memory)
    with pytest.raises(DoesNotFit, match=r"would go back to the host, which needs .* GiB for them"):
        train("host", steps=6, clip=CLIP, strategy=_auto("host"))


# ---------------------------------------------------------------------------------------------- the box
def test_a_run_the_host_cannot_hold_stops_before_its_state_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan at start: even with every subgroup the device could hold resident (none here: the host stands in),
    the host has no room: the run stops when the engine is built, before any update, naming the numbers."""
    monkeypatch.setattr(OptimizerStateManager, "host_memory", lambda self: HostMemory(total=GIB, available=0))
    with pytest.raises(DoesNotFit) as caught:
        train("host", steps=2, clip=CLIP)
    message = str(caught.value)
    assert "before the first step" in message and "the host needs" in message and "may take 0.00 GiB" in message


def test_under_accumulation_nothing_is_made_before_the_first_boundary_and_the_run_tracks_vanilla(
        sizes: list[int], vanilla: dict[int, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradients accumulating over two micro-batches: DeepSpeed's whole-partition buffer takes every gradient, so at
    start no subgroup gets anything, not even the ones that can never be resident; the first boundary places them all
    (those on the host with the fp32 gradient its copy writes) and the run tracks vanilla."""
    monkeypatch.setattr(OptimizerStateManager, "device_memory",
                        _read_as(_reading_for(sizes, RESIDENT), at_start=_reading_for(sizes, 2, peak=0)))
    seen = _BeforeTheFirstStep()
    run = train("host", steps=6, accumulate=2, clip=CLIP, strategy=_auto("host"), every_step=seen)
    assert 0 < len(seen.candidates) < len(sizes)  # some subgroups could never be resident
    assert seen.homes == (None,) * len(sizes) and seen.grads == [None] * len(sizes) and seen.held == 0
    assert seen.flat == sum(sizes)  # the whole-partition buffer, as vanilla's
    opt, resident = run.strategy.model.optimizer, run.strategy.manager.resident
    assert resident and set(resident) <= set(seen.candidates)  # residents among the candidates only
    assert opt.homes() == tuple(Home.DEVICE if i in resident else Home.HOST for i in range(len(sizes)))
    assert all(opt.update_grad(i).dtype == torch.float32 for i in range(len(sizes)))
    assert_tracks(run, vanilla[2], TOL)


def test_the_host_gradients_made_at_start_count_as_held_when_the_rest_are_placed(
        sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with room for every subgroup's state and no more: at start the subgroups beyond the candidates get their
    host gradients, which the host then shows in use; at the first dispatch they get their masters and moments and the
    candidates that do not fit join them. The plan counts what is held as the rank's own, not as missing room, and the
    run trains."""
    in_use = [0]
    host_memory = OptimizerStateManager.host_memory

    def reading(self: OptimizerStateManager) -> HostMemory | None:
        in_use[0] = self.optimizer.home_bytes()[Home.HOST]
        return host_memory(self)

    total = 8 * GIB
    available = HostMemory(total=total, available=0).reserve + 16 * sum(sizes)
    monkeypatch.setattr(OptimizerStateManager, "host_memory", reading)
    monkeypatch.setattr(manager_module, "read_meminfo", lambda: (total, available - in_use[0]))
    monkeypatch.setattr(OptimizerStateManager, "device_memory",
                        _read_as(_reading_for(sizes, 1), at_start=_reading_for(sizes, RESIDENT, peak=0)))
    run = train("host", steps=3, clip=CLIP, strategy=_auto("host"))
    manager = run.strategy.manager
    start, placed = manager.memory_plans[0], manager.memory_plans[-1]
    assert start.placement.resident == tuple(range(RESIDENT)) and placed.host.held == 4 * sum(sizes[RESIDENT:])
    assert manager.resident == (0,) and placed.fits
    assert run.strategy.model.optimizer.home_bytes()[Home.HOST] == 16 * sum(sizes[1:])


@pytest.mark.parametrize("candidates", [None, RESIDENT], ids=["all-candidates", "some-never-resident"])
def test_a_run_that_fits_at_start_but_not_beside_the_measured_peak_stops_before_placing(
        sizes: list[int], candidates: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """At start the device could hold every subgroup (the host would hold nothing), or the first few (the host all
    the state the rest need); the first step's peak leaves room for no resident, and the host cannot take every
    subgroup: the run stops at the first dispatch, before any home is made, with only the host gradients of the
    subgroups that could never be resident allocated, and the error says how much."""
    full = DeviceMemory(total=4 * GIB, peak=4 * GIB, other=0)  # after the first step: the peak fills the device
    at_start = HUGE if candidates is None else _reading_for(sizes, candidates, peak=0)
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(full, at_start=at_start))
    reserve = HostMemory(total=8 * GIB, available=0).reserve

    def host(self: OptimizerStateManager) -> HostMemory:  # one byte short of every subgroup's state
        held = self.optimizer.home_bytes()[Home.HOST]
        return HostMemory(total=8 * GIB, available=reserve + 16 * sum(sizes) - 1 - held, held=held)

    monkeypatch.setattr(OptimizerStateManager, "host_memory", host)
    seen: list[Any] = []

    class Watch(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, *_: Any) -> None:
            seen.append(trainer.strategy.model.optimizer)

    with pytest.raises(DoesNotFit, match="after the first forward and backward") as caught:
        train("host", steps=2, clip=CLIP, strategy=_auto("host"), every_step=Watch())
    opt, grads = seen[0], 0 if candidates is None else 4 * sum(sizes[candidates:])
    assert opt.homes() == (None,) * len(sizes) and not opt.optimizer.state  # nothing placed: no master, no moment
    assert [m.numel() for m in opt.fp32_partitioned_groups_flat] == [0] * len(sizes)
    assert opt.home_bytes() == {Home.DEVICE: 0, Home.HOST: grads}
    made = (f"beyond the {grads / GIB:.2f} GiB of host gradients made for its first backward" if grads else
            "nothing was allocated for its optimizer state.")
    assert made in str(caught.value)


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_a_checkpoint_with_residents_resumes_to_the_uninterrupted_run(tmp_path: Any, gib: float,
                                                                       overlap: bool) -> None:
    strategy = lambda: make_strategy(0.5, resident_gib=gib, overlap=overlap)  # noqa: E731
    full = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=strategy())
    path = str(tmp_path / "mid.ckpt")
    train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=strategy(), every_step=SaveAfter(path, 3))
    resumed = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=strategy(), ckpt_path=path)
    assert resumed.losses == full.losses[3:]
    assert torch.equal(resumed.masters, full.masters)


def test_a_checkpoint_resumes_under_another_placement(tmp_path: Any, sizes: list[int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the device lane, whose fused Adam is the residents' own (bit for bit), a checkpoint written mid-run with
    residents chosen by ``auto`` resumes to the uninterrupted run with residents chosen again, with none, and with
    every subgroup resident; one written with none resumes with residents."""
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    full = train("device", steps=6, epoch_batches=3, clip=CLIP, strategy=_auto("device"))
    assert full.strategy.manager.resident == tuple(range(RESIDENT))
    with_residents, without = str(tmp_path / "with.ckpt"), str(tmp_path / "without.ckpt")
    train("device", steps=6, epoch_batches=3, clip=CLIP, strategy=_auto("device"),
          every_step=SaveAfter(with_residents, 3))
    train("device", steps=6, epoch_batches=3, clip=CLIP, strategy=make_strategy("device"),
          every_step=SaveAfter(without, 3))
    every = 12 * sum(sizes) / GIB
    for path, resident, expected in ((with_residents, "auto", RESIDENT), (with_residents, 0, 0),
                                     (with_residents, every, len(sizes)), (without, "auto", RESIDENT)):
        resumed = train("device", steps=6, epoch_batches=3, clip=CLIP, ckpt_path=path,
                        strategy=make_strategy("device", resident_gib=resident))
        assert len(resumed.strategy.manager.resident) == expected
        assert resumed.losses == full.losses[3:]
        assert torch.equal(resumed.masters, full.masters)


class _AtTheFirstBatch(pl.Callback):
    """At a resumed run's first batch (loaded, not placed yet): each subgroup's master and moments are the loaded
    tensors themselves, with no home."""

    def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if not hasattr(self, "homes"):
            opt = trainer.strategy.model.optimizer
            self.homes = opt.homes()
            self.loaded = [m.numel() for m in opt.fp32_partitioned_groups_flat]
            self.moments = [len(opt.optimizer.state.get(m, {})) for m in opt.fp32_partitioned_groups_flat]


def test_a_checkpoint_loaded_before_placement_waits_in_its_loaded_tensors(tmp_path: Any, sizes: list[int],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed with every subgroup a candidate (none placed at start): each keeps the loaded tensors until the first
    dispatch places it."""
    monkeypatch.setattr(OptimizerStateManager, "device_memory", _read_as(_reading_for(sizes, RESIDENT)))
    path = str(tmp_path / "mid.ckpt")
    full = train(0.5, steps=4, epoch_batches=2, clip=CLIP, strategy=_auto(0.5, overlap=False))
    train(0.5, steps=4, epoch_batches=2, clip=CLIP, strategy=_auto(0.5, overlap=False), every_step=SaveAfter(path, 2))
    seen = _AtTheFirstBatch()
    resumed = train(0.5, steps=4, epoch_batches=2, clip=CLIP, ckpt_path=path, every_step=seen,
                    strategy=_auto(0.5, overlap=False))
    assert resumed.losses == full.losses[2:] and torch.equal(resumed.masters, full.masters)
    assert seen.homes == (None,) * len(sizes)
    assert seen.loaded == sizes and all(n == 3 for n in seen.moments)  # step, exp_avg, exp_avg_sq: loaded
    opt = resumed.strategy.model.optimizer
    assert opt.homes() == (Home.DEVICE,) * RESIDENT + (Home.HOST,) * (len(sizes) - RESIDENT)
