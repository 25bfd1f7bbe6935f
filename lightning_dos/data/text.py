"""Owns the text pretraining data module: corpus -> tokenizer -> cached token memmaps -> (x, y) windows.

Three sources, exactly one used: text files (``data.paths``, default: the Python standard library),
a Hugging Face dataset (``data.hf_dataset``), or pre-tokenised shards (``data.shards``). Tokenised text is
cached under ``cache_dir`` keyed by corpus, tokenizer, seed and val_fraction, so it is built once.
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lightning_dos.data.corpus import read_documents, resolve_paths, stdlib_source_files
from lightning_dos.data.tokenizer import (
    atomic_write_bytes,
    cache_lock,
    corpus_fingerprint,
    eos_token_id,
    get_tokenizer,
    tokenizer_digest,
)

# Bumped when the cache layout changes, so old token caches are not silently reused.
_TOKEN_CACHE_VERSION = 1
# Documents per encode_batch call: large enough for the tokenizer's threads, small enough to stream.
_ENCODE_BATCH = 128


def default_cache_dir() -> Path:
    """``$LIGHTNING_DOS_CACHE`` if set, else ``~/.cache/lightning-dos``."""
    return Path(os.environ.get("LIGHTNING_DOS_CACHE") or Path.home() / ".cache" / "lightning-dos").expanduser()


def split_indices(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, val) document indices from a seeded permutation; val gets at least one, train too."""
    if n_docs < 2:
        raise ValueError(f"a train/val split needs at least 2 documents, got {n_docs}")
    n_val = min(max(1, round(val_fraction * n_docs)), n_docs - 1)
    perm = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding every id: halves the cache for vocabularies under 65536."""
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


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


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "data.hf_dataset needs the Hugging Face `datasets` package: pip install 'lightning-dos[hf]' "
            "(or use data.paths / data.shards instead)"
        ) from err
    return datasets


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
            BPE on the corpus (cached). Not used with ``shards``.
        bpe_vocab_size: Vocabulary size of the BPE trained when ``tokenizer`` is None.
        max_bytes: Read at most this many bytes of text (None: everything); bounds tokenizer training and
            tokenisation time.
        seq_len: Tokens per training window (the model's context length).
        batch_size: Windows per batch, per device.
        num_workers: DataLoader worker processes.
        val_fraction: Fraction of documents (or shards) held out for validation; at least one.
        seed: Seeds the train/val split and the train shuffle order.
        cache_dir: Where tokenizers and token caches live. None: ``$LIGHTNING_DOS_CACHE`` or
            ``~/.cache/lightning-dos``.
        hf_config: The configuration name of ``hf_dataset`` (e.g. ``wikitext-103-raw-v1``), if it has several.
        shards_vocab_size: Vocabulary size reported for ``shards`` (their token ids must be below it).
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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        chosen = [key for key, value in (("paths", paths), ("hf_dataset", hf_dataset), ("shards", shards))
                  if value is not None]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join('data.' + k for k in chosen)} are set together; they are alternative "
                             "corpora: set only one of data.paths, data.hf_dataset, data.shards")
        _check_int("data.seq_len", seq_len, 1)
        _check_int("data.batch_size", batch_size, 1)
        _check_int("data.num_workers", num_workers, 0)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be strictly between 0 and 1, got {val_fraction} (e.g. 0.05)")
        if max_bytes is not None:
            _check_int("data.max_bytes", max_bytes, 1, hint=" (or null to read the whole corpus)")
        if shards is None and tokenizer is None:
            _check_int("data.bpe_vocab_size", bpe_vocab_size, 257, hint=" (256 bytes + <|endoftext|>)")
        if shards is not None and tokenizer is not None:
            raise ValueError("data.tokenizer is not used with data.shards (shards are already token ids): remove "
                             "data.tokenizer and set data.shards_vocab_size to the shards' vocabulary size")
        _check_int("data.shards_vocab_size", shards_vocab_size, 1)

        self.paths, self.hf_dataset, self.hf_config = paths, hf_dataset, hf_config
        self.hf_split, self.hf_text_field, self.shards = hf_split, hf_text_field, shards
        self.tokenizer, self.bpe_vocab_size, self.max_bytes = tokenizer, bpe_vocab_size, max_bytes
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.val_fraction, self.seed, self.shards_vocab_size = val_fraction, seed, shards_vocab_size
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()

        # Resolve the corpus now so a wrong path fails before any training starts.
        self._files: list[Path] | None = None
        self._shard_files: list[Path] | None = None
        if shards is not None:
            self._shard_files = _resolve_shards(shards)
        elif hf_dataset is not None:
            _import_datasets()
        elif paths is not None:
            if isinstance(paths, list | tuple) and len(paths) == 0:
                raise ValueError("data.paths is an empty list: list files/directories/globs, or omit data.paths "
                                 "to train on the Python standard library")
            self._files = resolve_paths(paths)
            self._check_document_count()
        else:
            self._files = stdlib_source_files()
            if not self._files:
                raise ValueError("the Python standard library's .py files were not found here; set data.paths")

        self._tokenizer_obj: Tokenizer | None = None
        self._hf_data: Any = None
        self._token_dir: Path | None = None
        self.train_dataset: TokenWindows | None = None
        self.val_dataset: TokenWindows | None = None

    # ----------------------------------------------------------------------------------------- corpus
    def _check_document_count(self) -> None:
        """Fail at construction, from file sizes alone, if the split by document cannot have two sides."""
        assert self._files is not None
        budget, n_docs = self.max_bytes, 0
        for path in self._files:
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

    def _load_hf(self) -> Any:
        if self._hf_data is None:
            datasets = _import_datasets()
            try:
                data = datasets.load_dataset(self.hf_dataset, self.hf_config, split=self.hf_split)
            except Exception as err:
                raise RuntimeError(f"data.hf_dataset: could not load {self.hf_dataset!r} (data.hf_config="
                                   f"{self.hf_config!r}, data.hf_split={self.hf_split!r}): {err}") from err
            columns = list(getattr(data, "column_names", None) or [])
            if self.hf_text_field not in columns:
                raise ValueError(f"data.hf_text_field: {self.hf_dataset!r} has no column {self.hf_text_field!r}; "
                                 f"set data.hf_text_field to one of {columns}")
            self._hf_data = data
        return self._hf_data

    def _documents(self) -> Iterator[str]:
        """The corpus as a deterministic stream of document texts, cut at ``max_bytes``."""
        if self._files is not None:
            for _, text in read_documents(self._files, self.max_bytes):
                yield text
            return
        remaining = self.max_bytes
        for batch in self._load_hf().iter(batch_size=1024):
            for text in batch[self.hf_text_field]:
                if not text:
                    continue  # empty rows (e.g. blank lines) would be documents made only of EOS
                if remaining is not None:
                    raw = text.encode("utf-8")[:remaining]
                    remaining -= len(raw)
                    text = raw.decode("utf-8", errors="ignore")
                yield text
                if remaining is not None and remaining <= 0:
                    return

    def _corpus_id(self) -> Any:
        if self._files is not None:
            return {"files": corpus_fingerprint(self._files), "max_bytes": self.max_bytes}
        data = self._load_hf()
        return {"hf": [self.hf_dataset, self.hf_config, self.hf_split, self.hf_text_field],
                "fingerprint": getattr(data, "_fingerprint", None), "rows": len(data), "max_bytes": self.max_bytes}

    def _source_key(self) -> str:
        return "data.paths" if self._files is not None else "data.hf_dataset"

    # -------------------------------------------------------------------------------------- tokenizer
    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer in use: loaded from ``data.tokenizer``, or trained on the corpus once and cached."""
        if self.shards is not None:
            raise ValueError("data.shards are already token ids, so there is no tokenizer; to decode them, load "
                             "the tokenizer they were made with")
        if self._tokenizer_obj is None:
            if self._files is not None:
                self._tokenizer_obj = get_tokenizer(self.tokenizer, self._files, self.bpe_vocab_size,
                                                    self.max_bytes, self.cache_dir)
            else:
                self._tokenizer_obj = get_tokenizer(self.tokenizer, None, self.bpe_vocab_size, self.max_bytes,
                                                    self.cache_dir, documents=self._documents,
                                                    corpus_id=self._corpus_id() if self.tokenizer is None else None)
        return self._tokenizer_obj

    @property
    def vocab_size(self) -> int:
        """Vocabulary size for the model's embedding; works before prepare_data (it trains/loads the tokenizer)."""
        if self.shards is not None:
            return self.shards_vocab_size
        return self.get_tokenizer().get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------------------------ token cache
    def token_cache_dir(self) -> Path:
        """The directory holding this configuration's tokenised train/val splits."""
        if self._token_dir is None:
            key_parts = [_TOKEN_CACHE_VERSION, self._corpus_id(), tokenizer_digest(self.get_tokenizer()),
                         self.seed, self.val_fraction]
            key = hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()
            self._token_dir = self.cache_dir / "tokens" / key[:20]
        return self._token_dir

    def prepare_data(self) -> None:
        """Tokenise the corpus once into train/val memmaps under ``cache_dir`` (skipped if cached)."""
        if self.shards is not None:
            return  # shards are already tokens; they are validated in setup
        out = self.token_cache_dir()
        if (out / "meta.json").is_file():
            rank_zero_info(f"token cache found: {out}")
            return
        with cache_lock(out.with_name(out.name + ".lock")):
            if not (out / "meta.json").is_file():  # another process may have built it while this one waited
                self._tokenise(out)

    def _tokenise(self, out: Path) -> None:
        tokenizer = self.get_tokenizer()
        eos = eos_token_id(tokenizer)
        dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
        # A first, cheap pass counts documents: the split needs the count before any token is written.
        n_docs = n_bytes = 0
        for text in self._documents():
            n_docs += 1
            n_bytes += len(text.encode("utf-8"))
        if n_docs < 2:
            raise ValueError(f"{self._source_key()}: the corpus has {n_docs} document(s) within data.max_bytes="
                             f"{self.max_bytes}; the train/val split is by document and needs at least 2: add "
                             "documents or raise data.max_bytes")
        _, val_idx = split_indices(n_docs, self.val_fraction, self.seed)
        is_val = np.zeros(n_docs, dtype=bool)
        is_val[val_idx] = True
        rank_zero_info(f"corpus: {n_docs} documents, {n_bytes / 1e6:.2f} MB of text; "
                       f"{n_docs - len(val_idx)} train / {len(val_idx)} val documents")

        out.mkdir(parents=True, exist_ok=True)
        tmp = {split: out / f".{split}.bin.tmp-{os.getpid()}" for split in ("train", "val")}
        counts = {"train": 0, "val": 0}
        try:
            handles = {split: open(path, "wb") for split, path in tmp.items()}
            try:
                progress = tqdm(total=n_docs, desc="tokenising", unit="doc")
                batch: list[str] = []
                index = 0
                for text in self._documents():
                    batch.append(text)
                    if len(batch) == _ENCODE_BATCH:
                        index = self._write_batch(tokenizer, batch, index, is_val, eos, dtype, handles, counts)
                        progress.update(len(batch))
                        batch = []
                if batch:
                    index = self._write_batch(tokenizer, batch, index, is_val, eos, dtype, handles, counts)
                    progress.update(len(batch))
                progress.close()
            finally:
                for handle in handles.values():
                    handle.close()
            if index != n_docs:
                raise RuntimeError(f"{self._source_key()}: the corpus changed while it was being tokenised "
                                   f"({n_docs} then {index} documents); run again")
            for split, path in tmp.items():
                os.replace(path, out / f"{split}.bin")
        finally:
            for path in tmp.values():
                path.unlink(missing_ok=True)
        meta = {"dtype": dtype.name, "train_tokens": counts["train"], "val_tokens": counts["val"],
                "train_documents": int(n_docs - len(val_idx)), "val_documents": len(val_idx),
                "corpus_bytes": n_bytes, "eos_id": eos, "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
                "seed": self.seed, "val_fraction": self.val_fraction}
        # Written last: its presence marks the cache complete.
        atomic_write_bytes(out / "meta.json", json.dumps(meta, indent=2).encode("utf-8"))
        rank_zero_info(f"tokenised into {out}: {counts['train']:,} train / {counts['val']:,} val tokens")

    @staticmethod
    def _write_batch(tokenizer: Tokenizer, batch: list[str], index: int, is_val: np.ndarray, eos: int,
                     dtype: np.dtype, handles: dict[str, Any], counts: dict[str, int]) -> int:
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            split = "val" if index < len(is_val) and is_val[index] else "train"
            ids = np.empty(len(encoding.ids) + 1, dtype=dtype)
            ids[:-1] = encoding.ids
            ids[-1] = eos  # each document ends with EOS, so documents are separated by it
            handles[split].write(ids.tobytes())
            counts[split] += len(ids)
            index += 1
        return index

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        """Open the token memmaps and build the train/val window datasets."""
        if self.train_dataset is not None:
            return
        if self._shard_files is not None:
            train_sources, val_sources = self._shard_sources()
            source_key = "data.shards"
        else:
            out = self.token_cache_dir()
            if not (out / "meta.json").is_file():
                self.prepare_data()  # setup called directly (outside a Trainer): build the cache here
            meta = json.loads((out / "meta.json").read_text())
            rank_zero_info(f"corpus: {meta['train_documents'] + meta['val_documents']:,} documents, "
                           f"{meta['corpus_bytes'] / 1e6:.2f} MB of text (token cache {out})")
            train_sources = [(str(out / "train.bin"), meta["dtype"], 0, meta["train_tokens"])]
            val_sources = [(str(out / "val.bin"), meta["dtype"], 0, meta["val_tokens"])]
            source_key = "data.max_bytes"
        train = TokenWindows(train_sources, self.seq_len)
        val = TokenWindows(val_sources, self.seq_len)
        for name, dataset in (("train", train), ("val", val)):
            if len(dataset) == 0:
                raise ValueError(
                    f"data.seq_len: the {name} split has {dataset.num_tokens} tokens, fewer than one window of "
                    f"data.seq_len + 1 = {self.seq_len + 1}; lower data.seq_len or add data (raise {source_key})"
                )
        if len(train) < self.batch_size:
            raise ValueError(f"data.batch_size: the train split has {len(train)} windows of data.seq_len="
                             f"{self.seq_len}, fewer than one batch of {self.batch_size}; lower data.batch_size "
                             f"or data.seq_len, or add data (raise {source_key})")
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
    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        generator = torch.Generator()
        generator.manual_seed(self.seed)  # same seed -> same batch order
        return DataLoader(self.train_dataset, batch_size=self.batch_size, shuffle=True, generator=generator,
                          drop_last=True, num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return DataLoader(self.val_dataset, batch_size=self.batch_size, shuffle=False, drop_last=False,
                          num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0)


def _check_int(key: str, value: Any, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}{hint}, got {value!r}")


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
