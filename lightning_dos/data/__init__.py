"""Owns the public surface of the data pipeline: the data modules and the corpus/tokenizer helpers."""

from lightning_dos.data.corpus import TEXT_SUFFIXES, read_documents, resolve_paths, stdlib_source_files
from lightning_dos.data.synthetic import RandomTokenWindows, SyntheticDataModule
from lightning_dos.data.text import (
    TextDataModule,
    TokenWindows,
    default_cache_dir,
    open_tokens,
    split_indices,
    token_dtype,
)
from lightning_dos.data.tokenizer import (
    EOS_TOKEN,
    atomic_write_bytes,
    cache_lock,
    corpus_fingerprint,
    eos_token_id,
    get_tokenizer,
    load_tokenizer,
    tokenizer_digest,
    train_bpe,
)

__all__ = [
    "EOS_TOKEN",
    "TEXT_SUFFIXES",
    "RandomTokenWindows",
    "SyntheticDataModule",
    "TextDataModule",
    "TokenWindows",
    "atomic_write_bytes",
    "cache_lock",
    "corpus_fingerprint",
    "default_cache_dir",
    "eos_token_id",
    "get_tokenizer",
    "load_tokenizer",
    "open_tokens",
    "read_documents",
    "resolve_paths",
    "split_indices",
    "stdlib_source_files",
    "token_dtype",
    "tokenizer_digest",
    "train_bpe",
]
