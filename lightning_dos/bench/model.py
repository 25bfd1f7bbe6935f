"""Owns the mapping from bench settings to the benchmarked model: GPTModule arguments and the resolved GPTConfig.

The parent resolves the model once (for the report, the FLOP count and the no-offload fit check) and every
worker builds it from the same arguments, so all configurations train exactly the same network.
"""

from __future__ import annotations

from typing import Any

from lightning_dos.bench.config import BenchConfig
from lightning_dos.models.gpt import GPTConfig, flops_per_token, num_params

GIB = 1024**3
#: Lower bound of the bytes ZeRO-3 keeps per parameter without offload: 16-bit param and grad, fp32 master, m, v.
NO_OFFLOAD_BYTES_PER_PARAM = 16


def module_kwargs(config: BenchConfig) -> dict[str, Any]:
    """Keyword arguments of :class:`~lightning_dos.models.GPTModule` for ``config``."""
    overrides = {"vocab_size": config.vocab_size, "n_layer": config.n_layer, "n_embd": config.n_embd,
                 "n_head": config.n_head}
    return dict(
        name=config.model,
        block_size=config.seq_len,
        activation_checkpointing=config.activation_checkpointing,
        learning_rate=config.learning_rate,
        warmup_steps=0,
        max_steps=config.steps,
        **{key: value for key, value in overrides.items() if value is not None},
    )


def gpt_config(config: BenchConfig) -> GPTConfig:
    """The network's resolved architecture (the preset with the bench's overrides), built without the model."""
    kwargs = module_kwargs(config)
    name = kwargs.pop("name")
    for key in ("learning_rate", "warmup_steps", "max_steps"):
        kwargs.pop(key)
    return GPTConfig.from_name(name, **kwargs)


def describe_model(config: BenchConfig) -> dict[str, Any]:
    """The resolved model for results.json and the report: shape, parameter count, FLOPs per token."""
    gpt = gpt_config(config)
    params = num_params(gpt)
    per_token = flops_per_token(gpt, config.seq_len)
    return {
        "preset": config.model,
        "style": gpt.style,
        "n_layer": gpt.n_layer,
        "n_embd": gpt.n_embd,
        "n_head": gpt.n_head,
        "n_kv_head": gpt.n_kv_head,
        "intermediate_size": gpt.intermediate_size,
        "vocab_size": gpt.vocab_size,
        "block_size": gpt.block_size,
        "params": params,
        "flops_per_token": per_token,
        "no_offload_state_gib_lower_bound": params * NO_OFFLOAD_BYTES_PER_PARAM / GIB,
    }
