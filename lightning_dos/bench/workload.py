"""Owns the benchmarked workload: the GPT model and the data it trains on, the same in every configuration.

The parent resolves the model once (for the report, the FLOP count and the no-offload fit check) and tokenises a
text corpus once, before the runs; every worker builds the model and the data module from the same settings, so all
configurations train exactly the same network on the same batches in the same order.
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


def build_module(config: BenchConfig) -> Any:
    """The GPT LightningModule, initialised from ``config.seed`` whatever ran before it in the process."""
    import torch

    from lightning_dos.models import GPTModule

    class SeededGPTModule(GPTModule):
        def configure_model(self) -> None:
            if self.model is None:
                torch.manual_seed(config.seed)
            super().configure_model()

    return SeededGPTModule(**module_kwargs(config))


def text_data(config: BenchConfig) -> Any:
    """The text data module of ``config`` (the Python standard library's sources unless ``data_paths``)."""
    from lightning_dos.data import TextDataModule

    return TextDataModule(paths=config.data_paths, tokenizer=config.tokenizer, bpe_vocab_size=config.bpe_vocab_size,
                          max_bytes=config.max_bytes, seq_len=config.seq_len, batch_size=config.micro_batch,
                          seed=config.seed)


def build_data(config: BenchConfig, vocab_size: int, devices: int = 1) -> Any:
    """The data module a worker trains on; ``vocab_size`` is the model's. Over ``devices`` data-parallel ranks the
    synthetic windows are split between them: each rank still gets ``config.steps`` batches of its own."""
    if config.data == "text":
        data = text_data(config)
        if data.vocab_size > vocab_size:
            raise ValueError(f"vocab_size: the tokenizer has {data.vocab_size} tokens but the model only "
                             f"{vocab_size}; set --vocab-size >= {data.vocab_size}")
        return data
    from lightning_dos.data import SyntheticDataModule

    return SyntheticDataModule(vocab_size=vocab_size, seq_len=config.seq_len, batch_size=config.micro_batch,
                               num_batches=config.steps * devices, seed=config.seed)


def prepare_text(config: BenchConfig) -> None:
    """Tokenise the corpus into the cache once, in the parent, and size the model's vocabulary to the tokenizer.

    With no ``vocab_size`` set, the model gets the tokenizer's vocabulary, as ``lightning-dos fit`` links it.
    """
    data = text_data(config)
    if config.vocab_size is None:
        config.vocab_size = data.vocab_size
    elif data.vocab_size > config.vocab_size:
        raise ValueError(f"vocab_size: the tokenizer has {data.vocab_size} tokens but the model only "
                         f"{config.vocab_size}; set --vocab-size >= {data.vocab_size}")
    data.prepare_data()
