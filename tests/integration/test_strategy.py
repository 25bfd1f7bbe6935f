"""The strategy: registration, resolved DeepSpeed config, early errors, dispatch at the update boundary."""

from __future__ import annotations

import copy
import logging
import re

import lightning.pytorch as pl
import pytest
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import lightning_dos
from lightning_dos import DeepOptimizerStatesStrategy, ZeRO3OffloadStrategy
from lightning_dos._versions import check_versions
from lightning_dos.strategies.dos import AUTO_SUB_GROUP_MAX, PERSIST_ALL, auto_sub_group_size, persistence_threshold
from lightning_dos.strategies.options import DOSOptionsError
from tests.support.parity import make_strategy, rel, train


def test_import_registers_names_idempotently() -> None:
    lightning_dos.register()
    lightning_dos.register()
    for name in ("deep_optimizer_states", "zero3_offload", "static_split_0.5", "zero3"):
        assert name in StrategyRegistry
    trainer = pl.Trainer(strategy="deep_optimizer_states", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, DeepOptimizerStatesStrategy)
    split = pl.Trainer(strategy="static_split_0.5", accelerator="cpu", devices=1, logger=False).strategy
    assert isinstance(split, ZeRO3OffloadStrategy)
    assert split.config["zero_optimization"]["offload_optimizer"]["ratio"] == 0.5


def test_resolved_config_has_dos_defaults() -> None:
    s = DeepOptimizerStatesStrategy()
    zero = s.config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_optimizer"]["pin_memory"] is True
    assert "offload_param" not in zero
    assert 0 < zero["sub_group_size"] <= AUTO_SUB_GROUP_MAX
    assert s.plan_spec.kind == "auto"
    explicit = DeepOptimizerStatesStrategy(plan="stride:3", sub_group_size=50_000_000)
    assert explicit.config["zero_optimization"]["sub_group_size"] == 50_000_000
    assert explicit.plan_spec.kind == "stride" and explicit.plan_spec.stride == 3


def test_user_config_is_completed_not_overridden() -> None:
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    given = copy.deepcopy(config)
    s = DeepOptimizerStatesStrategy(config=config, sub_group_size=1000)
    assert s.config["zero_optimization"]["offload_optimizer"]["pin_memory"] is True
    assert s.config["zero_optimization"]["sub_group_size"] == 1000
    assert config == given  # the caller's dict is left as it was: the strategy completes a copy
    DeepOptimizerStatesStrategy(config=config, sub_group_size=2000)  # so the same dict serves a second strategy
    assert config == given


def test_the_stage_error_names_the_stage_asked_for() -> None:
    with pytest.raises(MisconfigurationException) as info:
        DeepOptimizerStatesStrategy(stage=2)
    assert "strategy: deepspeed_stage_2" in str(info.value) and "{stage}" not in str(info.value)


def test_auto_sub_group_size_gives_several_subgroups() -> None:
    assert auto_sub_group_size(2_780_451_840) == AUTO_SUB_GROUP_MAX  # 2.78B: 28 subgroups of 1e8
    assert auto_sub_group_size(10_981_440) == 686_340  # 10M: 16 subgroups
    assert auto_sub_group_size(1) == 1


@pytest.mark.parametrize(
    ("kwargs", "exc", "key"),
    [
        ({"plan": "strid:2"}, ValueError, "plan"),
        ({"plan": 1.5}, ValueError, "plan"),
        ({"plan": "stride:0"}, ValueError, "plan"),
        ({"sub_group_size": 0}, ValueError, "sub_group_size"),
        ({"sub_group_size": -5}, ValueError, "sub_group_size"),
        ({"sub_group_size": "big"}, ValueError, "sub_group_size"),
        ({"memory_budget_gib": -1}, ValueError, "memory_budget_gib"),
        ({"buffers": 0}, ValueError, "buffers"),
        ({"cost_overrides": {"pcie": 1.0}}, ValueError, "cost_overrides"),
        ({"stage": 2}, MisconfigurationException, "stage"),
        ({"offload_optimizer": False}, MisconfigurationException, "offload_optimizer"),
        ({"config": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}},
         MisconfigurationException, "zero_optimization.stage"),
        ({"config": {"zero_optimization": {"stage": 3}}},
         MisconfigurationException, "zero_optimization.offload_optimizer.device"),
        ({"config": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}},
         MisconfigurationException, "zero_optimization.offload_optimizer.device"),
        ({"config": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}},
         MisconfigurationException, "ratio"),
        ({"config": {"zero_optimization": {"stage": 3, "sub_group_size": -1,
                                           "offload_optimizer": {"device": "cpu"}}}},
         MisconfigurationException, "sub_group_size"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs: dict, exc: type, key: str) -> None:
    with pytest.raises(exc) as info:
        DeepOptimizerStatesStrategy(**kwargs)
    assert isinstance(info.value, DOSOptionsError)
    (line,) = info.value.problems  # one bad argument: one problem, naming its key
    assert line.split(":")[0].endswith(key), line
    assert re.search(r"; (set|use|remove) ", line), line  # says what to do instead
    assert line in str(info.value).splitlines()[1]


