"""Owns the decoder-only GPT network: its configuration, named presets, parameter and FLOP accounting.

Plain PyTorch with no knowledge of how it is trained. Two styles share one code path: ``"llama"``
(RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases) and ``"gpt2"`` (LayerNorm,
learned positions, multi-head attention, GELU, biases). Rotary tables are built per forward on the
input's device and never stored, so the model can be constructed on the meta device or sharded at
construction time (DeepSpeed ``zero.Init``) and initialised later through :meth:`GPT.init_weights`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["GPT", "GPTConfig", "PRESETS", "RMSNorm", "activation_bytes", "flops_per_token", "num_params"]

_STYLES = ("llama", "gpt2")

PRESETS: dict[str, dict[str, Any]] = {
    # tiny model for wiring checks; a few million parameters, nearly all in the embeddings
    "debug": dict(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, block_size=128),
    # ~11.0M parameters with its 4096-token vocabulary: fits a laptop CPU
    "gpt-10m": dict(n_layer=6, n_embd=320, n_head=5, vocab_size=4096),
    # The benchmark sizes are GPT-2 blocks (LayerNorm, learned positions, GELU MLP, biases, untied output), the
    # architecture the reference measurements of these sizes were taken with.
    # ~1.02B parameters
    "gpt-1b": dict(n_layer=16, n_embd=2048, n_head=16, style="gpt2"),
    # 2.78B parameters: the reference benchmark model (32 layers x 2560 hidden, seq 2048)
    "gpt-2.7b": dict(n_layer=32, n_embd=2560, n_head=32, vocab_size=50304, block_size=2048, style="gpt2"),
    # ~3.94B parameters
    "gpt-4b": dict(n_layer=32, n_embd=3072, n_head=24, style="gpt2"),
    # 6.86B, 10.09B and 12.10B parameters (32, 48 and 58 layers x 4096 hidden): sizes one 80 GB GPU and a 128 GB host
    # hold only with the optimizer state split between them; gpt-12b is the largest measured (recipes/gpt-12b.yaml)
    "gpt-6.9b": dict(n_layer=32, n_embd=4096, n_head=32, style="gpt2"),
    "gpt-10b": dict(n_layer=48, n_embd=4096, n_head=32, style="gpt2"),
    "gpt-12b": dict(n_layer=58, n_embd=4096, n_head=32, style="gpt2"),
    # The pretraining recipes' models. GPT-2 small and medium (Radford et al. 2019), tied embeddings:
    # 124,475,904 and 354,871,296 parameters at a 50304-token vocabulary
    "gpt2-124m": dict(n_layer=12, n_embd=768, n_head=12, style="gpt2", block_size=1024, tie_embeddings=True),
    "gpt2-350m": dict(n_layer=24, n_embd=1024, n_head=16, style="gpt2", block_size=1024, tie_embeddings=True),
    # LLaMA-style (RMSNorm, rotary, grouped-query attention, SwiGLU, untied output); at a 50304-token vocabulary:
    # 1.18B (TinyLlama's shape) and 3.13B parameters (Llama 3.2 3B's shape, the largest measured to train on a 128 GB
    # host: docs/recipes.md says what ran out of host memory above it)
    "llama-1b": dict(n_layer=22, n_embd=2048, n_head=32, n_kv_head=4, intermediate_size=5632),
    "llama-3b": dict(n_layer=28, n_embd=3072, n_head=24, n_kv_head=8, intermediate_size=8192),
}


@dataclass(kw_only=True)
class GPTConfig:
    """Architecture of a :class:`GPT`; derived fields (``None``) are resolved in ``__post_init__``."""

    name: str = "custom"
    """Preset name this configuration came from, for logs only."""
    vocab_size: int = 50304
    """Number of token ids; 50304 is GPT-2's 50257 padded to a multiple of 64 for fast matmuls."""
    block_size: int = 2048
    """Maximum sequence length the model accepts."""
    n_layer: int
    """Number of transformer blocks."""
    n_head: int
    """Number of query heads."""
    n_kv_head: int | None = None
    """Number of key/value heads for grouped-query attention; ``None`` means ``n_head`` (plain multi-head)."""
    n_embd: int
    """Hidden size of the residual stream."""
    intermediate_size: int | None = None
    """MLP hidden size; ``None`` means 8/3 * n_embd rounded up to a multiple of 256 (llama) or 4 * n_embd (gpt2)."""
    style: Literal["llama", "gpt2"] = "llama"
    """Block recipe: ``"llama"`` (RMSNorm, RoPE, SwiGLU) or ``"gpt2"`` (LayerNorm, learned positions, GELU)."""
    bias: bool | None = None
    """Biases in linear layers and LayerNorm; ``None`` means False for llama and True for gpt2."""
    norm_eps: float = 1e-5
    """Epsilon of the normalisation layers."""
    rope_base: float = 10000.0
    """Base of the rotary position frequencies (llama style only)."""
    tie_embeddings: bool = False
    """Share the token embedding matrix with the output projection."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of storing them."""

    def __post_init__(self) -> None:
        if self.style not in _STYLES:
            raise ValueError(f"style must be one of {_STYLES}, got {self.style!r}; set style='llama' or style='gpt2'")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                "set n_embd to a multiple of n_head"
            )
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.n_kv_head <= 0 or self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head}); "
                "set n_kv_head to a divisor of n_head, or None for multi-head attention"
            )
        if self.style == "gpt2" and self.n_kv_head != self.n_head:
            raise ValueError(
                f"style='gpt2' uses multi-head attention, but n_kv_head={self.n_kv_head} != n_head={self.n_head}; "
                "set n_kv_head=None or style='llama'"
            )
        if self.style == "llama" and self.head_dim % 2:
            raise ValueError(
                f"rotary embeddings need an even head size, got n_embd / n_head = {self.head_dim}; "
                "set n_embd and n_head so that n_embd // n_head is even"
            )
        if self.intermediate_size is None:
            if self.style == "llama":
                # SwiGLU has three matrices, so 8/3 keeps the MLP at the parameter count of a 4x GELU MLP
                self.intermediate_size = -(-8 * self.n_embd // (3 * 256)) * 256
            else:
                self.intermediate_size = 4 * self.n_embd
        if self.intermediate_size <= 0:
            raise ValueError(f"intermediate_size must be positive, got {self.intermediate_size}")
        if self.bias is None:
            self.bias = self.style == "gpt2"
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base must be positive, got {self.rope_base}")

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> GPTConfig:
        """The preset called ``name`` (see :data:`PRESETS`), with any field replaced by ``overrides``."""
        if name not in PRESETS:
            raise ValueError(f"unknown model name {name!r}; known names: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], "name": name, **overrides})


def num_params(config: GPTConfig) -> int:
    """Number of distinct parameters of ``GPT(config)``, computed without building it."""
    d, vocab, inner = config.n_embd, config.vocab_size, config.intermediate_size
    qkv_out = (config.n_head + 2 * config.n_kv_head) * config.head_dim
    attention = d * qkv_out + d * d + (qkv_out + d if config.bias else 0)
    if config.style == "llama":
        mlp = 2 * d * inner + inner * d + (2 * inner + d if config.bias else 0)
        norm = d
    else:
        mlp = d * inner + inner * d + (inner + d if config.bias else 0)
        norm = 2 * d if config.bias else d
    block = attention + mlp + 2 * norm
    positions = config.block_size * d if config.style == "gpt2" else 0
    output = 0 if config.tie_embeddings else vocab * d
    return vocab * d + positions + config.n_layer * block + norm + output


def flops_per_token(config: GPTConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token at sequence length ``seq_len``.

    ``6 * N + 12 * n_layer * n_embd * seq_len`` from Chowdhery et al. 2022, "PaLM: Scaling Language
    Modeling with Pathways", Appendix B, where ``N`` is the parameter count without the embedding
    tables but with the output projection, which is a matmul whether tied or not. The second term is
    the attention score and value matmuls. Activation recomputation is not counted (model FLOPs).
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    d, vocab = config.n_embd, config.vocab_size
    positions = config.block_size * d if config.style == "gpt2" else 0
    untied_output = 0 if config.tie_embeddings else vocab * d
    body = num_params(config) - vocab * d - positions - untied_output
    n = body + vocab * d
    return float(6 * n + 12 * config.n_layer * d * seq_len)


def activation_bytes(config: GPTConfig, micro_batch: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """An upper estimate of the activation memory of one training step on one device, in bytes.

    With ``B = micro_batch``, ``T = seq_len``, ``d = n_embd``: every block keeps ``34 * B * T * d`` bytes of 16-bit
    activations for its backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", Section 4.1, with a memory-efficient attention, whose ``T x T`` scores are not kept); with activation
    checkpointing a block keeps only its input (``2 * B * T * d``). On top of what the blocks keep comes the larger of
    two moments: the head of the backward, holding the loss's float32 log-probabilities and their gradient
    (``8 * B * T * vocab``; the 16-bit logits are freed by then), and under checkpointing a block's recompute, one
    block's activations and their gradients (``2 * 34 * B * T * d``). ``dtype_bytes`` is the activations' width (2 for
    bf16/fp16, 4 for fp32); the 34 is for 16-bit activations and scales with it. Measured on a GPU host (56 x 4096,
    micro-batch 4 x 2048, checkpointed): the first step's peak held 3.66 GiB of the blocks' inputs and 1.54 GiB of
    float32 log-probabilities beside the gradients, against this estimate's 3.50 + 3.07.
    """
    if micro_batch <= 0 or seq_len <= 0:
        raise ValueError(f"micro_batch and seq_len must be positive, got {micro_batch} and {seq_len}")
    scale = dtype_bytes / 2
    tokens = micro_batch * seq_len
    block = 34 * tokens * config.n_embd * scale
    kept = config.n_layer * (tokens * config.n_embd * dtype_bytes if config.activation_checkpointing else block)
    recompute = 2 * block if config.activation_checkpointing else 0
    loss = 8 * tokens * config.vocab_size
    return int(kept + max(recompute, loss))


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich 2019), computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's rms_norm accumulates 16-bit inputs in float32 and is one fused kernel on CUDA (eight
        # element-wise kernels over the whole activation when written out, in the forward and again in the
        # recomputed forward of activation checkpointing)
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def _norm(config: GPTConfig) -> nn.Module:
    if config.style == "llama":
        return RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=bool(config.bias))


def _rope_tables(
    seq_len: int, head_dim: int, base: float, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary cos/sin tables of shape ``[seq_len, 1, head_dim]`` (rotate-half layout) in ``dtype``.

    The angles are computed in float32 and only the finished tables are rounded to ``dtype``. The middle
    axis broadcasts over heads, for activations laid out ``[batch, seq, heads, head_dim]``.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[batch, seq, heads, head_dim]``) in its own dtype, as Llama does."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class CausalSelfAttention(nn.Module):
    """Causal self-attention with an optional rotary embedding and grouped key/value heads."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        # one fused projection: a single matmul, and one parameter to gather under ZeRO-3 instead of three
        self.qkv = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_projection = True

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, seq_len, width = x.shape
        heads = self.n_head + 2 * self.n_kv_head
        qkv = self.qkv(x).view(batch, seq_len, heads, self.head_dim)
        qk, v = qkv.split((self.n_head + self.n_kv_head, self.n_kv_head), dim=2)
        if cos is not None and sin is not None:
            qk = _apply_rope(qk, cos, sin)  # queries and keys together: one set of kernels, not two
        q, k = qk.split((self.n_head, self.n_kv_head), dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.n_kv_head != self.n_head:
            # explicit repeat rather than SDPA's enable_gqa, which older torch releases lack
            repeats = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq_len, width))


class SwiGLU(nn.Module):
    """Gated MLP of llama: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)
        self.proj.residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class GELUMLP(nn.Module):
    """MLP of GPT-2: ``proj(gelu(fc(x)))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)
        self.proj.residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: attention and MLP, each added to the residual stream."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm_1 = _norm(config)
        self.attn = CausalSelfAttention(config)
        self.norm_2 = _norm(config)
        self.mlp = SwiGLU(config) if config.style == "llama" else GELUMLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), cos, sin)
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    """Decoder-only transformer mapping token ids ``[B, T]`` to next-token logits ``[B, T, vocab_size]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.style == "gpt2" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = _norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.init_weights()

    def init_weights(self) -> None:
        """(Re)initialise every parameter; call again after materialising a meta-device model.

        Goes through ``Module.apply`` because DeepSpeed's ``zero.Init`` gathers sharded parameters
        around each applied function.
        """
        if self.config.tie_embeddings and self.lm_head.weight is not self.wte.weight:
            # Module.to_empty replaces parameters one by one and unties them
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_module)

    def _init_module(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_projection", False):
                # GPT-2 scaling: keeps the residual stream's variance flat across 2 * n_layer additions
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab_size]`` for token ids ``idx`` of shape ``[B, T]``."""
        _, seq_len = idx.shape
        if seq_len > self.config.block_size:
            raise ValueError(
                f"sequence length {seq_len} exceeds block_size {self.config.block_size}; "
                "shorten the input or set block_size higher"
            )
        x = self.wte(idx)
        cos = sin = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(seq_len, device=idx.device))
        else:
            cos, sin = _rope_tables(seq_len, self.config.head_dim, self.config.rope_base, idx.device, x.dtype)
        checkpointing = self.config.activation_checkpointing and self.training
        for block in self.blocks:
            if checkpointing:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.lm_head(self.norm_f(x))
