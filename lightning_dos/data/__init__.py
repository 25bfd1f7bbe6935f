"""Owns the public surface of the data pipeline: the data modules, corpus preparation and their helpers."""

from lightning_dos.data.corpus import (
    CLI_NAMES,
    DATA_NAMES,
    TEXT_SUFFIXES,
    Corpus,
    OptionNames,
    read_documents,
    resolve_paths,
    stdlib_source_files,
)
from lightning_dos.data.loader import ResumableDataLoader, ResumableSampler
from lightning_dos.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    prepare_corpus,
    read_manifest,
    shard_name,
    split_indices,
    token_dtype,
    verify_prepared,
)
from lightning_dos.data.synthetic import RandomTokenWindows, SyntheticDataModule
from lightning_dos.data.text import TextDataModule, TokenWindows, manifest_sources, open_tokens
from lightning_dos.data.tokenizer import (
    EOS_TOKEN,
    atomic_write_bytes,
    cache_lock,
    corpus_fingerprint,
    default_cache_dir,
    eos_token_id,
    get_tokenizer,
    load_tokenizer,
    tokenizer_digest,
    train_bpe,
)

__all__ = [
    "CLI_NAMES",
    "DATA_NAMES",
    "DEFAULT_SHARD_TOKENS",
    "EOS_TOKEN",
    "TEXT_SUFFIXES",
    "Corpus",
    "OptionNames",
    "RandomTokenWindows",
    "ResumableDataLoader",
    "ResumableSampler",
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
    "manifest_sources",
    "open_tokens",
    "prepare_corpus",
    "read_manifest",
    "read_documents",
    "resolve_paths",
    "shard_name",
    "split_indices",
    "stdlib_source_files",
    "token_dtype",
    "tokenizer_digest",
    "train_bpe",
    "verify_prepared",
]