def test_every_argument_and_config_problem_is_reported_at_once() -> None:
    with pytest.raises(DOSOptionsError) as info:
        DeepOptimizerStatesStrategy(plan="strid:2", buffers=0, stage=2, overlap="sometimes",
                                    activation_offload="nvme",
                                    config={"zero_optimization": {"stage": 1, "sub_group_size": 0}})
    keys = [problem.split(":")[0] for problem in info.value.problems]
    assert keys == ["plan", "buffers", "stage", "activation_nvme_path", "overlap", "zero_optimization.stage",
                    "zero_optimization.offload_optimizer.device", "zero_optimization.sub_group_size"]
    assert str(info.value).count("\n  - ") == len(keys)  # one line each


def test_unsupported_versions_fail_naming_the_range() -> None:
    check_versions({"deepspeed": "0.19.8", "lightning": "2.6.6"})
    with pytest.raises(ImportError, match=r"deepspeed>=0\.19,<0\.20"):
        check_versions({"deepspeed": "0.20.1", "lightning": "2.6.6"})
    with pytest.raises(ImportError, match=r"lightning>=2\.6,<2\.7"):
        check_versions({"deepspeed": "0.19.8", "lightning": "2.7.0"})


def test_log_line_says_what_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        run = train("stride:2", steps=1)
    lines = [r.getMessage() for r in caplog.records if "deep_optimizer_states:" in r.getMessage()]
    assert lines, "the strategy must say which plan runs"
    n = len(run.strategy.manager.sizes)
    assert f"{n} subgroups" in lines[0] and "stride:2" in lines[0]
    assert "host stands in for the device" in lines[0]


def test_dispatch_once_per_update_with_accumulation() -> None:
    """on_before_optimizer_step runs every micro-batch; only boundary ones dispatch an update phase."""
    run = train(0.5, steps=3, accumulate=2)
    manager = run.strategy.manager
    assert len(manager.records) == 3
    metrics = manager.metrics()
    assert metrics["dos/device_fraction"] == manager.records[-1].device_fraction
    assert metrics["dos/update_ms"] > 0 and metrics["dos/predicted_update_ms"] > 0


def test_baselines_keep_zero3_when_every_default_is_passed_explicitly() -> None:
    """A class_path config passes DeepSpeedStrategy's defaults (stage 2, no offload) explicitly; they must not win."""
    from lightning_dos.strategies.baselines import ZeRO3Strategy

    s = ZeRO3OffloadStrategy(ratio=0.75)
    zero = s.config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_optimizer"]["ratio"] == 0.75
    assert ZeRO3Strategy().config["zero_optimization"]["stage"] == 3
    with pytest.raises(MisconfigurationException, match="stage"):
        ZeRO3OffloadStrategy(stage=2, offload_optimizer=False)
    with pytest.raises(MisconfigurationException, match="stage"):
        ZeRO3Strategy(stage=2)


def test_predictions_know_which_gradients_stay_on_the_device() -> None:
    """plan=device without accumulation prefetches 12 bytes/param; the prediction must say so (not 16)."""
    from lightning_dos.planning.perf_model import CostParams, predicted_makespan_s

    run = train("device", steps=1)
    manager = run.strategy.manager
    n = len(manager.sizes)
    first = manager.records[0]  # predicted with the starting cost parameters, before any calibration
    start = CostParams(ranks_per_host=1)
    kept = predicted_makespan_s(first.plan, manager.sizes, start, grads_on_device=frozenset(range(n)))
    prefetched = predicted_makespan_s(first.plan, manager.sizes, start)
    assert first.predicted_s == pytest.approx(kept) and kept < prefetched
    assert manager.device_gradients
    accumulating = train("device", steps=1, accumulate=2).strategy.manager
    assert not accumulating.device_gradients and accumulating.optimizer.device_grad_subgroups == frozenset()


