"""What the step does before and after the update phase (``lightning_dos.zero.optimizer``): the subgroups' gradient
norms in one reduction, and persistent parameters that are their own partition neither released nor gathered.

Vanilla's preamble took 46.0 ms of a gpt-2.7b step on a GPU host from the step's start to the update phase's (run T;
14.8 ms after this change, run U): per subgroup an all-reduce, two waits for the device and a kernel per parameter;
and it released every persistent parameter before the update and gathered it back after.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from lightning_dos.zero.optimizer import _VanillaStage3
from tests.support.parity import make_strategy, train
from tests.support.preamble_probes import NormProbe, ReleaseProbe

FP32_TOL = 1e-5


def test_subgroup_norms_equal_vanillas_with_one_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = NormProbe(monkeypatch)
    run = train(0.5, steps=4, every_step=probe)
    subgroups = len(run.strategy.model.optimizer.fp16_groups)
    assert subgroups > 2
    assert probe.reduces == [(1, subgroups)] * 4
    for ours, vanilla in probe.pairs:
        assert len(ours) == len(vanilla) == subgroups
        for a, b in zip(ours, vanilla):
            assert a.dtype == b.dtype == torch.float32 and a.device == b.device == torch.device("cpu")
            assert abs(float(a) - float(b)) <= 1e-6 * abs(float(b)), (float(a), float(b))
        assert any(float(b) > 0 for b in vanilla)


def test_a_subgroup_without_gradient_norms_has_norm_zero_as_in_vanilla() -> None:
    """A subgroup none of whose params recorded a gradient norm (vanilla adds none of them): both give 0 for it."""
    norms: list[tuple[list[float], list[float]]] = []

    class Probe(pl.Callback):
        def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
            optimizer = trainer.strategy.model.optimizer
            for param in optimizer.fp16_groups[0]:
                optimizer.norm_for_param_grads.pop(optimizer.get_param_id(param), None)
            norms.append(([float(n) for n in optimizer._get_norm_groups()],
                          [float(n) for n in _VanillaStage3._get_norm_groups(optimizer)]))

    train(0.5, steps=2, every_step=Probe())
    for ours, vanilla in norms:
        assert ours[0] == vanilla[0] == 0.0
        assert ours == pytest.approx(vanilla, rel=1e-6)


def test_persistent_parameters_are_neither_released_nor_gathered_at_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = ReleaseProbe(monkeypatch)
    run = train(0.5, steps=4, every_step=probe)
    optimizer = run.strategy.model.optimizer
    assert len(optimizer.persistent_parameters) == len(list(optimizer.parameter_offload.module.parameters()))
    assert probe.freed == [0, 0, 0, 0]
    assert probe.whole == [True] * 4 and probe.same_storage == [True] * 4
    # each parameter is a view of its partition: what the update wrote is what the next forward reads
    assert probe.own_partition == [True] * 4
    for param in optimizer.persistent_parameters:
        assert param.data_ptr() == param.ds_tensor.data_ptr()
        assert torch.equal(param.data.reshape(-1), param.ds_tensor.data.reshape(-1)[: param.ds_numel])


def test_vanilla_releases_and_gathers_them_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: vanilla ZeRO-3 offload frees every persistent parameter at every step (and gathers it back)."""
    probe = ReleaseProbe(monkeypatch)
    run = train(None, steps=3, every_step=probe)
    persistent = len(run.strategy.model.optimizer.persistent_parameters)
    assert persistent > 0
    # the first iteration records ZeRO-3's trace and releases most parameters after their modules already
    assert probe.freed[0] > 0 and probe.freed[1:] == [persistent] * 2
    assert probe.whole == [True] * 3 and probe.own_partition == [True] * 3  # gathered back as views, as here


def test_without_persistence_every_parameter_is_released() -> None:
    """``param_persistence=False`` with a threshold below every parameter: nothing persists, so the step releases
    every parameter and the next forward gathers it, as vanilla does."""
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 2000,
                                    "stage3_param_persistence_threshold": 0}}
    freed: list[int] = []

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
            freed.append(sum(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in pl_module.parameters()))

    strategy = make_strategy(0.5, param_persistence=False, config=config)
    run = train(0.5, steps=3, strategy=strategy, every_step=Probe())
    assert not run.strategy.model.optimizer.persistent_parameters
    params = len(list(run.strategy.model.optimizer.parameter_offload.module.parameters()))
    assert freed == [params] * 3
