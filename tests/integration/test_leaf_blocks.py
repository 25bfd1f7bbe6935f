"""``leaf_blocks``: ZeRO-3 hooks each repeated block once instead of every layer in it, and training is unchanged.

The control is DeepSpeed's own ZeRO-3 offload with its hooks on every layer (``ZeRO3OffloadStrategy``); DOS runs with
the blocks as leaves (its default on one rank). Both see the same data, seed, clipping and a learning rate that
changes every step, with the blocks under activation checkpointing.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.models.gpt import GPT, GPTConfig
from lightning_dos.zero.leaf_blocks import repeated_blocks
from tests.support.blocks_model import BLOCKS, BlockLM, block_layers_hooked
from tests.support.parity import assert_tracks, make_strategy, rel, train

CLIP = 0.05
FP32_TOL = 1e-5


def test_the_blocks_are_the_modules_of_a_module_list() -> None:
    gpt = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    assert [name for name, _ in repeated_blocks(gpt)] == ["blocks.0", "blocks.1", "blocks.2"]

    class Experts(torch.nn.Module):  # a block holding its own list: only the outer list's modules are blocks
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    outer = torch.nn.ModuleList(Experts() for _ in range(2))
    assert [name for name, _ in repeated_blocks(outer)] == ["0", "1"]
    mixed = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)])
    parameterless = torch.nn.ModuleList(torch.nn.GELU() for _ in range(3))
    single = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    for model in (mixed, parameterless, single):
        assert repeated_blocks(model) == []


@pytest.mark.parametrize(("accumulate", "reentrant", "overlap"),
                         [(1, False, False), (2, False, False), (1, True, False), (1, False, True)],
                         ids=["non-reentrant", "accumulate-2", "reentrant", "overlap"])
def test_leaf_blocks_train_like_vanilla_zero3_hooking_every_layer(accumulate: int, reentrant: bool,
                                                                  overlap: bool) -> None:
    """With the update beside the next forward (``overlap``) too: the blocks' single hooks fetch the parameters the
    update in flight writes."""
    vanilla = train(None, steps=5, accumulate=accumulate, clip=CLIP, model=BlockLM(reentrant=reentrant))
    dos = train(0.5, steps=5, accumulate=accumulate, clip=CLIP, model=BlockLM(reentrant=reentrant),
                strategy=make_strategy(0.5, overlap=overlap))
    assert dos.strategy.overlapped is overlap and dos.strategy.manager.overlap is overlap
    assert block_layers_hooked(vanilla.strategy.lightning_module) == [True] * BLOCKS
    assert block_layers_hooked(dos.strategy.lightning_module) == [False] * BLOCKS
    assert dos.strategy.leaf_block_names == [f"net.blocks.{i}" for i in range(BLOCKS)]
    assert len(dos.losses) == len(vanilla.losses) == 5 * accumulate
    assert_tracks(dos, vanilla, FP32_TOL)
    initial = BlockLM()
    initial.configure_model()
    assert rel(dos.masters, torch.cat([p.detach().flatten() for p in initial.net.parameters()])) > 1e-3  # they moved


def test_leaf_blocks_false_keeps_zero3_hooks_on_every_layer() -> None:
    run = train(0.5, steps=1, model=BlockLM(), strategy=make_strategy(0.5, leaf_blocks=False))
    assert run.strategy.leaf_block_names == []
    assert block_layers_hooked(run.strategy.lightning_module) == [True] * BLOCKS


def test_a_leaf_module_entry_in_the_deepspeed_config_wins() -> None:
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 2000,
                                    "leaf_module": {"names": []}}}
    run = train(0.5, steps=1, model=BlockLM(), strategy=make_strategy(0.5, config=config))
    assert run.strategy.leaf_block_names == []
    assert block_layers_hooked(run.strategy.lightning_module) == [True] * BLOCKS


def test_a_block_whose_inputs_need_no_gradient_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"leaf_blocks: block 'net.blocks.0'.*set leaf_blocks: false"):
        train(0.5, steps=1, model=BlockLM(freeze_embedding=True))
    # without leaves the same model trains (ZeRO-3's per-parameter hooks need no input gradient)
    run = train(0.5, steps=2, model=BlockLM(freeze_embedding=True),
                strategy=make_strategy(0.5, leaf_blocks=False))
    assert len(run.losses) == 2


def test_the_blocks_backward_hooks_go_with_the_engine() -> None:
    module = BlockLM()
    run = train(0.5, steps=2, model=module)
    assert run.strategy.leaf_block_names
    # DeepSpeed reduced each block's gradients from a full backward hook on it; the teardown removed them
    assert [len(block._backward_hooks) for block in module.net["blocks"]] == [0] * BLOCKS
    refs = weakref.ref(run.strategy.model), weakref.ref(run.strategy.model.optimizer)
    del run, module
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_leaf_blocks_rejects_other_values() -> None:
    with pytest.raises(ValueError, match="leaf_blocks: 'yes'; set 'auto', true or false"):
        DeepOptimizerStatesStrategy(leaf_blocks="yes")