def test_backward_may_queue_more_reduce_buckets_than_vanilla() -> None:
    """Host-lane gradient copies run on the reduce stream; the DOS optimizer lets the backward queue
    ``REDUCE_EVENTS`` buckets before the host waits for the oldest, vanilla keeps DeepSpeed's 2."""
    from lightning_dos.zero.optimizer import REDUCE_EVENTS

    dos = train("stride:2", steps=1).strategy.model.optimizer
    vanilla = train(None, steps=1).strategy.model.optimizer
    assert dos.max_param_reduce_events == REDUCE_EVENTS > 2
    assert vanilla.max_param_reduce_events == 2


def test_dispatch_starts_the_device_lane_prefetches_before_the_update_phase() -> None:
    """Once the homes exist (here from the start: nothing to measure, every subgroup lives on the host; on a GPU from
    the first dispatch, which places them before it prefetches) dispatch issues the device lane's first prefetches,
    and the update phase uses them; parity with vanilla holds (tests/integration/test_parity.py)."""
    from lightning_dos.planning.perf_model import PREFETCH_WINDOW

    run = train(0.5, steps=3)
    records = run.strategy.manager.records
    ahead = [r.timings.prefetched_ahead for r in records]
    slots = [min(r.plan.buffers, len(r.plan.device_subgroups()), PREFETCH_WINDOW) for r in records]
    assert ahead == slots and min(slots) >= 1
    manager = run.strategy.manager
    assert manager.metrics()["dos/prefetched_ahead"] == ahead[-1]
    assert manager.executor._ahead is None  # nothing left waiting
    # the head start: measured from dispatch to the phase, learnt by the model
    leads = [r.timings.lead_s for r in records]
    assert min(leads) > 0.0
    assert manager.metrics()["dos/dispatch_lead_ms"] == pytest.approx(leads[-1] * 1e3)
    assert manager.cost.dispatch_lead_s > 0.0
    # every cost parameter pinned, a head start of 1 s among them: the prediction counts it
    from lightning_dos.planning.perf_model import CostParams, predicted_makespan_s

    pinned_cost = CostParams(dispatch_lead_s=1.0)
    pinned = train(0.5, steps=2, strategy=make_strategy(0.5, cost_overrides=pinned_cost.to_json())).strategy.manager
    first = pinned.records[0]
    assert first.timings.prefetched_ahead > 0 and pinned.cost == pinned_cost
    kept = pinned._kept_grads(first.plan)  # the device lane's gradients stayed on the device through backward
    assert kept == frozenset(first.plan.device_subgroups())
    without = predicted_makespan_s(first.plan, pinned.sizes, CostParams(), kept)
    with_lead = predicted_makespan_s(first.plan, pinned.sizes, pinned_cost, kept)
    assert first.predicted_s == pytest.approx(with_lead) and with_lead < without
    reference = train(None, steps=3)
    assert rel(run.masters, reference.masters) <= 1e-5


@pytest.mark.parametrize(
    ("setting", "world", "model_bytes", "free", "expected"),
    [
        ("auto", 1, 10 * 2**30, None, PERSIST_ALL),  # one rank: its partition is the whole model already
        ("auto", 2, 10 * 2**30, 40 * 2**30, PERSIST_ALL),  # a whole copy takes a quarter of the free memory
        ("auto", 2, 10 * 2**30 + 1, 40 * 2**30, None),  # a byte more: DeepSpeed's default
        ("auto", 8, 2**30, None, None),  # free memory unknown (no CUDA device): DeepSpeed's default
        (True, 8, 2**40, 1, PERSIST_ALL),
        (False, 1, 1, 2**40, None),
        (123_456, 4, 1, 1, 123_456),
    ],
)
def test_persistence_rule(setting: object, world: int, model_bytes: int, free: int | None,
                          expected: int | None) -> None:
    assert persistence_threshold(setting, world, model_bytes, free) == expected


@pytest.mark.parametrize("bad", ["always", -1, 1.5])
def test_bad_persistence_is_one_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="param_persistence: .*set 'auto', true, false"):
        DeepOptimizerStatesStrategy(param_persistence=bad)


def test_one_rank_keeps_every_16_bit_parameter_whole_and_a_config_threshold_wins() -> None:
    run = train(0.5, steps=2, clip=0.05)
    opt = run.strategy.model.optimizer
    params = list(run.strategy.model.module.parameters())
    assert run.strategy.persistence_threshold == PERSIST_ALL
    assert len(opt.persistent_parameters) == len(params) and all(p.ds_persist for p in params)
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                    "stage3_param_persistence_threshold": 0}}
    run = train(None, steps=2, clip=0.05, strategy=DeepOptimizerStatesStrategy(plan=0.5, sub_group_size=2000,
                                                                               config=config))
    assert run.strategy.persistence_threshold is None and not run.strategy.model.optimizer.persistent_parameters
