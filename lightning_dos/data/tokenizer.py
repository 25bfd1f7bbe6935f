"""Owns the tokenizer: training a byte-level BPE on the corpus, loading one, and caching it on disk.

Also owns the two cache-file primitives the data pipeline shares (atomic writes and an inter-process
lock), so a crash never leaves a half-written cache and concurrent ranks never train twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lightning_dos.data.corpus import read_documents

EOS_TOKEN = "<|endoftext|>"
# End-of-document tokens of common hub tokenizers, tried in order when a tokenizer was not trained here.
_EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
# Bumped when training changes, so old caches are not silently reused.
_CACHE_VERSION = 1


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) so only one process builds a cache entry."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): atomic writes still keep the cache consistent
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def default_cache_dir() -> Path:
    """``$LIGHTNING_DOS_CACHE`` if set, else ``~/.cache/lightning-dos``."""
    return Path(os.environ.get("LIGHTNING_DOS_CACHE") or Path.home() / ".cache" / "lightning-dos").expanduser()


def corpus_fingerprint(files: Iterable[Path]) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) per file: cheap to compute, and changes whenever a file is edited."""
    out = []
    for p in files:
        st = os.stat(p)
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return out


def train_bpe(documents_iter: Iterable[str], vocab_size: int, path: str | os.PathLike) -> Tokenizer:
    """Train a byte-level BPE (``<|endoftext|>`` is id 0) on the documents and save it atomically to ``path``."""
    if vocab_size < 257:
        raise ValueError(f"data.bpe_vocab_size must be at least 257 (256 bytes + {EOS_TOKEN}), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: decode(encode(s)) must give back s exactly.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],  # first special token gets id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable, even unseen ones
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(documents_iter, trainer=trainer)
    atomic_write_bytes(Path(path), tokenizer.to_str().encode("utf-8"))
    return tokenizer


def load_tokenizer(spec: str, key: str = "data.tokenizer") -> Tokenizer:
    """Load a tokenizer from a ``tokenizer.json`` path (or a directory holding one), else a hub name.

    ``key`` is the option named in errors.
    """
    local = Path(os.path.expanduser(spec))
    if local.is_dir() and (local / "tokenizer.json").is_file():
        local = local / "tokenizer.json"
    if local.is_file():
        try:
            return Tokenizer.from_file(str(local))
        except Exception as err:
            raise ValueError(f"{key}: {spec!r} is not a valid tokenizer.json ({err}); pass a tokenizer.json "
                             f"saved by the `tokenizers` library, or omit {key} to train a BPE on the corpus") from err
    if local.is_dir() or spec.endswith(".json") or spec.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{key}: {spec!r} does not exist (or is a directory without a tokenizer.json); pass "
                                f"an existing tokenizer.json, or omit {key} to train a BPE on the corpus")
    try:
        return Tokenizer.from_pretrained(spec)
    except Exception as err:
        raise OSError(
            f"{key}: could not fetch {spec!r} from the Hugging Face hub ({type(err).__name__}: {err}); "
            "the hub may be unreachable from this machine or the name may be wrong. Pass a local tokenizer.json "
            f"instead ({key} path/to/tokenizer.json), or omit {key} to train a BPE on the corpus"
        ) from err


def eos_token_id(tokenizer: Tokenizer, key: str = "data.tokenizer") -> int:
    """Id of the end-of-document token placed between documents (``key`` is the option named in errors)."""
    for token in _EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise ValueError(f"{key}: the tokenizer has none of the end-of-document tokens {_EOS_CANDIDATES}; "
                     f"use a tokenizer that defines one, or omit {key} to train a BPE on the corpus")


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """Content hash of a tokenizer, so token caches are keyed by what the tokenizer does, not where it lives."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def bpe_cache_path(cache_dir: str | os.PathLike, corpus_id: object, vocab_size: int, max_bytes: int | None) -> Path:
    """Where the BPE trained on this corpus/vocab_size/max_bytes is cached."""
    blob = json.dumps([_CACHE_VERSION, corpus_id, vocab_size, max_bytes], sort_keys=True, default=str)
    key = hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]
    return Path(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{key}.json"


def get_tokenizer(
    spec: str | None,
    files: list[Path] | None,
    vocab_size: int,
    max_bytes: int | None,
    cache_dir: str | os.PathLike,
    *,
    documents: Callable[[], Iterable[str]] | None = None,
    corpus_id: object | None = None,
) -> Tokenizer:
    """Load ``spec`` if given; otherwise train a BPE on the corpus once and reuse the cached file afterwards.

    The corpus is ``files`` (read up to ``max_bytes``), or, for corpora that are not files, the
    ``documents`` factory with a stable ``corpus_id`` describing it (it keys the cache).
    """
    if spec is not None:
        return load_tokenizer(spec)
    if vocab_size < 257:
        raise ValueError(f"data.bpe_vocab_size must be at least 257 (256 bytes + {EOS_TOKEN}), got {vocab_size}")
    if documents is None:
        if files is None:
            raise ValueError("get_tokenizer: pass the corpus files or a documents factory")
        corpus_id = corpus_fingerprint(files)
        documents = lambda: (text for _, text in read_documents(files, max_bytes))
    elif corpus_id is None:
        raise ValueError("get_tokenizer: a documents factory needs a corpus_id to key the cache")
    path = bpe_cache_path(cache_dir, corpus_id, vocab_size, max_bytes)
    if not path.is_file():
        with cache_lock(path.with_name(path.name + ".lock")):
            if not path.is_file():  # another process may have trained it while this one waited
                rank_zero_info(f"training a {vocab_size}-token byte-level BPE (cached at {path})")
                return train_bpe(documents(), vocab_size, path)
    return Tokenizer.from_file(str(path))
