"""CPU tests of the GPT network, its accounting, and its pretraining LightningModule (trained by Lightning:
tests/integration/test_model_fit.py)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from lightning_dos.models import GPT, GPTConfig, GPTModule, flops_per_token, lr_factor, num_params
from lightning_dos.models.gpt import RMSNorm, _apply_rope, _rope_tables
from lightning_dos.optim import weight_decay_groups

STYLES = ("llama", "gpt2")


def tiny_config(style: str = "llama", **overrides) -> GPTConfig:
    fields = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32, style=style)
    if style == "llama":
        fields["n_kv_head"] = 2
    return GPTConfig(**{**fields, **overrides})


def tokens(config: GPTConfig, batch: int = 2, seq_len: int = 12, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq_len), generator=generator)


@pytest.mark.parametrize("style", STYLES)
def test_forward_shape_and_dtype(style: str) -> None:
    config = tiny_config(style)
    logits = GPT(config)(tokens(config, batch=3, seq_len=10))
    assert logits.shape == (3, 10, config.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_forward_rejects_sequences_longer_than_block_size() -> None:
    config = tiny_config()
    with pytest.raises(ValueError, match="block_size"):
        GPT(config)(tokens(config, seq_len=config.block_size + 1))


@pytest.mark.parametrize("style", STYLES)
def test_causal_masking(style: str) -> None:
    torch.manual_seed(0)
    config = tiny_config(style)
    model = GPT(config).eval()
    idx = tokens(config, seq_len=12)
    cut = 5
    changed = idx.clone()
    changed[:, cut + 1 :] = (idx[:, cut + 1 :] + 1 + torch.arange(12 - cut - 1)) % config.vocab_size
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, : cut + 1], after[:, : cut + 1])
    # the future tokens do matter somewhere, so the equality above is not vacuous
    assert not torch.allclose(before[:, cut + 1 :], after[:, cut + 1 :])


@pytest.mark.parametrize("style", STYLES)
def test_initial_loss_is_near_uniform(style: str) -> None:
    torch.manual_seed(0)
    config = tiny_config(style, vocab_size=256)
    idx = tokens(config, batch=4, seq_len=16)
    logits = GPT(config)(idx)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.roll(-1, dims=1).flatten())
    assert abs(loss.item() - math.log(config.vocab_size)) < 0.5


def test_grouped_query_attention_has_fewer_kv_params() -> None:
    gqa_config, mha_config = tiny_config(n_kv_head=1), tiny_config(n_kv_head=None)
    assert mha_config.n_kv_head == mha_config.n_head
    gqa, mha = GPT(gqa_config), GPT(mha_config)
    saved = 2 * (mha_config.n_head - gqa_config.n_kv_head) * gqa_config.head_dim * gqa_config.n_embd
    gqa_attn = sum(p.numel() for p in gqa.blocks[0].attn.parameters())
    mha_attn = sum(p.numel() for p in mha.blocks[0].attn.parameters())
    assert mha_attn - gqa_attn == saved
    logits = gqa(tokens(gqa_config))
    assert logits.shape == (2, 12, gqa_config.vocab_size)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("bias", [None, True, False])
def test_num_params_matches_built_model(style: str, tie: bool, bias: bool | None) -> None:
    config = tiny_config(style, tie_embeddings=tie, bias=bias)
    model = GPT(config)
    assert num_params(config) == sum(p.numel() for p in model.parameters())
    assert (model.lm_head.weight is model.wte.weight) == tie


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("debug", 5e6, 8e6),
        ("gpt-10m", 9e6, 12e6),
        ("gpt-1b", 0.95e9, 1.1e9),
        ("gpt-2.7b", 2.7e9, 2.85e9),
        ("gpt-4b", 3.8e9, 4.2e9),
        ("gpt-6.9b", 6.8e9, 6.9e9),
        ("gpt-10b", 10.0e9, 10.2e9),
    ],
)
def test_preset_param_counts(name: str, low: float, high: float) -> None:
    config = GPTConfig.from_name(name)
    assert config.name == name
    assert low <= num_params(config) <= high


def test_reference_preset_shape() -> None:
    config = GPTConfig.from_name("gpt-2.7b")
    assert (config.n_layer, config.n_embd, config.n_head) == (32, 2560, 32)
    assert (config.vocab_size, config.block_size, config.intermediate_size) == (50304, 2048, 4 * 2560)
    assert (config.style, config.bias, config.tie_embeddings) == ("gpt2", True, False)
    # the reference host's 2.78B GPT: 32 * (12 d^2 + 13 d) + (50304 + 2048) d + 50304 d + 2 d
    assert num_params(config) == 2_780_451_840


def test_from_name_overrides_and_unknown_name() -> None:
    config = GPTConfig.from_name("debug", vocab_size=123, n_layer=3)
    assert (config.vocab_size, config.n_layer, config.n_embd) == (123, 3, 64)
    with pytest.raises(ValueError, match="gpt-2.7b"):
        GPTConfig.from_name("gpt-3")


def test_flops_per_token_exact() -> None:
    # d=8, L=1, V=10, I=256, llama, untied, MHA with 2 heads:
    # qkv 8*24 + proj 8*8 = 256; mlp 8*512 + 256*8 = 6144; norms 2*8; final norm 8; output 10*8 = 80
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=2, n_embd=8)
    n = 256 + 6144 + 16 + 8 + 80
    assert n == 6504
    assert flops_per_token(config, seq_len=4) == 6 * 6504 + 12 * 1 * 8 * 4 == 39_408.0
    # tying removes a parameter but not the output matmul
    tied = GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=2, n_embd=8, tie_embeddings=True)
    assert flops_per_token(tied, seq_len=4) == 39_408.0
    # gpt2 style: learned positions are a lookup, not a matmul
    gpt2 = GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=2, n_embd=8, style="gpt2")
    non_embedding = num_params(gpt2) - 10 * 8 - 4 * 8
    assert flops_per_token(gpt2, seq_len=2) == 6 * non_embedding + 12 * 8 * 2


@pytest.mark.parametrize("style", STYLES)
def test_activation_checkpointing_matches_plain_backward(style: str) -> None:
    torch.manual_seed(0)
    config = tiny_config(style)
    plain = GPT(config)
    checkpointed = copy.deepcopy(plain)
    checkpointed.config = dataclasses.replace(config, activation_checkpointing=True)
    idx = tokens(config)
    losses = []
    for model in (plain, checkpointed):
        model.train()
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, dims=1).flatten())
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("style", STYLES)
def test_meta_device_construction_then_materialise(style: str) -> None:
    config = tiny_config(style, tie_embeddings=True, n_layer=8, n_embd=128, vocab_size=512)
    with torch.device("meta"):
        model = GPT(config)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    assert model.lm_head.weight is model.wte.weight
    assert num_params(config) == sum(p.numel() for p in model.parameters())
    assert torch.allclose(model.norm_f.weight, torch.ones(config.n_embd))
    assert abs(model.wte.weight.std().item() - 0.02) < 0.002
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    assert abs(model.blocks[0].mlp.proj.weight.std().item() - residual_std) < 0.1 * residual_std
    if config.bias:
        assert torch.count_nonzero(model.blocks[0].attn.qkv.bias) == 0
    assert torch.isfinite(model(tokens(config))).all()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(n_embd=30, n_head=4), "n_embd"),
        (dict(n_head=4, n_kv_head=3), "n_kv_head"),
        (dict(style="bert"), "style"),
        (dict(style="gpt2", n_kv_head=2), "n_kv_head"),
        (dict(n_layer=0), "n_layer"),
        (dict(n_embd=24, n_head=8), "n_embd"),  # head size 3 cannot be rotated
    ],
)
def test_config_validation_names_the_field(overrides: dict, field: str) -> None:
    fields = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32)
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{**fields, **overrides})


def test_config_resolves_derived_fields() -> None:
    llama = GPTConfig(n_layer=1, n_head=2, n_embd=64)
    gpt2 = GPTConfig(n_layer=1, n_head=2, n_embd=64, style="gpt2")
    assert (llama.n_kv_head, llama.intermediate_size, llama.bias) == (2, 256, False)
    assert (gpt2.n_kv_head, gpt2.intermediate_size, gpt2.bias) == (2, 256, True)
    assert GPTConfig(n_layer=1, n_head=2, n_embd=2560).intermediate_size == 6912


def test_lr_factor_exact_values() -> None:
    warmup, total, floor = 10, 110, 0.1
    assert lr_factor(0, warmup, total, floor) == 0.0
    assert lr_factor(5, warmup, total, floor) == 0.5
    assert lr_factor(10, warmup, total, floor) == 1.0
    # halfway through the decay, cos(pi / 2) = 0 leaves the midpoint of 1 and the floor
    assert lr_factor(60, warmup, total, floor) == pytest.approx(0.55, abs=1e-12)
    assert lr_factor(110, warmup, total, floor) == 0.1
    assert lr_factor(500, warmup, total, floor) == 0.1
    assert lr_factor(0, 0, 4, 0.0) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
    ],
)
def test_module_validates_arguments(kwargs: dict, arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        GPTModule(name="debug", **kwargs)


def test_module_builds_model_lazily_once() -> None:
    module = GPTModule(name="debug", vocab_size=64, n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)
    assert module.model is None
    assert module.config.n_kv_head == 1 and module.config.vocab_size == 64 and module.config.n_layer == 1
    module.configure_model()
    model = module.model
    module.configure_model()
    assert module.model is model
    assert module.hparams.name == "debug" and module.hparams.learning_rate == 3e-4


def test_weight_decay_grouping_sees_through_zero3_partitioning() -> None:
    # ZeRO-3 leaves a partitioned parameter as an empty 1-D tensor with its real shape in ds_shape
    partitioned = torch.nn.Parameter(torch.empty(0))
    partitioned.ds_shape = torch.Size([64, 256])
    norm = torch.nn.Parameter(torch.ones(64))
    decay, no_decay = weight_decay_groups([partitioned, norm], 0.1)
    assert decay["params"] == [partitioned] and decay["weight_decay"] == 0.1
    assert no_decay["params"] == [norm] and no_decay["weight_decay"] == 0.0
    assert weight_decay_groups([norm], 0.1) == [{"params": [norm], "weight_decay": 0.0}]  # no empty group


def _rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def _rope_reference(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding written pair by pair: dims (j, j + D/2) of position t rotate by t * base^(-2j/D)."""
    _, seq_len, _, dim = x.shape
    half = dim // 2
    out = torch.empty_like(x, dtype=torch.float64)
    xd = x.double()
    for j in range(half):
        angle = torch.arange(seq_len, dtype=torch.float64) * base ** (-2 * j / dim)
        cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
        a, b = xd[..., j], xd[..., j + half]
        out[..., j] = a * cos - b * sin
        out[..., j + half] = b * cos + a * sin
    return out


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_rmsnorm_and_rope_match_their_formulas(dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    norm = norm.to(dtype)
    x = (torch.randn(2, 7, 48) * 3).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), _rmsnorm_reference(x, norm.weight, 1e-5), atol=tol, rtol=tol)

    heads = torch.randn(2, 9, 3, 16).to(dtype)  # [batch, seq, heads, head_dim]
    cos, sin = _rope_tables(9, 16, 10000.0, torch.device("cpu"), dtype)
    rotated = _apply_rope(heads, cos, sin)
    assert rotated.dtype == dtype and rotated.shape == heads.shape
    torch.testing.assert_close(rotated.double(), _rope_reference(heads, 10000.0), atol=2 * tol, rtol=2 * tol)


