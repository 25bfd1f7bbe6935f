"""A model of one's own under the strategy: its repeated blocks found for activation offload and ZeRO-3's leaf blocks,
training unchanged; overrides that name nothing refused before training (the rule alone: tests/unit/test_blocks.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_dos.activations import ActivationOffloadCallback
from tests.support.own_model import OwnModel, fit
from tests.support.parity import make_strategy


def _offload(trainer: Any) -> Any:
    return next(cb for cb in trainer.callbacks if isinstance(cb, ActivationOffloadCallback)).offload


@pytest.fixture(scope="module")
def without_offload() -> Any:
    return fit(make_strategy(0.5, sub_group_size=3000), steps=3)


@pytest.mark.parametrize("override", [{}, {"layers": "blocks"}, {"layer_types": ["TransformerEncoderLayer"]}],
                         ids=["found", "layers", "layer_types"])
def test_a_model_of_ones_own_offloads_its_activations_and_hooks_its_blocks_as_leaves(
        override: dict, without_offload: Any) -> None:
    """Torch's TransformerEncoderLayer blocks in a ModuleList: activation offload on the host finds them (it refused
    every model but this package's GPT before), ZeRO-3 hooks them as leaves, and training is bit for bit the same."""
    strategy = make_strategy(0.5, sub_group_size=3000, activation_offload="host", activation_min_tensor_bytes=0,
                             **override)
    run = fit(strategy, steps=3)
    assert run.losses == without_offload.losses
    assert torch.equal(run.flat, without_offload.flat)
    offload = _offload(run.trainer)
    assert offload.n_layers == 2 and offload.total.offloaded_bytes > 0
    assert run.trainer.strategy.leaf_block_names == ["blocks.0", "blocks.1"]
    assert without_offload.trainer.strategy.leaf_block_names == ["blocks.0", "blocks.1"]


def test_layers_that_name_nothing_in_the_model_fail_before_training() -> None:
    module = OwnModel()
    with pytest.raises(ValueError, match="layers: OwnModel has no module named 'model.layers'"):
        fit(make_strategy(0.5, sub_group_size=3000, layers="model.layers"), module=module, steps=1)
    assert module.steps_run == 0
