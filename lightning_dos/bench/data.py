"""Owns the bench's data modules: deterministic random tokens, or a tokenised text corpus.

Both the parent (to tokenise a corpus once, before the runs, and to size the vocabulary) and every worker build
the data module here, from the same settings, so all configurations see the same batches in the same order.
"""

from __future__ import annotations

from typing import Any

from lightning_dos.bench.config import BenchConfig


def text_data(config: BenchConfig) -> Any:
    """The text data module of ``config`` (the Python standard library's sources unless ``data_paths``)."""
    from lightning_dos.data import TextDataModule

    return TextDataModule(paths=config.data_paths, tokenizer=config.tokenizer, bpe_vocab_size=config.bpe_vocab_size,
                          max_bytes=config.max_bytes, seq_len=config.seq_len, batch_size=config.micro_batch,
                          seed=config.seed)


def build_data(config: BenchConfig, vocab_size: int) -> Any:
    """The data module a worker trains on; ``vocab_size`` is the model's."""
    if config.data == "text":
        data = text_data(config)
        if data.vocab_size > vocab_size:
            raise ValueError(f"vocab_size: the tokenizer has {data.vocab_size} tokens but the model only "
                             f"{vocab_size}; set --vocab-size >= {data.vocab_size}")
        return data
    from lightning_dos.data import SyntheticDataModule

    return SyntheticDataModule(vocab_size=vocab_size, seq_len=config.seq_len, batch_size=config.micro_batch,
                               num_batches=config.steps, seed=config.seed)


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