def test_the_activation_estimate_follows_its_terms() -> None:
    """``activation_bytes``: per block 34 B*T*d 16-bit bytes kept, or only the block's input (2 B*T*d) under
    checkpointing; plus the larger of the loss's float32 log-probabilities and gradient (8 B*T*V) and, under
    checkpointing, one block's recompute with its gradients; linear in the micro-batch."""
    from lightning_dos.models.gpt import GPTConfig, activation_bytes

    plain = GPTConfig(n_layer=4, n_head=4, n_embd=64, vocab_size=100, block_size=32)
    ckpt = GPTConfig(n_layer=4, n_head=4, n_embd=64, vocab_size=100, block_size=32, activation_checkpointing=True)
    wide = GPTConfig(n_layer=4, n_head=4, n_embd=64, vocab_size=1000, block_size=32, activation_checkpointing=True)
    tokens = 2 * 32
    assert activation_bytes(plain, 2, 32) == 4 * 34 * tokens * 64 + 8 * tokens * 100
    # the recompute (2 * 34 * 64 per token) outweighs the loss at a vocabulary of 100, the loss at 1000
    assert activation_bytes(ckpt, 2, 32) == 4 * 2 * tokens * 64 + 2 * 34 * tokens * 64
    assert activation_bytes(wide, 2, 32) == 4 * 2 * tokens * 64 + 8 * tokens * 1000
    assert activation_bytes(ckpt, 4, 32) == 2 * activation_bytes(ckpt, 2, 32)
    # the blocks' activations scale with their width, the float32 loss does not
    assert activation_bytes(plain, 2, 32, dtype_bytes=4) == 2 * 4 * 34 * tokens * 64 + 8 * tokens * 100
