"""Owns the text pretraining data module: corpus -> tokenizer -> prepared token shards -> (x, y) windows.

Four sources, exactly one used: text files (``data.paths``, default: the Python standard library), a Hugging
Face dataset (``data.hf_dataset``), a directory written by ``lightning-dos prepare`` (``data.dataset``), or
pre-tokenised shards (``data.shards``). Text corpora are tokenised by :func:`~lightning_dos.data.prepare.
prepare_corpus` into a prepared directory under ``cache_dir`` keyed by corpus, tokenizer, seed and val_fraction,
so it is built once, and read back exactly like a ``data.dataset`` directory.
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from lightning_dos.data.corpus import DATA_NAMES, Corpus
from lightning_dos.data.loader import ResumableDataLoader, ResumableSampler
from lightning_dos.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    MANIFEST_NAME,
    check_int,
    obtain_tokenizer,
    prepare_corpus,
    read_manifest,
    split_indices,
    token_dtype,
)
from lightning_dos.data.tokenizer import cache_lock, default_cache_dir, load_tokenizer, tokenizer_digest

__all__ = [
    "TextDataModule",
    "TokenWindows",
    "default_cache_dir",
    "manifest_sources",
    "open_tokens",
    "split_indices",
    "token_dtype",
]

# Bumped when the cache layout changes, so old token caches are not silently reused (2: prepared directories).
_TOKEN_CACHE_VERSION = 2


class TokenWindows(Dataset):
    """Non-overlapping windows over 1-D token arrays on disk: item i -> (x, y), y is x shifted by one.

    ``sources`` are ``(path, dtype, start, stop)``; ``dtype`` None means a ``.npy`` file. Windows never
    cross a source boundary. Arrays are memory-mapped lazily per process, so pickling the dataset to a
    DataLoader worker copies paths, not tokens.
    """

    def __init__(self, sources: list[tuple[str, str | None, int, int]], seq_len: int) -> None:
        self.sources = [(str(p), dt, int(a), int(b)) for p, dt, a, b in sources]
        self.seq_len = seq_len
        counts = [max(0, (stop - start - 1) // seq_len) for _, _, start, stop in self.sources]
        self._offsets = np.cumsum([0, *counts]).tolist()
        self._arrays: dict[int, np.ndarray] = {}

    @property
    def num_tokens(self) -> int:
        return sum(stop - start for _, _, start, stop in self.sources)

    def __len__(self) -> int:
        return self._offsets[-1]

    def _array(self, k: int) -> np.ndarray:
        if k not in self._arrays:
            self._arrays[k] = open_tokens(self.sources[k][0], self.sources[k][1])
        return self._arrays[k]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {len(self)} windows")
        k = bisect.bisect_right(self._offsets, index) - 1
        begin = self.sources[k][2] + (index - self._offsets[k]) * self.seq_len
        chunk = torch.from_numpy(np.asarray(self._array(k)[begin : begin + self.seq_len + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = {}  # memmaps are reopened in the worker instead of being copied into the pickle
        return state


def open_tokens(path: str | os.PathLike, dtype: str | None) -> np.ndarray:
    """Memory-map a token file: ``.npy`` (dtype None) or a raw binary of ``dtype``."""
    if dtype is None:
        return np.load(path, mmap_mode="r")
    if os.path.getsize(path) == 0:  # np.memmap refuses empty files; an empty split is reported in setup
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def manifest_sources(root: str | os.PathLike, manifest: dict[str, Any]) -> tuple[list, list]:
    """(train, val) :class:`TokenWindows` sources of a prepared directory, one per shard, in manifest order."""
    sources: dict[str, list] = {"train": [], "val": []}
    for shard in manifest["shards"]:
        sources[shard["split"]].append((str(Path(root) / shard["file"]), manifest["dtype"], 0, int(shard["tokens"])))
    return sources["train"], sources["val"]


class TextDataModule(pl.LightningDataModule):
    """GPT-style pretraining data: contiguous token windows from a text corpus, split by document.

    Args:
        paths: Text files, directories (recursive, text-like files) or glob patterns. None (with no other
            source) trains on the Python standard library's ``.py`` files, which every machine has.
        hf_dataset: A Hugging Face dataset name or local dataset path (needs ``pip install 'lightning-dos[hf]'``).
        hf_split: The split of ``hf_dataset`` to read; the val split is carved out of it by document.
        hf_text_field: The column of ``hf_dataset`` holding the text.
        shards: A glob of pre-tokenised shards: ``.npy`` (1-D integer) or raw ``.bin`` uint16 token files.
            Several shards are split by file, a single shard by its tail.
        tokenizer: A ``tokenizer.json`` path or a Hugging Face hub tokenizer name. None trains a byte-level
            BPE on the corpus (cached). Not used with ``shards``; with ``dataset`` it must be the tokenizer the
            directory was prepared with (it is checked), and None uses the directory's own.
        bpe_vocab_size: Vocabulary size of the BPE trained when ``tokenizer`` is None.
        max_bytes: Read at most this many bytes of text (None: everything); bounds tokenizer training and
            tokenisation time.
        seq_len: Tokens per training window (the model's context length).
        batch_size: Windows per batch, per device.
        num_workers: DataLoader worker processes.
        val_fraction: Fraction of documents (or shards) held out for validation; at least one.
        seed: Seeds the train/val split and the train order (epoch ``e`` is shuffled with ``seed + e``).
        cache_dir: Where tokenizers and prepared token caches live. None: ``$LIGHTNING_DOS_CACHE`` or
            ``~/.cache/lightning-dos``.
        hf_config: The configuration name of ``hf_dataset`` (e.g. ``wikitext-103-raw-v1``), if it has several.
        shards_vocab_size: Vocabulary size reported for ``shards`` (their token ids must be below it).
        dataset: A directory written by ``lightning-dos prepare --out DIR``: its manifest fixes the vocabulary,
            the train/val split and the shards (``paths``, ``max_bytes``, ``val_fraction`` do not apply).
    """

    def __init__(
        self,
        paths: list[str] | None = None,
        hf_dataset: str | None = None,
        hf_split: str = "train",
        hf_text_field: str = "text",
        shards: str | None = None,
        tokenizer: str | None = None,
        bpe_vocab_size: int = 4096,
        max_bytes: int | None = 16_000_000,
        seq_len: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        seed: int = 1234,
        cache_dir: str | None = None,
        hf_config: str | None = None,
        shards_vocab_size: int = 50304,
        dataset: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        chosen = [key for key, value in (("paths", paths), ("hf_dataset", hf_dataset), ("shards", shards),
                                         ("dataset", dataset)) if value is not None]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join('data.' + k for k in chosen)} are set together; they are alternative "
                             "corpora: set only one of data.paths, data.hf_dataset, data.shards, data.dataset")
        check_int("data.seq_len", seq_len, 1)
        check_int("data.batch_size", batch_size, 1)
        check_int("data.num_workers", num_workers, 0)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be strictly between 0 and 1, got {val_fraction} (e.g. 0.05)")
        if max_bytes is not None:
            check_int("data.max_bytes", max_bytes, 1, hint=" (or null to read the whole corpus)")
        if shards is None and dataset is None and tokenizer is None:
            check_int("data.bpe_vocab_size", bpe_vocab_size, 257, hint=" (256 bytes + <|endoftext|>)")
        if shards is not None and tokenizer is not None:
            raise ValueError("data.tokenizer is not used with data.shards (shards are already token ids): remove "
                             "data.tokenizer and set data.shards_vocab_size to the shards' vocabulary size")
        check_int("data.shards_vocab_size", shards_vocab_size, 1)

        self.paths, self.hf_dataset, self.hf_config = paths, hf_dataset, hf_config
        self.hf_split, self.hf_text_field, self.shards, self.dataset = hf_split, hf_text_field, shards, dataset
        self.tokenizer, self.bpe_vocab_size, self.max_bytes = tokenizer, bpe_vocab_size, max_bytes
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.val_fraction, self.seed, self.shards_vocab_size = val_fraction, seed, shards_vocab_size
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()

        self._tokenizer_obj: Tokenizer | None = None
        self._token_dir: Path | None = None
        self.train_dataset: TokenWindows | None = None
        self.val_dataset: TokenWindows | None = None
        # Resolve the corpus now so a wrong path, directory or tokenizer fails before any training starts.
        self._corpus: Corpus | None = None
        self._shard_files: list[Path] | None = None
        self._manifest: dict[str, Any] | None = None
        if shards is not None:
            self._shard_files = _resolve_shards(shards)
        elif dataset is not None:
            self._token_dir = Path(os.path.expanduser(dataset))
            self._manifest = read_manifest(self._token_dir, key="data.dataset")
            if tokenizer is not None:
                self._tokenizer_obj = load_tokenizer(tokenizer)
                self._check_dataset_tokenizer(self._tokenizer_obj)
        elif hf_dataset is not None:
            self._corpus = Corpus.from_hf(hf_dataset, hf_config, hf_split, hf_text_field, max_bytes, names=DATA_NAMES)
        else:
            self._corpus = Corpus.from_paths(paths, max_bytes, names=DATA_NAMES)
            if paths is not None:
                self._check_document_count()

    # ----------------------------------------------------------------------------------------- corpus
    def _check_document_count(self) -> None:
        """Fail at construction, from file sizes alone, if the split by document cannot have two sides."""
        assert self._corpus is not None and self._corpus.files is not None
        budget, n_docs = self.max_bytes, 0
        for path in self._corpus.files:
            size = path.stat().st_size
            if size == 0:
                continue
            n_docs += 1
            if budget is not None:
                budget -= size
                if budget <= 0:
                    break
        if n_docs < 2:
            raise ValueError(f"data.paths: {n_docs} non-empty document(s) within data.max_bytes={self.max_bytes}; "
                             "the train/val split is by document (one file = one document) and needs at least 2: "
                             "add files to data.paths or raise data.max_bytes")

    def _check_dataset_tokenizer(self, tokenizer: Tokenizer) -> None:
        assert self._manifest is not None and self._token_dir is not None
        expected, got = self._manifest["tokenizer"]["sha256"], tokenizer_digest(tokenizer)
        if got != expected:
            own = self._token_dir / self._manifest["tokenizer"]["file"]
            raise ValueError(f"data.tokenizer ({self.tokenizer!r}, sha256 {got[:12]}...) is not the tokenizer "
                             f"data.dataset ({self.dataset!r}) was prepared with (sha256 {expected[:12]}...): its "
                             f"token ids would mean other text. Remove data.tokenizer (the dataset's own {own} is "
                             "used), or prepare the dataset again with --tokenizer set to this tokenizer")

    # -------------------------------------------------------------------------------------- tokenizer
    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer in use: ``data.tokenizer``, the prepared dataset's own, or a BPE trained once and cached."""
        if self.shards is not None:
            raise ValueError("data.shards are already token ids, so there is no tokenizer; to decode them, load "
                             "the tokenizer they were made with")
        if self._tokenizer_obj is None:
            if self._manifest is not None:
                assert self._token_dir is not None
                self._tokenizer_obj = Tokenizer.from_file(str(self._token_dir / self._manifest["tokenizer"]["file"]))
            else:
                assert self._corpus is not None
                self._tokenizer_obj = obtain_tokenizer(self._corpus, self.tokenizer, self.bpe_vocab_size,
                                                       self.cache_dir)
        return self._tokenizer_obj

    @property
    def vocab_size(self) -> int:
        """Vocabulary size for the model's embedding; works before prepare_data (it trains/loads the tokenizer)."""
        if self.shards is not None:
            return self.shards_vocab_size
        if self._manifest is not None:
            return int(self._manifest["tokenizer"]["vocab_size"])
        return self.get_tokenizer().get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------------------------ token cache
    def token_cache_dir(self) -> Path:
        """The prepared directory holding this configuration's train/val shards (``data.dataset`` if set)."""
        if self.shards is not None:
            raise ValueError("data.shards are read in place; there is no token cache")
        if self._token_dir is None:
            assert self._corpus is not None
            key_parts = [_TOKEN_CACHE_VERSION, self._corpus.corpus_id(), tokenizer_digest(self.get_tokenizer()),
                         self.seed, self.val_fraction, DEFAULT_SHARD_TOKENS]
            key = hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()
            self._token_dir = self.cache_dir / "tokens" / key[:20]
        return self._token_dir

    def prepare_data(self) -> None:
        """Tokenise the corpus once into a prepared directory under ``cache_dir`` (skipped if it is complete)."""
        if self.shards is not None or self.dataset is not None:
            return  # already tokens: checked at construction and in setup
        out = self.token_cache_dir()
        if (out / MANIFEST_NAME).is_file():
            rank_zero_info(f"token cache found: {out}")
            return
        with cache_lock(out.with_name(out.name + ".lock")):
            if not (out / MANIFEST_NAME).is_file():  # another process may have built it while this one waited
                # None: prepare_corpus finds the same cached BPE, so its manifest matches `lightning-dos prepare`'s
                given = self.get_tokenizer() if self.tokenizer is not None else None
                prepare_corpus(out, corpus=self._corpus, tokenizer=given, bpe_vocab_size=self.bpe_vocab_size,
                               val_fraction=self.val_fraction, seed=self.seed, shard_tokens=DEFAULT_SHARD_TOKENS,
                               cache_dir=self.cache_dir, names=DATA_NAMES)

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        """Open the token memmaps and build the train/val window datasets."""
        if self.train_dataset is not None:
            return
        if self._shard_files is not None:
            train_sources, val_sources = self._shard_sources()
            grow = "add shards to data.shards"
        else:
            out = self.token_cache_dir()
            if self._manifest is not None:
                manifest, grow = self._manifest, "prepare a larger data.dataset"
            else:
                if not (out / MANIFEST_NAME).is_file():
                    self.prepare_data()  # setup called directly (outside a Trainer): build the cache here
                manifest, grow = read_manifest(out, key="data.cache_dir"), "raise data.max_bytes"
            totals = manifest["totals"]
            rank_zero_info(f"corpus: {totals['documents']:,} documents, {totals['bytes'] / 1e6:.2f} MB of text "
                           f"(prepared tokens in {out})")
            train_sources, val_sources = manifest_sources(out, manifest)
        train = TokenWindows(train_sources, self.seq_len)
        val = TokenWindows(val_sources, self.seq_len)
        for name, dataset in (("train", train), ("val", val)):
            if len(dataset) == 0:
                raise ValueError(
                    f"data.seq_len: the {name} split has {dataset.num_tokens} tokens, fewer than one window of "
                    f"data.seq_len + 1 = {self.seq_len + 1} (in any one shard); lower data.seq_len or add data "
                    f"({grow})"
                )
        if len(train) < self.batch_size:
            raise ValueError(f"data.batch_size: the train split has {len(train)} windows of data.seq_len="
                             f"{self.seq_len}, fewer than one batch of {self.batch_size}; lower data.batch_size "
                             f"or data.seq_len, or add data ({grow})")
        self.train_dataset, self.val_dataset = train, val
        rank_zero_info(f"data: {train.num_tokens:,} train tokens ({len(train):,} windows), "
                       f"{val.num_tokens:,} val tokens ({len(val):,} windows) of seq_len {self.seq_len}")

    def _shard_sources(self) -> tuple[list, list]:
        assert self._shard_files is not None
        sources = []
        for path in self._shard_files:
            array = open_tokens(path, None if path.suffix == ".npy" else "uint16")
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
                raise ValueError(f"data.shards: {path} holds a {array.ndim}-D {array.dtype} array; shards must be "
                                 "1-D integer token ids")
            _check_ids(path, array, self.shards_vocab_size)
            sources.append((str(path), None if path.suffix == ".npy" else "uint16", 0, len(array)))
        if len(sources) == 1:
            # One shard: hold out its tail, at least one full window, so val never overlaps train.
            path, dtype, _, n = sources[0]
            n_val = max(self.seq_len + 1, round(n * self.val_fraction))
            if n - n_val < self.seq_len + 1:
                raise ValueError(f"data.seq_len: the single shard {path} has {n} tokens, too few for a train and a "
                                 f"val window of data.seq_len + 1 = {self.seq_len + 1}; lower data.seq_len or add "
                                 "shards to data.shards")
            return [(path, dtype, 0, n - n_val)], [(path, dtype, n - n_val, n)]
        train_idx, val_idx = split_indices(len(sources), self.val_fraction, self.seed)
        return [sources[i] for i in train_idx], [sources[i] for i in val_idx]

    # ------------------------------------------------------------------------------------ dataloaders
    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled windows in a seeded order per epoch, split over ranks, resumable mid-epoch from a checkpoint."""
        if self.train_dataset is None:
            self.setup("fit")
        assert self.train_dataset is not None
        trainer = getattr(self, "trainer", None)
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = ResumableSampler(self.train_dataset, num_replicas=num_replicas, rank=rank, seed=self.seed)
        if len(sampler) < self.batch_size:
            raise ValueError(f"data.batch_size: each of {num_replicas} ranks gets {len(sampler)} train windows, "
                             f"fewer than one batch of {self.batch_size}; lower data.batch_size or data.seq_len, or "
                             "add data")
        # The workers' base seed is drawn from this generator, as before, so the global RNG stream is untouched.
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        return ResumableDataLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                                   generator=generator, num_workers=self.num_workers,
                                   pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return DataLoader(self.val_dataset, batch_size=self.batch_size, shuffle=False, drop_last=False,
                          num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0)


def _resolve_shards(pattern: str) -> list[Path]:
    files = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
    if not files:
        raise FileNotFoundError(f"data.shards: {pattern!r} matches no files; set it to a glob of .npy or .bin "
                                "token files (e.g. data/shards/*.npy)")
    bad = [str(p) for p in files if p.suffix not in (".npy", ".bin")]
    if bad:
        raise ValueError(f"data.shards: {bad[:3]} are neither .npy nor .bin token files; narrow the data.shards glob")
    odd = [str(p) for p in files if p.suffix == ".bin" and os.path.getsize(p) % 2]
    if odd:
        raise ValueError(f"data.shards: {odd[:3]} have an odd byte count, so they are not raw uint16 tokens")
    return files


def _check_ids(path: Path, array: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> None:
    """Fail here, naming the file, rather than with an opaque device-side assert in the embedding."""
    for begin in range(0, len(array), chunk):
        part = np.asarray(array[begin : begin + chunk])
        if part.size and (int(part.max()) >= vocab_size or int(part.min()) < 0):
            raise ValueError(f"data.shards: {path} holds token ids up to {int(part.max())} (min {int(part.min())}), "
                             f"outside data.shards_vocab_size={vocab_size}; set data.shards_vocab_size above the "
                             "largest id")
