"""``overlap=True``: the update phase runs on a worker thread beside the next forward and backward, exactly.

On this CPU machine the host stands in for the device, so the worker's writes of the 16-bit params are plain CPU
copies racing the training loop's forward: a missing gate is a real data race. Every run has clipping active and an
lr that changes at every step (``parity.train``), so a host lane that read the lr after the scheduler moved it, or a
forward that read a subgroup before its update landed, would drift from the control at once.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.strategies import dos as strategy_module
from lightning_dos.strategies.dos import overlap_by_default
from lightning_dos.telemetry.callbacks import DOSMetricsLogger
from lightning_dos.update.executor import UpdateExecutor
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.zero.cpu_adam_nogil import HostAdam
from lightning_dos.zero.optimizer import InterleavedZeroOptimizer
from tests.support.hold_subgroup import HANG_GUARD_S, HoldOneSubgroup
from tests.support.parity import RandomPlanEveryStep, TinyLM, assert_tracks, make_strategy, rel, shared_run, train

CLIP = 0.05
TOL = 1e-5
RANDOM_LIST = ["device", "host", "host", "device", "device"]
PLANS = ["host", "device", 0.5, "stride:2", RANDOM_LIST]


def _ids(plan: object) -> str:
    return "list" if isinstance(plan, list) else str(plan)


def _overlap(plan: Any) -> DeepOptimizerStatesStrategy:
    return make_strategy(plan, overlap=True)



def _assert_identical(run: Any, ref: Any) -> None:
    assert run.losses == ref.losses
    assert torch.equal(run.masters, ref.masters)


@pytest.fixture(scope="module")
def vanilla() -> Any:
    return shared_run(None, steps=6, clip=CLIP)


@pytest.mark.parametrize("plan", PLANS, ids=_ids)
def test_every_plan_matches_vanilla_and_is_bit_identical_to_no_overlap(plan: Any, vanilla: Any) -> None:
    run = train(plan, steps=6, clip=CLIP, strategy=_overlap(plan))
    assert_tracks(run, vanilla, TOL)
    _assert_identical(run, shared_run(plan, steps=6, clip=CLIP))  # test_parity.py's serial runs
    manager = run.strategy.manager
    assert manager.overlap and len(manager.records) == 6  # the last one recorded at the end of the run
    assert manager._in_flight is None and run.strategy.model.optimizer.in_flight is None
    assert rel(run.masters, _initial_masters()) > 1e-3  # the update did change the weights


def _initial_masters() -> torch.Tensor:
    model = TinyLM()
    model.configure_model()
    return torch.cat([p.detach().float().flatten() for p in model.net.parameters()])


def test_gradient_accumulation() -> None:
    """With 2 micro-batches per step the update overlaps the first micro-batch's forward; the boundary backward's
    copies into the host gradients (DeepSpeed's own accumulation path) wait for it."""
    run = train(0.5, steps=4, accumulate=2, clip=CLIP, strategy=_overlap(0.5))
    assert_tracks(run, train(None, steps=4, accumulate=2, clip=CLIP), TOL)
    _assert_identical(run, train(0.5, steps=4, accumulate=2, clip=CLIP))
    assert len(run.strategy.manager.records) == 4


class _ValTinyLM(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.val_losses: list[float] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_losses.append(float(self.training_step(batch, batch_idx)))


def test_validation_after_every_step() -> None:
    runs = {}
    for name, strategy in (("overlap", _overlap(0.5)), ("no_overlap", None), ("vanilla", make_strategy(None))):
        model = _ValTinyLM()
        runs[name] = (train(0.5, steps=4, clip=CLIP, strategy=strategy, model=model, val_batches=2), model)
    (run, model), (off, off_model), (ref, ref_model) = runs["overlap"], runs["no_overlap"], runs["vanilla"]
    assert len(model.val_losses) == 8
    assert model.val_losses == off_model.val_losses
    _assert_identical(run, off)
    assert_tracks(run, ref, TOL)
    for a, b in zip(model.val_losses, ref_model.val_losses):
        assert abs(a - b) <= TOL * abs(b)


class _SaveWithPhaseInFlight(pl.Callback):
    """Saves a checkpoint at the end of the first epoch, while the last step's update is still in flight (this
    callback runs before the strategy's own epoch-end join)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.in_flight_at_save: bool | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 0:
            self.in_flight_at_save = trainer.strategy.manager._in_flight is not None
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_mid_run_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    """6 steps in 2 epochs of 3; the checkpoint after the first epoch is saved with the third update in flight."""
    full = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=_overlap(0.5))
    saver = _SaveWithPhaseInFlight(tmp_path / "mid.ckpt")
    saving = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=_overlap(0.5), every_step=saver)
    assert saver.in_flight_at_save is True
    _assert_identical(saving, full)  # saving joined the update; it changed nothing
    resumed = train(0.5, steps=6, epoch_batches=3, clip=CLIP, strategy=_overlap(0.5),
                    ckpt_path=str(tmp_path / "mid.ckpt"))
    assert resumed.losses == full.losses[3:]
    assert torch.equal(resumed.masters, full.masters)


def test_a_plan_change_every_step(vanilla: Any) -> None:
    cb = RandomPlanEveryStep()
    run = train("host", steps=6, clip=CLIP, strategy=_overlap("host"), every_step=cb)
    assert len(set(cb.seen)) > 1
    assert_tracks(run, vanilla, TOL)
    _assert_identical(run, train("host", steps=6, clip=CLIP, every_step=RandomPlanEveryStep()))


def test_a_plan_change_every_step_over_40_steps_tracks_vanilla() -> None:
    """The long horizon on the CPU (the GPU tier runs 20 to 200 steps): 40 overlapped steps, a random plan each, with
    clipping and the per-step learning rate, against vanilla ZeRO-3 offload, every loss and the masters at 1e-5."""
    cb = RandomPlanEveryStep(seed=7)
    run = train("host", steps=40, clip=CLIP, strategy=_overlap("host"), every_step=cb)
    assert len(set(cb.seen)) > 5 and run.strategy.overlapped is True
    assert_tracks(run, train(None, steps=40, clip=CLIP), TOL)


def _sequential_gather(plan: Any, overlap: bool) -> DeepOptimizerStatesStrategy:
    """ZeRO-3's persistent parameters gathered one by one (``stage3_allgather_sequential``): at the end of each step
    the gather copies their partitions instead of viewing them, so it reads what the update writes."""
    config = DeepOptimizerStatesStrategy(plan=plan, sub_group_size=2000).config
    config["zero_optimization"]["stage3_allgather_sequential"] = True
    return DeepOptimizerStatesStrategy(plan=plan, sub_group_size=2000, overlap=overlap, config=config)


@pytest.mark.parametrize("variant", ["no_persistence", "sequential_gather"])
def test_zero3_gather_variants(variant: str) -> None:
    """No persistent parameters (every module's are gathered and prefetched in each forward and backward), and the
    persistent ones gathered by copy: bit-identical to the same configuration without overlap."""
    def strategy(overlap: bool) -> DeepOptimizerStatesStrategy:
        if variant == "sequential_gather":
            return _sequential_gather(0.5, overlap)
        return DeepOptimizerStatesStrategy(plan=0.5, sub_group_size=2000, param_persistence=0, overlap=overlap)

    run = train(0.5, steps=5, clip=CLIP, strategy=strategy(True))
    _assert_identical(run, train(0.5, steps=5, clip=CLIP, strategy=strategy(False)))
    opt = run.strategy.model.optimizer
    assert (len(opt.persistent_parameters) > 0) == opt._persistent_gather_reads() == (variant == "sequential_gather")


# ---------------------------------------------------------------------- the gates, with a delayed host lane
def test_a_delayed_host_lane_is_waited_for_by_exactly_the_modules_that_read_it(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    reference = train("host", steps=5, clip=CLIP, every_step=HoldOneSubgroup(monkeypatch, hold=False))
    held = HoldOneSubgroup(monkeypatch)
    run = train("host", steps=5, clip=CLIP, strategy=_overlap("host"), every_step=held)
    assert not held.timed_out
    assert held.pending_after_step == [True] * 5  # optimizer.step returned before k's CPU Adam had run
    head = [written for _, holds, written in held.forwards if holds]
    assert len(head) == 4 and all(head)  # the head's forward began only once k was written ...
    assert any(not written for _, holds, written in held.forwards if not holds)  # ... others ran before that
    _assert_identical(run, reference)


def test_without_the_gate_the_same_run_reads_stale_params(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the gate a no-op, the head's forward runs before k's update lands and the losses differ
    (so the test above has teeth)."""
    reference = train("host", steps=5, clip=CLIP, every_step=HoldOneSubgroup(monkeypatch, hold=False))
    monkeypatch.setattr(InFlightUpdate, "wait_params", lambda phase, ids, streams=(): None)
    held = HoldOneSubgroup(monkeypatch)
    run = train("host", steps=5, clip=CLIP, strategy=_overlap("host"), every_step=held)
    assert any(holds and not written for _, holds, written in held.forwards)
    assert run.losses[0] == reference.losses[0] and run.losses[1:] != reference.losses[1:]


class _WriteHostGradDuringUpdate(HoldOneSubgroup):
    """After the second step, with its update in flight and ``k`` held, a thread writes ``k``'s host gradient
    through the backward's own path (``_send_host_grads``, the values already there: the run is unchanged) and
    records whether ``k``'s CPU Adam had run when the write went through. ``k`` stays held until the writer has
    written or waits at ``k``'s gradient gate."""

    writer: threading.Thread | None = None
    adam_done_at_write: bool | None = None

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.settled = threading.Event()  # the writer has written, or waits at k's gradient gate
        super().__init__(monkeypatch)

    def _until_released(self) -> bool:
        released = super()._until_released()
        return released and (self.writer is None or self.settled.wait(HANG_GUARD_S))

    def _grad_wait(self) -> None:
        super()._grad_wait()
        self.settled.set()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        super().on_train_batch_end(trainer)
        if idx != 1:
            return
        opt = trainer.strategy.model.optimizer
        weight = pl_module.net[-1].weight
        param_id = opt.get_param_id(weight)
        i, offset, numel = opt.grad_position[param_id]
        same = opt.fp32_partitioned_groups_flat[i].grad.narrow(0, offset, numel).clone()

        def write() -> None:
            opt._send_host_grads([(param_id, i, offset, same)])
            self.adam_done_at_write = self.k_done.is_set()
            self.settled.set()

        self.writer = threading.Thread(target=write)
        self.writer.start()


@pytest.mark.parametrize("gate", [True, False], ids=["gated", "negative_control"])
def test_the_backwards_host_gradient_writes_wait_for_the_update_to_be_done_with_them(
        gate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not gate:
        monkeypatch.setattr(InFlightUpdate, "wait_grads", lambda phase, ids, stream=None: None)
    writer = _WriteHostGradDuringUpdate(monkeypatch)
    train("host", steps=3, clip=CLIP, strategy=_overlap("host"), every_step=writer)
    assert writer.writer is not None
    writer.writer.join(10.0)
    assert not writer.timed_out
    assert writer.adam_done_at_write is gate  # gated: not before CPU Adam had read the gradient


def test_a_persistent_gather_that_copies_waits_for_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the sequential gather the step waits for the persistent parameters' subgroups before ``_post_step``;
    without that wait (negative control) the gather copies the head's weight before its update lands."""
    reference = train("host", steps=4, clip=CLIP, strategy=_sequential_gather("host", False),
                      every_step=HoldOneSubgroup(monkeypatch, hold=False))
    held = HoldOneSubgroup(monkeypatch)
    _assert_identical(train("host", steps=4, clip=CLIP, strategy=_sequential_gather("host", True),
                            every_step=held), reference)
    assert not held.timed_out
    monkeypatch.undo()
    monkeypatch.setattr(InterleavedZeroOptimizer, "_persistent_gather_reads", lambda self: False)
    stale = train("host", steps=4, clip=CLIP, strategy=_sequential_gather("host", True),
                  every_step=HoldOneSubgroup(monkeypatch))
    assert stale.losses[0] == reference.losses[0] and stale.losses[1:] != reference.losses[1:]


# ---------------------------------------------------------------------- failures
@pytest.mark.parametrize("update", [3, 6], ids=["a_gate", "the_final_join"])
def test_a_worker_failure_surfaces_in_the_training_loop_with_its_message(update: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The 3rd update fails: the next forward's gate raises it; the 6th (the last) fails: the join at the end of
    the run raises it. Nothing hangs and the worker thread is gone afterwards."""
    host_step = HostAdam.step

    def failing(adam: HostAdam, state: dict, *args: Any, **kwargs: Any) -> None:
        if state["step"] == update - 1:
            raise RuntimeError(f"CPU Adam failed at update {update} (test)")
        host_step(adam, state, *args, **kwargs)

    monkeypatch.setattr(HostAdam, "step", failing)
    with pytest.raises(RuntimeError, match=f"CPU Adam failed at update {update} \\(test\\)") as raised:
        train("host", steps=6, clip=CLIP, strategy=_overlap("host"))
    where = {entry.name for entry in raised.traceback}
    assert "failing" in where  # the worker's own frames are kept
    assert ("wait_params" in where) == (update == 3) and ("join" in where) == (update == 6)
    assert not [t for t in threading.enumerate() if t.name.startswith("dos-update")]


def test_a_failed_phase_releases_every_reader_and_raises_once() -> None:
    phase = InFlightUpdate(3, lambda stream, event: None)
    error = ValueError("boom")

    def work() -> None:
        phase.wrote(0, None)
        raise error

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        phase.start(pool, work, lambda: "timings")
        with pytest.raises(ValueError, match="boom"):
            phase.wait_params([0, 1, 2])
        phase.wait_grads([2])  # released, and raised once already
        assert phase.join() is None
    assert all(e.is_set() for e in (*phase.issued, *phase.grad_free))

    ok = InFlightUpdate(1, lambda stream, event: None)
    with ThreadPoolExecutor(1) as pool:
        ok.start(pool, lambda: ok.wrote(0, None), lambda: "timings")
        assert ok.join() == "timings" and ok.join() == "timings"


class _LiveLanes(pl.Callback):
    """After every step, the device lanes still alive, counted without a garbage collection: a lane held only by
    a reference cycle (it, its phase and the phase's closures) stays alive until the collector runs, and on a GPU
    every such lane keeps its buffer slots, gigabytes each."""

    def __init__(self) -> None:
        import gc

        from lightning_dos.update.device_lane import DeviceLane

        self.gc, self.kind, self.counts = gc, DeviceLane, []

    def on_train_batch_end(self, *_: Any) -> None:
        self.counts.append(sum(isinstance(o, self.kind) for o in self.gc.get_objects()))


def test_a_joined_phase_frees_its_device_lane_without_waiting_for_the_garbage_collector() -> None:
    import gc

    live = _LiveLanes()
    gc.collect()
    gc.disable()
    try:
        train(0.5, steps=8, clip=CLIP, strategy=_overlap(0.5), every_step=live)
    finally:
        gc.enable()
    # at most the phase in flight and the lane its dispatch prefetches into; with a cycle, one more per step
    assert len(live.counts) == 8 and max(live.counts) <= 2, live.counts


# ---------------------------------------------------------------------- bad input and defaults
def test_overlap_must_be_auto_or_a_bool() -> None:
    with pytest.raises(ValueError, match="overlap: 'yes' is not 'auto', true or false; set overlap: auto"):
        DeepOptimizerStatesStrategy(overlap="yes")  # type: ignore[arg-type]
    assert DeepOptimizerStatesStrategy().overlap == "auto"


def test_auto_turns_overlap_on_with_cuda_devices_at_any_rank_count() -> None:
    assert overlap_by_default(1, "cuda")
    assert overlap_by_default(4, "cuda")  # several ranks overlap too (tests/system/test_two_ranks.py checks them exact)
    assert not overlap_by_default(1, "cpu")  # the host stands in for the device: the same cores would run both
    assert not overlap_by_default(2, "cpu")


def test_auto_runs_serially_on_a_cpu_and_says_so_nowhere() -> None:
    run = train("host", steps=2, clip=CLIP, strategy=make_strategy("host", overlap="auto"))
    assert run.strategy.overlapped is False and run.strategy.manager.overlap is False
    assert "overlaps the next forward" not in run.strategy.manager.describe()
    assert "timers" not in run.strategy.config


def test_auto_where_overlap_is_on_overlaps_exactly_and_logs_every_phase(monkeypatch: pytest.MonkeyPatch,
                                                                        vanilla: Any) -> None:
    """The default's path as one CUDA rank takes it (the decision forced on here): overlapped, tracking vanilla,
    bit-identical to serial, the throughput timer unsynchronised, the start-up line saying so, and every phase's
    record logged, the last one at the end of training although it is joined only then."""
    monkeypatch.setattr(strategy_module, "overlap_by_default", lambda world_size, device_type: True)
    logger = DOSMetricsLogger(timeline_every_n=0)
    run = train(0.5, steps=6, clip=CLIP, strategy=make_strategy(0.5, overlap="auto"), every_step=logger)
    strategy = run.strategy
    assert strategy.overlapped is True and strategy.manager.overlap is True
    assert "each update phase overlaps the next forward" in strategy.manager.describe()
    assert strategy.config["timers"] == {"throughput": {"synchronized": False}}
    assert_tracks(run, vanilla, TOL)
    _assert_identical(run, shared_run(0.5, steps=6, clip=CLIP))
    assert len(strategy.manager.records) == 6 and logger._logged_phases == 6


def test_auto_without_the_interleaved_update_runs_serially_without_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strategy_module, "overlap_by_default", lambda world_size, device_type: True)
    monkeypatch.setattr(InterleavedZeroOptimizer, "interleaved_supported", lambda self: False)
    run = train("host", steps=2, strategy=make_strategy("host", overlap="auto"))
    assert run.strategy.overlapped is False and run.strategy.manager.overlap is False


def test_overlap_without_the_interleaved_update_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(InterleavedZeroOptimizer, "interleaved_supported", lambda self: False)
    with pytest.raises(MisconfigurationException,
                       match="overlap: needs the interleaved update.*set overlap: auto or false"):
        train("host", steps=1, strategy=_overlap("host"))


def test_the_throughput_timer_stops_synchronising_only_with_overlap() -> None:
    assert "timers" not in DeepOptimizerStatesStrategy().config  # auto decides in setup_environment
    assert "timers" not in DeepOptimizerStatesStrategy(overlap=False).config
    assert DeepOptimizerStatesStrategy(overlap=True).config["timers"] == {"throughput": {"synchronized": False}}
    config = DeepOptimizerStatesStrategy().config
    config["timers"] = {"throughput": {"synchronized": True}}
    user = DeepOptimizerStatesStrategy(overlap=True, config=config)
    assert user.config["timers"] == {"throughput": {"synchronized": True}}  # the user's config wins


def test_the_throughput_timer_synchronises_a_serial_run_and_not_an_overlapped_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the config says, as behaviour: DeepSpeed's throughput timer waits for the device at every start and stop
    of a serial run, and never in an overlapped one (its wait would end the overlap at every step)."""
    from deepspeed.accelerator import get_accelerator

    accelerator, waits = get_accelerator(), []
    original = accelerator.synchronize

    def counting(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        waits.append(caller.replace("\\", "/").endswith("deepspeed/utils/timer.py"))
        return original(*args, **kwargs)

    monkeypatch.setattr(accelerator, "synchronize", counting)
    train(0.5, steps=4, clip=CLIP, strategy=make_strategy(0.5, overlap=False))
    serial = sum(waits)
    waits.clear()
    train(0.5, steps=4, clip=CLIP, strategy=make_strategy(0.5, overlap=True))
    assert serial >= 2 and sum(waits) == 0


def test_both_lanes_issue_their_subgroups_in_the_order_the_forward_first_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The next forward waits at its first module for the subgroups that module reads (here the no-decay group,
    the last subgroup id, is read by the first layers): each lane takes its subgroups in the order the forward first
    reads them, not in id order, so the forward can start long before the phase ends."""
    issued: list[list[int]] = []
    wrote, issue = InFlightUpdate.wrote, UpdateExecutor.issue

    def new_phase(executor: UpdateExecutor, *args: Any, **kwargs: Any) -> InFlightUpdate:
        issued.append([])
        return issue(executor, *args, **kwargs)

    def noting(phase: InFlightUpdate, i: int, event: Any) -> None:
        issued[-1].append(i)
        wrote(phase, i, event)

    monkeypatch.setattr(UpdateExecutor, "issue", new_phase)
    monkeypatch.setattr(InFlightUpdate, "wrote", noting)
    run = train(0.5, steps=4, clip=CLIP, strategy=_overlap(0.5))
    optimizer = run.strategy.model.optimizer
    first_reads = optimizer.forward_order()
    n = len(optimizer.fp16_groups)
    assert sorted(first_reads) == list(range(n))
    assert list(first_reads) != sorted(first_reads)  # the case this is about: id order is not the forward's
    lanes = run.strategy.manager.records[-1].plan.lanes
    assert len(issued) == 4 and all(sorted(each) == list(range(n)) for each in issued)
    for each in issued[1:]:  # from the second phase on (the first forward has recorded the order)
        for lane in (Lane.HOST, Lane.DEVICE):
            in_lane = [i for i in each if lanes[i] is lane]
            assert in_lane == [i for i in first_reads if lanes[i] is lane], lane
    assert_tracks(run, shared_run(None, steps=4, clip=CLIP), TOL)


def test_a_plan_put_in_force_at_a_join_runs_from_the_next_step_with_no_gradient_moved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With overlap the join, and with it any plan change the calibration makes, comes after the backward that
    placed the gradients for the plan in force. The step then runs that plan; the new one runs from the next step.
    A device-lane gradient brought to the host at the step (a blocking copy on a GPU) would mean the step ran a
    plan its backward did not place gradients for."""
    from lightning_dos.update.manager import OptimizerStateManager

    calibrate, grad_to_host = OptimizerStateManager._calibrate, InterleavedZeroOptimizer._grad_to_host
    plans = {"device": None, "host": None}
    moved: list[int] = []

    def alternating(manager: OptimizerStateManager, record: Any) -> None:
        calibrate(manager, record)
        n = len(manager.sizes)
        plans["device"] = plans["device"] or Plan(lanes=(Lane.DEVICE,) * n)
        plans["host"] = plans["host"] or Plan(lanes=(Lane.HOST,) * n)
        manager.set_plan(plans["host"] if record.plan.lanes[0] is Lane.DEVICE else plans["device"])

    def counting(optimizer: InterleavedZeroOptimizer, sub_group_id: int, wait: bool = True) -> Any:
        if sub_group_id in optimizer._device_grads():
            moved.append(sub_group_id)
        return grad_to_host(optimizer, sub_group_id, wait=wait)

    monkeypatch.setattr(OptimizerStateManager, "_calibrate", alternating)
    monkeypatch.setattr(InterleavedZeroOptimizer, "_grad_to_host", counting)
    run = train("device", steps=6, clip=CLIP, strategy=_overlap("device"))
    ran = [record.plan.lanes[0] for record in run.strategy.manager.records]
    # each join answers the phase before it; its plan runs from the step after the one it dispatches
    assert ran == [Lane.DEVICE, Lane.DEVICE, Lane.HOST, Lane.HOST, Lane.DEVICE, Lane.DEVICE]
    assert moved == []
    assert_tracks(run, shared_run(None, steps=6, clip=CLIP), TOL)


def _kept_gradient_subgroups(sizes: list[int]) -> list[Any]:
    """Subgroups whose bf16 gradients stayed on the device (the host stands in for it) through backward."""
    from lightning_dos.update.subgroup import AdamHyper, Subgroup

    hyper = AdamHyper(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, adamw=True)
    g = torch.Generator().manual_seed(0)
    subgroups = []
    for i, n in enumerate(sizes):
        master = torch.randn(n, generator=g)
        subgroups.append(Subgroup(index=i, numel=n, master=master, exp_avg=torch.zeros(n), exp_avg_sq=torch.zeros(n),
                                  state={"step": 0}, grad=torch.randn(n, generator=g).to(torch.bfloat16),
                                  param16=master.to(torch.bfloat16), hyper=hyper, grad_on_device=True))
    return subgroups


def test_an_issued_phase_frees_its_slots_and_kept_gradients_once_its_work_is_done_before_the_join(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager joins a phase only at the next dispatch, after the next forward and backward. The phase's buffer
    slots and the gradients its subgroups kept on the device must go back as soon as its work is complete, or the
    next backward runs with them and its own kept gradients allocated at once (on a GPU host: gigabytes)."""
    import weakref

    from lightning_dos.update.device_lane import DeviceLane

    subgroups = _kept_gradient_subgroups([300, 120, 500, 80])
    kept = [weakref.ref(sg.grad) for sg in subgroups]
    slots: list[Any] = []
    bind = DeviceLane.bind

    def noting(lane: DeviceLane, *args: Any) -> None:
        bind(lane, *args)
        slots.extend(weakref.ref(slot) for slot in lane.slots)

    monkeypatch.setattr(DeviceLane, "bind", noting)
    executor = UpdateExecutor(torch.device("cpu"))
    lanes = [Lane.DEVICE] * len(subgroups)
    expected = [sg.master.clone() for sg in subgroups]
    phase = executor.issue(lanes, [], 2, subgroups, 1.0, lambda i: None)
    masters = [sg.master for sg in subgroups]
    del subgroups
    try:
        assert phase.finished.wait(10)
        assert slots and all(ref() is None for ref in slots)  # the phase is not joined yet
        assert all(ref() is None for ref in kept)
        assert phase.join() is not None
        assert all(not torch.equal(m, e) for m, e in zip(masters, expected))  # the update did land
    finally:
        executor.close()


def test_a_kept_gradient_goes_as_soon_as_its_subgroups_adam_is_issued_not_at_the_end_of_the_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With overlap the next forward and backward run during the phase; the gradients the step's subgroups kept on
    the device must not all wait for the whole phase. The device lane is held inside the Adam of its third subgroup:
    the two before it and the resident subgroup (updated at once, in neither lane) have let theirs go; the third
    and the fourth still hold theirs. The update is then the same as without the hold."""
    import weakref

    from lightning_dos.update import device_lane
    from lightning_dos.update.resident import ResidentUpdate

    sizes = [300, 120, 500, 80, 200]
    reference = _kept_gradient_subgroups(sizes)
    ref_executor = UpdateExecutor(torch.device("cpu"))
    ref_executor.resident = ResidentUpdate([4], sizes, torch.device("cpu"))
    ref_executor.run([Lane.DEVICE] * len(sizes), [], 2, reference, 0.5, lambda i: None)

    reached, go = threading.Event(), threading.Event()
    widen = device_lane.adam_widened

    def held(sg: Any, *args: Any) -> None:
        if sg.index == 2:
            reached.set()
            assert go.wait(10)
        widen(sg, *args)

    monkeypatch.setattr(device_lane, "adam_widened", held)
    subgroups = _kept_gradient_subgroups(sizes)
    kept = [weakref.ref(sg.grad) for sg in subgroups]
    executor = UpdateExecutor(torch.device("cpu"))
    executor.resident = ResidentUpdate([4], sizes, torch.device("cpu"))
    phase = executor.issue([Lane.DEVICE] * len(sizes), [], 2, subgroups, 0.5, lambda i: None)
    masters = [sg.master for sg in subgroups]
    params = [sg.param16 for sg in subgroups]
    del subgroups
    try:
        assert reached.wait(10)
        alive = [ref() is not None for ref in kept]
        go.set()
        assert phase.join() is not None
    finally:
        go.set()
        executor.close()
    assert alive == [False, False, True, True, False]
    for sg, master, param in zip(reference, masters, params):
        assert torch.equal(master, sg.master) and torch.equal(param, sg.param16)
