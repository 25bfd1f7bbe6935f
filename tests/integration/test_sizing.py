"""Sizing a run before it exists (``lightning-dos plan``, :mod:`lightning_dos.strategies.sizing`): the subgroups
ZeRO-3 will form, computed from the model on the meta device, are the ones the real engine forms; the plans follow the
same placement rules as the strategy's own."""

from __future__ import annotations

import pytest

from lightning_dos.planning.placement import GIB, Home, zero3_subgroups
from lightning_dos.strategies.sizing import host_for, param_groups_numel, size_run, world_of
from tests.support.parity import TinyLM, train


def test_the_subgroups_sized_from_the_model_are_the_engines() -> None:
    engine = train("host", steps=1).strategy.manager.subgroup_sizes  # sub_group_size 2000 (make_strategy's)
    module = TinyLM()
    module.configure_model()
    assert zero3_subgroups(param_groups_numel(module), 1, 2000) == engine


def test_zero3_groups_each_param_group_and_rounds_each_partition_up() -> None:
    assert zero3_subgroups([[5, 5, 5], [3]], 1, 100) == [15, 3]  # a group within the size: one subgroup
    assert zero3_subgroups([[60, 50, 10, 7]], 1, 100) == [110, 17]  # closes once it reaches the size
    assert zero3_subgroups([[7, 7]], 2, 1) == [4, 4]  # ceil(7 / 2) elements per rank each
    with pytest.raises(ValueError, match="world_size"):
        zero3_subgroups([[1]], 0, 1)


def test_a_tiny_model_fits_a_big_box_and_not_a_host_without_room() -> None:
    module = TinyLM()
    big = size_run(module, 1, 2000, micro_batch=4, seq_len=16, device_bytes=80 * GIB, host=host_for(128 * GIB, 1))
    assert big.fits and big.activation_bytes is None  # TinyLM has no estimate: the best case, said so
    assert big.after_first_step.placement.homes == (Home.DEVICE,) * len(big.sizes)
    assert "not estimated" in big.describe() and "fits this box" in big.describe()
    no_gpu_room = size_run(TinyLM(), 1, 2000, 4, 16, device_bytes=1 * GIB, host=host_for(9 * GIB, 1, 0))
    assert not no_gpu_room.fits and "does NOT fit" in no_gpu_room.describe()  # nothing available on the host


def test_the_ranks_of_a_trainer() -> None:
    assert world_of(4) == 4 and world_of([0, 1]) == 2 and world_of("auto") == 1 and world_of("2", num_nodes=3) == 6


def test_the_bytes_per_parameter_follow_the_precision_as_the_engine_keeps_them() -> None:
    from lightning_dos.strategies.sizing import precision_bytes

    assert precision_bytes("bf16-mixed") == precision_bytes("16-mixed") == precision_bytes("bf16-true") == (2, 2, 2)
    assert precision_bytes("bf16-mixed", accumulate_grad_batches=2) == (2, 2, 4)  # fp32 accumulation on the host
    assert precision_bytes("32-true") == precision_bytes(32) == precision_bytes("64-true") == (4, 4, 4)


def test_a_host_homes_gradient_width_is_what_the_host_plan_counts() -> None:
    box = {"device_bytes": 1 * GIB, "host": host_for(128 * GIB, 1)}  # no GPU room: every subgroup on the host
    narrow = size_run(TinyLM(), 1, 2000, 4, 16, **box).after_first_step
    wide = size_run(TinyLM(), 1, 2000, 4, 16, host_grad_bytes=4, **box).after_first_step
    assert narrow.placement.homes == wide.placement.homes == (Home.HOST,) * len(narrow.placement.homes)
    assert (narrow.host_bytes_per_param, wide.host_bytes_per_param) == (14, 16)
