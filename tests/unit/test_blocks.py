"""The repeated blocks of any transformer, found one way for activation offload and ZeRO-3's leaf blocks.

The rule (``lightning_dos.blocks``): the children of the model's largest ``nn.ModuleList`` / ``nn.Sequential`` of one
block class; ``layers`` / ``layer_types`` override it; a model with no repeated blocks has none, which activation
offload refuses in one error naming what to set.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dos import DeepOptimizerStatesStrategy
from lightning_dos.activations import ActivationOffload, ActivationOffloadCallback
from lightning_dos.blocks import find_blocks, repeated_blocks
from lightning_dos.models.gpt import GPT, GPTConfig
from lightning_dos.zero.leaf_blocks import mark_leaf_blocks
from tests.support.parity import TinyLM


def _names(found: list[tuple[str, nn.Module]]) -> list[str]:
    return [name for name, _ in found]


class Block(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class SequentialStack(nn.Module):
    """timm's and many vision transformers' layout: ``self.blocks = nn.Sequential(*blocks)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.Sequential(*(Block() for _ in range(3)))
        self.head = nn.Linear(8, 10)


class DecoderLayer(nn.Module):
    """A Hugging Face decoder layer's layout: attention projections, an MLP, two norms, and (MoE) a list of experts."""

    def __init__(self, hidden: int = 8, experts: int = 4) -> None:
        super().__init__()
        self.self_attn = nn.ModuleDict({k: nn.Linear(hidden, hidden, bias=False) for k in ("q", "k", "v", "o")})
        self.experts = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(experts))
        self.input_layernorm = nn.LayerNorm(hidden)
        self.post_attention_layernorm = nn.LayerNorm(hidden)


class HFStyleLM(nn.Module):
    """``LlamaForCausalLM``'s layout: ``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(10, 8)
        self.model.layers = nn.ModuleList(DecoderLayer() for _ in range(layers))
        self.model.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 10, bias=False)


def test_torch_transformer_encoder() -> None:
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
    model = nn.Sequential(nn.Embedding(10, 16), nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False))
    assert _names(repeated_blocks(model)) == ["1.layers.0", "1.layers.1", "1.layers.2"]


def test_a_sequential_stack() -> None:
    assert _names(repeated_blocks(SequentialStack())) == ["blocks.0", "blocks.1", "blocks.2"]


def test_a_hugging_face_style_model_with_experts_inside_its_blocks() -> None:
    """Two decoder layers of four experts each: the layers hold more parameters than any layer's experts."""
    found = repeated_blocks(HFStyleLM(layers=2))
    assert _names(found) == ["model.layers.0", "model.layers.1"]
    assert all(type(block) is DecoderLayer for _, block in found)


def test_a_hugging_face_transformers_model() -> None:
    import transformers  # the test extra installs it (pyproject.toml): a missing one fails here, not skips
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    model = transformers.LlamaForCausalLM(config)
    found = repeated_blocks(model)
    assert _names(found) == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert {type(block).__name__ for _, block in found} == {"LlamaDecoderLayer"}


def test_a_torchtitan_style_module_dict() -> None:
    """torchtitan keeps its blocks in ``self.layers = nn.ModuleDict()`` keyed "0", "1", ... (pipeline stages drop
    some); a block's own dict of projections (the same class, four of them) is smaller."""
    model = nn.Module()
    model.tok_embeddings = nn.Embedding(10, 8)
    model.layers = nn.ModuleDict({str(i): DecoderLayer() for i in range(3)})
    model.output = nn.Linear(8, 10)
    assert _names(repeated_blocks(model)) == ["layers.0", "layers.1", "layers.2"]


def test_this_packages_gpt() -> None:
    gpt = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    assert _names(repeated_blocks(gpt)) == ["blocks.0", "blocks.1", "blocks.2"]


def test_no_repeated_blocks() -> None:
    tiny = TinyLM()
    tiny.configure_model()  # Embedding, Linear, GELU, Linear, LayerNorm, Linear: one Sequential of mixed classes
    mixed = nn.ModuleList([nn.Linear(4, 4), nn.LayerNorm(4)])
    parameterless = nn.ModuleList(nn.GELU() for _ in range(3))
    single = nn.ModuleList([nn.Linear(4, 4)])
    for model in (tiny, mixed, parameterless, single, nn.Linear(2, 2)):
        assert repeated_blocks(model) == []
    # leaf blocks: nothing to mark, nothing changes; activation offload: one error saying what to set
    assert mark_leaf_blocks(tiny) == []
    with pytest.raises(ValueError, match=r"layers: found no repeated blocks \(no nn.ModuleList, nn.Sequential or "
                                         r"nn.ModuleDict .*\) in TinyLM, .* set layers .*'model.layers'.* or "
                                         r"layer_types"):
        ActivationOffload("keep", layers=tiny)


def test_the_largest_counts_partitioned_parameters_whole_and_the_outermost_wins_a_tie() -> None:
    """Under ZeRO-3 every parameter is an empty partition with its size in ``ds_numel``."""
    model = nn.Module()
    model.small = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))  # first met, fewer parameters
    model.big = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
    for p in model.parameters():
        p.ds_numel = p.numel()
        p.data = torch.empty(0)
    assert _names(repeated_blocks(model)) == ["big.0", "big.1"]
    # blocks that are stacks themselves: each inner stack is smaller than the one holding the blocks
    outer = nn.ModuleList([nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)) for _ in range(2)])
    assert _names(repeated_blocks(outer)) == ["0", "1"]


def test_overrides() -> None:
    model = HFStyleLM(layers=3)
    assert _names(find_blocks(model, layer_types=[DecoderLayer])) == [f"model.layers.{i}" for i in range(3)]
    assert _names(find_blocks(model, layer_types=["DecoderLayer"])) == [f"model.layers.{i}" for i in range(3)]
    assert _names(find_blocks(model, layer_types=[f"{__name__}.DecoderLayer"])) == [f"model.layers.{i}"
                                                                                  for i in range(3)]
    assert _names(find_blocks(model, layer_types=["Linear"]))[:2] == ["model.layers.0.self_attn.q",
                                                                      "model.layers.0.self_attn.k"]
    assert _names(find_blocks(model, layers="model.layers")) == [f"model.layers.{i}" for i in range(3)]
    assert _names(find_blocks(model, layers=["model.layers.0", "model.layers.2"])) == ["model.layers.0",
                                                                                      "model.layers.2"]
    with pytest.raises(ValueError, match=r"layers: HFStyleLM has no module named 'model.blocks'; .*'model.layers'"):
        find_blocks(model, layers="model.blocks")
    with pytest.raises(ValueError, match="layers: found no module of type Block in HFStyleLM, and leaf_blocks"):
        mark_leaf_blocks(model, layer_types=["Block"])


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(layers=3), "layers: 3 is not a module name or a list of them"),
    (dict(layers=[]), r"layers: \[\] is not a module name"),
    (dict(layer_types="Block"), "layer_types: 'Block' is not a list of block classes or class names"),
    (dict(layer_types=[3]), r"layer_types: \[3\] is not a list"),
])
def test_bad_overrides_are_refused_when_the_strategy_is_made(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeepOptimizerStatesStrategy(**kwargs)
    with pytest.raises(ValueError, match=message):
        ActivationOffloadCallback("host", **kwargs)
