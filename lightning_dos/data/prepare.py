"""Owns ``lightning-dos prepare``: a corpus tokenised into sharded token files that training memory-maps.

A prepared directory holds ``tokenizer.json`` (the tokenizer used), ``train-00000.bin ...`` and
``val-00000.bin ...`` (raw token ids, each document followed by EOS, a shard cut at the first document
boundary at or past ``shard_tokens``) and ``manifest.json``, written last: its presence means "complete".
Documents go to train or val by :func:`split_indices` over the document count, so the output of a corpus
that fits one shard is byte-identical to the single-file token cache this package wrote before shards.

Runs are deterministic (same inputs -> the same bytes; no timestamps) and resumable: each completed shard is
published atomically and recorded, with the position in the document stream and the unfinished shards'
lengths and checksums, in ``progress.json``; a rerun of the same command verifies the record and continues.
This module also reads prepared directories back (:func:`read_manifest`, :func:`verify_prepared`);
:class:`~lightning_dos.data.TextDataModule` tokenises its corpora through :func:`prepare_corpus` as well.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from lightning_dos.data.corpus import CLI_NAMES, Corpus, OptionNames
from lightning_dos.data.tokenizer import (
    EOS_TOKEN,
    atomic_write_bytes,
    default_cache_dir,
    eos_token_id,
    get_tokenizer,
    load_tokenizer,
    tokenizer_digest,
)

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "PROGRESS_NAME",
    "TOKENIZER_NAME",
    "build_parser",
    "check_int",
    "main",
    "obtain_tokenizer",
    "prepare_corpus",
    "read_manifest",
    "shard_name",
    "split_indices",
    "token_dtype",
    "verify_prepared",
]

#: Bumped when the layout of a prepared directory changes; readers refuse other versions.
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = "progress.json"
TOKENIZER_NAME = "tokenizer.json"
#: Tokens per shard unless told otherwise: 200 MB of uint16, cheap to checksum and to copy.
DEFAULT_SHARD_TOKENS = 100_000_000
SPLITS = ("train", "val")
# Documents per encode_batch call: large enough for the tokenizer's threads, small enough to stream.
_ENCODE_BATCH = 128
# Files this module writes into an output directory (published shards and unfinished ones).
_SHARD_FILE = re.compile(r"^(?:\.)?(train|val)-(\d{5})\.bin(?:\.partial)?$")
_HASH_CHUNK = 1 << 24


# ------------------------------------------------------------------------------------------ shared rules
def split_indices(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, val) document indices from a seeded permutation; val gets at least one, train too."""
    if n_docs < 2:
        raise ValueError(f"a train/val split needs at least 2 documents, got {n_docs}")
    n_val = min(max(1, round(val_fraction * n_docs)), n_docs - 1)
    perm = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding every id: halves the files for vocabularies under 65536."""
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


def shard_name(split: str, index: int) -> str:
    """File name of shard ``index`` of ``split``: ``train-00000.bin``."""
    return f"{split}-{index:05d}.bin"


def check_int(key: str, value: Any, minimum: int, hint: str = "") -> None:
    """Raise a ValueError naming ``key`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}{hint}, got {value!r}")


def _file_sha256(path: Path, limit: int | None = None) -> Any:
    """sha256 object of the first ``limit`` bytes of ``path`` (all if None), read in chunks."""
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as handle:
        while remaining is None or remaining > 0:
            chunk = handle.read(_HASH_CHUNK if remaining is None else min(_HASH_CHUNK, remaining))
            if not chunk:
                break
            digest.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return digest


def _hash_document(digest: Any, raw: bytes) -> None:
    # Length-prefixed, so the hash tells ["ab", "c"] from ["a", "bc"].
    digest.update(len(raw).to_bytes(8, "little"))
    digest.update(raw)


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


# ------------------------------------------------------------------------------------------- tokenizer
def obtain_tokenizer(corpus: Corpus, spec: str | Tokenizer | None, bpe_vocab_size: int,
                     cache_dir: str | os.PathLike | None) -> Tokenizer:
    """The tokenizer for ``corpus``: ``spec`` loaded (path or hub name), or a BPE trained on it once and cached."""
    if isinstance(spec, Tokenizer):
        return spec
    if spec is not None:
        return load_tokenizer(spec, key=corpus.names.tokenizer)
    if cache_dir is None:
        cache_dir = default_cache_dir()
    if corpus.files is not None:
        return get_tokenizer(None, corpus.files, bpe_vocab_size, corpus.max_bytes, cache_dir)
    return get_tokenizer(None, None, bpe_vocab_size, corpus.max_bytes, cache_dir, documents=corpus.documents,
                         corpus_id=corpus.corpus_id())


# -------------------------------------------------------------------------------------------- manifest
def read_manifest(path: str | os.PathLike, key: str = "data.dataset") -> dict[str, Any]:
    """Load a prepared directory's manifest and check every file it lists exists with the size it says.

    Checksums are not read here (that is :func:`verify_prepared`), so this is cheap enough for every start.
    ``key`` is the option named in errors.
    """
    root = Path(os.path.expanduser(str(path)))
    if not root.is_dir():
        raise FileNotFoundError(f"{key}: {str(path)!r} is not a directory; set {key} to a directory written by "
                                "`lightning-dos prepare --out DIR`")
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        hint = (" (it holds an unfinished run: run the same `lightning-dos prepare` command again to finish it)"
                if (root / PROGRESS_NAME).is_file() else "")
        raise FileNotFoundError(f"{key}: {str(path)!r} has no {MANIFEST_NAME}, so it is not a finished "
                                f"`lightning-dos prepare` output{hint}; run `lightning-dos prepare --out {path}` "
                                f"first, or set {key} to a prepared directory")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{key}: {manifest_path} is not valid JSON ({err}); delete {path} and prepare it "
                         "again") from err
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(f"{key}: {manifest_path} has format_version {version!r}, this version of lightning-dos "
                         f"reads {FORMAT_VERSION}; prepare {path} again with this version")
    try:
        itemsize = np.dtype(manifest["dtype"]).itemsize
        listed = [(s["split"], s["file"], int(s["tokens"])) for s in manifest["shards"]]
        tokenizer_file = manifest["tokenizer"]["file"]
        int(manifest["tokenizer"]["vocab_size"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{key}: {manifest_path} lacks or garbles a field ({type(err).__name__}: {err}); it was not "
                         f"written by `lightning-dos prepare`: prepare {path} again") from err
    problems = []
    for _, name, tokens in listed:
        file = root / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != tokens * itemsize:
            problems.append(f"{name} has {file.stat().st_size} bytes, the manifest says {tokens * itemsize}")
    if not (root / tokenizer_file).is_file():
        problems.append(f"{tokenizer_file} is missing")
    if problems:
        raise ValueError(f"{key}: {path} does not match its manifest: {'; '.join(problems[:5])}; it was changed "
                         "or copied incompletely: copy it again, or delete it and run `lightning-dos prepare` again")
    for split in SPLITS:
        if not any(s[0] == split for s in listed):
            raise ValueError(f"{key}: {path} has no {split} shard; prepare it again")
    return manifest


def verify_prepared(path: str | os.PathLike, key: str = "--verify") -> dict[str, Any]:
    """:func:`read_manifest`, then every shard's and the tokenizer's sha256 against the manifest (reads it all)."""
    manifest = read_manifest(path, key=key)
    root = Path(os.path.expanduser(str(path)))
    bad = [s["file"] for s in manifest["shards"] if _file_sha256(root / s["file"]).hexdigest() != s["sha256"]]
    tokenizer = Tokenizer.from_file(str(root / manifest["tokenizer"]["file"]))
    if tokenizer_digest(tokenizer) != manifest["tokenizer"]["sha256"]:
        bad.append(manifest["tokenizer"]["file"])
    if bad:
        raise ValueError(f"{key}: {path}: {len(bad)} file(s) do not match the checksums in its manifest "
                         f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): corrupted or changed; copy it "
                         "again, or delete it and run `lightning-dos prepare` again")
    return manifest


def _same_output(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs' options give the same output: the corpus compared by content, not by how it was named."""
    def identity(options: dict[str, Any]) -> dict[str, Any]:
        source = options.get("source", {})
        return {**options, "source": {k: source.get(k) for k in ("documents", "bytes", "sha256")}}

    return identity(a) == identity(b)


# ----------------------------------------------------------------------------------------- shard writer
class _SplitWriter:
    """One split's shards: documents append to a hidden ``.partial`` file, published by rename when full."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int,
                 published: list[dict[str, Any]], partial: dict[str, Any] | None, out_key: str) -> None:
        self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
        self.published = list(published)
        self.tokens = self.documents = 0
        self.digest = hashlib.sha256()
        self.handle: Any = None
        self._restore(partial, out_key)

    @property
    def index(self) -> int:
        return len(self.published)

    @property
    def partial_path(self) -> Path:
        return self.out / f".{shard_name(self.split, self.index)}.partial"

    def _restore(self, partial: dict[str, Any] | None, out_key: str) -> None:
        """Continue the unfinished shard the progress file recorded (or start one)."""
        path, final = self.partial_path, self.out / shard_name(self.split, self.index)
        if not partial:
            path.unlink(missing_ok=True)
            final.unlink(missing_ok=True)  # published after the last record: its documents are written again
            return
        if not path.exists() and final.exists():
            os.replace(final, path)  # published after the last record: its head is the recorded unfinished part
        size = partial["tokens"] * self.dtype.itemsize
        if not path.is_file() or path.stat().st_size < size:
            raise ValueError(f"{out_key}: {self.out} holds an unfinished run whose shard {path.name} is missing or "
                             f"shorter than recorded; delete {self.out} (or choose another {out_key}) and run again")
        with open(path, "r+b") as handle:
            handle.truncate(size)  # drops documents written after the last record; they are written again
        self.digest = _file_sha256(path)
        if self.digest.hexdigest() != partial["sha256"]:
            raise ValueError(f"{out_key}: {self.out} holds an unfinished run whose shard {path.name} does not match "
                             f"its recorded checksum; delete {self.out} (or choose another {out_key}) and run again")
        self.tokens, self.documents = partial["tokens"], partial["documents"]
        self.handle = open(path, "ab")  # noqa: SIM115  (kept open across documents, closed by publish/close)

    def append(self, ids: np.ndarray) -> bool:
        """Append one document's ids; True when the shard has reached ``shard_tokens`` and should be published."""
        if self.handle is None:
            self.handle = open(self.partial_path, "wb")  # noqa: SIM115
        data = ids.tobytes()
        self.handle.write(data)
        self.digest.update(data)
        self.tokens += len(ids)
        self.documents += 1
        return self.tokens >= self.shard_tokens

    def publish(self) -> None:
        """Make the current shard durable under its final name (temp -> fsync -> rename); no-op when empty."""
        if self.handle is None or self.documents == 0:
            return
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        self.handle = None
        name = shard_name(self.split, self.index)
        os.replace(self.partial_path, self.out / name)
        _fsync_dir(self.out)
        self.published.append({"split": self.split, "file": name, "tokens": self.tokens,
                               "documents": self.documents, "sha256": self.digest.hexdigest()})
        self.tokens = self.documents = 0
        self.digest = hashlib.sha256()

    def sync(self) -> dict[str, Any] | None:
        """Flush the unfinished shard to disk and describe it for the progress file."""
        if self.handle is None or self.documents == 0:
            return None
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return {"file": self.partial_path.name, "tokens": self.tokens, "documents": self.documents,
                "sha256": self.digest.hexdigest()}

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


# ------------------------------------------------------------------------------------------ the command
@contextlib.contextmanager
def _exclusive(out: Path, out_key: str) -> Iterator[None]:
    """Refuse a second writer into ``out`` (a lock on the directory itself, so no lock file is left behind)."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): atomic publishing still keeps finished shards consistent
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            # Other errors mean a filesystem without flock (some network mounts): go on unlocked, as on Windows.
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ValueError(f"{out_key}: another `lightning-dos prepare` is writing to {out}; wait for it to "
                                 f"finish, or choose another {out_key}") from err
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _check_out(out: Path, out_key: str) -> None:
    """Fail before any work if ``out`` cannot be created or written."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out_key}: {out} exists and is not a directory; choose a new directory for {out_key}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{out_key}: cannot write to {out} ({type(err).__name__}: {err.strerror or err}); "
                         f"choose a writable directory for {out_key}") from err


def _count(corpus: Corpus, progress: bool) -> tuple[int, int, str]:
    """First pass: documents, bytes and a content hash; the split needs the count before any token is written."""
    digest = hashlib.sha256()
    n_docs = n_bytes = 0
    bar = tqdm(desc="reading", unit="doc", disable=None if progress else True)
    for text in corpus.documents():
        raw = text.encode("utf-8")
        _hash_document(digest, raw)
        n_docs += 1
        n_bytes += len(raw)
        bar.update(1)
        if n_docs % 256 == 0:
            bar.set_postfix_str(f"{n_bytes / 1e6:.1f} MB", refresh=False)
    bar.close()
    return n_docs, n_bytes, digest.hexdigest()


def prepare_corpus(
    out: str | os.PathLike,
    *,
    paths: str | list[str] | None = None,
    hf_dataset: str | None = None,
    hf_config: str | None = None,
    hf_split: str = "train",
    hf_text_field: str = "text",
    tokenizer: str | Tokenizer | None = None,
    bpe_vocab_size: int = 4096,
    max_bytes: int | None = None,
    val_fraction: float = 0.05,
    seed: int = 1234,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    corpus: Corpus | None = None,
    names: OptionNames = CLI_NAMES,
) -> dict[str, Any]:
    """Tokenise a corpus into ``out`` (resuming an unfinished run there) and return its manifest.

    Args:
        out: Output directory; created if needed. A finished one with the same options is left as it is.
        paths: Text files, directories or globs; None (and no ``hf_dataset``) is the standard library's ``.py``.
        hf_dataset, hf_config, hf_split, hf_text_field: A Hugging Face dataset instead of ``paths``.
        tokenizer: A ``tokenizer.json`` path (or hub name, or a loaded Tokenizer); None trains a byte-level BPE
            of ``bpe_vocab_size`` on the corpus (cached under ``cache_dir``).
        max_bytes: Read at most this much text (None: all).
        val_fraction, seed: The document split (:func:`split_indices`).
        shard_tokens: A shard is closed at the first document boundary at or past this many tokens.
        cache_dir: Where a trained BPE is cached (None: ``$LIGHTNING_DOS_CACHE`` or ``~/.cache/lightning-dos``).
        progress: Show tqdm progress bars (on a terminal).
        corpus: An already-built :class:`Corpus`, instead of ``paths``/``hf_*``/``max_bytes``.
        names: How the options are spelled in errors (``--paths`` here, ``data.paths`` in a recipe).

    Raises:
        FileNotFoundError: a path, glob or tokenizer file does not exist.
        ValueError: an invalid option, an empty corpus, an unwritable ``out``, or an ``out`` holding other output.
    """
    # Everything that can be checked without reading the corpus is checked first.
    if not isinstance(val_fraction, float | int) or isinstance(val_fraction, bool) or not 0 < val_fraction < 1:
        raise ValueError(f"{names.val_fraction} must be strictly between 0 and 1, got {val_fraction!r} (e.g. 0.05)")
    check_int(names.seed, seed, 0)
    check_int(names.shard_tokens, shard_tokens, 1)
    if corpus is None:
        if max_bytes is not None:
            check_int(names.max_bytes, max_bytes, 1, hint=" (or leave it unset to read the whole corpus)")
        if paths is not None and hf_dataset is not None:
            raise ValueError(f"{names.paths} and {names.hf_dataset} are alternative corpora; set only one")
        if hf_dataset is not None:
            corpus = Corpus.from_hf(hf_dataset, hf_config, hf_split, hf_text_field, max_bytes, names=names)
        else:
            corpus = Corpus.from_paths(paths, max_bytes, names=names)
    elif paths is not None or hf_dataset is not None or max_bytes is not None:
        raise ValueError("prepare_corpus: pass either corpus or paths/hf_dataset/max_bytes, not both")
    given: Tokenizer | None = None
    if tokenizer is not None:
        given = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(str(tokenizer), key=names.tokenizer)
        eos_token_id(given, key=names.tokenizer)
    else:
        check_int(names.bpe_vocab_size, bpe_vocab_size, 257, hint=f" (256 bytes + {EOS_TOKEN})")
    root = Path(os.path.expanduser(str(out)))
    created = not root.exists()
    _check_out(root, names.out)
    try:
        return _prepare_locked(root, corpus, given, bpe_vocab_size, val_fraction, seed, shard_tokens, cache_dir,
                               progress, names)
    except BaseException:
        if created and root.is_dir() and not any(root.iterdir()):
            root.rmdir()  # a run that failed before writing anything leaves no empty directory behind
        raise


def _prepare_locked(root: Path, corpus: Corpus, given: Tokenizer | None, bpe_vocab_size: int, val_fraction: float,
                    seed: int, shard_tokens: int, cache_dir: str | os.PathLike | None, progress: bool,
                    names: OptionNames) -> dict[str, Any]:
    """prepare_corpus once its inputs are checked: count, compare with what ``root`` holds, then tokenise."""
    with _exclusive(root, names.out):
        n_docs, n_bytes, content = _count(corpus, progress)
        if n_docs < 2:
            raise ValueError(f"{corpus.source_key}: the corpus has {n_docs} document(s) within {names.max_bytes}="
                             f"{corpus.max_bytes}; the train/val split is by document and needs at least 2: add "
                             f"documents or raise {names.max_bytes}")
        options = {"source": {**corpus.describe(), "documents": n_docs, "bytes": n_bytes, "sha256": content},
                   "max_bytes": corpus.max_bytes, "seed": int(seed), "val_fraction": float(val_fraction),
                   "shard_tokens": int(shard_tokens),
                   "bpe_vocab_size": None if given is not None else int(bpe_vocab_size)}
        given_digest = tokenizer_digest(given) if given is not None else None
        state = _existing_state(root, options, given_digest, names.out)
        if state is not None and state.get("done"):
            rank_zero_info(f"{root} is already prepared with these options ({MANIFEST_NAME} present): nothing to do")
            return state["manifest"]
        tok = given
        if tok is None and state is not None and (root / TOKENIZER_NAME).is_file():
            # Resuming a trained-BPE run: the copy in the out dir is the tokenizer its shards were written with.
            copy = Tokenizer.from_file(str(root / TOKENIZER_NAME))
            tok = copy if tokenizer_digest(copy) == state["tokenizer_sha256"] else None
        if tok is None:
            tok = obtain_tokenizer(corpus, None, bpe_vocab_size, cache_dir)
        digest = tokenizer_digest(tok)
        if state is not None and digest != state["tokenizer_sha256"]:
            raise ValueError(f"{names.out}: {root} holds an unfinished run made with another tokenizer; delete it "
                             f"(or choose another {names.out}) and run again")
        return _tokenise(root, corpus, tok, options, state, n_docs, n_bytes, content, progress, names)


def _existing_state(root: Path, options: dict[str, Any], given_digest: str | None,
                    out_key: str) -> dict[str, Any] | None:
    """What ``root`` holds: None (empty: start), {"done": ...} (finished, same options) or the progress to resume."""
    mismatch = (f"{out_key}: {root} holds the output of a different corpus or options; choose another "
                f"{out_key}, or delete {root} to prepare it again")
    manifest_path, progress_path = root / MANIFEST_NAME, root / PROGRESS_NAME
    if manifest_path.is_file():
        manifest = read_manifest(root, key=out_key)
        if not _same_output(manifest["options"], options) or (
                given_digest is not None and given_digest != manifest["tokenizer"]["sha256"]):
            raise ValueError(mismatch)
        progress_path.unlink(missing_ok=True)  # left behind if the run stopped between manifest and cleanup
        return {"done": True, "manifest": manifest}
    if progress_path.is_file():
        try:
            state = json.loads(progress_path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{out_key}: {progress_path} is not valid JSON; delete {root} and run again") from err
        if state.get("format_version") != FORMAT_VERSION or not _same_output(state["options"], options) or (
                given_digest is not None and given_digest != state["tokenizer_sha256"]):
            raise ValueError(mismatch)
        return state
    leftovers = [p.name for p in root.iterdir()]
    if leftovers:
        raise ValueError(f"{out_key}: {root} is not empty ({', '.join(sorted(leftovers)[:3])}, ...) and holds no "
                         f"`lightning-dos prepare` output; choose a new or empty directory for {out_key}")
    return None


def _tokenise(root: Path, corpus: Corpus, tok: Tokenizer, options: dict[str, Any], state: dict[str, Any] | None,
              n_docs: int, n_bytes: int, content: str, progress: bool, names: OptionNames) -> dict[str, Any]:
    """Second pass: write the shards (continuing ``state``), then the manifest."""
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    eos = eos_token_id(tok, key=names.tokenizer)
    dtype = token_dtype(vocab_size)
    digest = tokenizer_digest(tok)
    _, val_idx = split_indices(n_docs, options["val_fraction"], options["seed"])
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[val_idx] = True

    base = {"format_version": FORMAT_VERSION, "options": options, "tokenizer_sha256": digest, "dtype": dtype.name}
    if state is None:
        state = {**base, "next_document": 0, "shards": [], "partial": {split: None for split in SPLITS}}
        atomic_write_bytes(root / PROGRESS_NAME, _json_bytes(state))  # first: marks the dir as this run's
        rank_zero_info(f"corpus: {n_docs:,} documents, {n_bytes / 1e6:.2f} MB of text; {n_docs - len(val_idx):,} "
                       f"train / {len(val_idx):,} val documents -> {root}")
    else:
        state = {**state, "options": options}  # the corpus may be named differently this time; content is equal
        rank_zero_info(f"resuming {root} at document {state['next_document']:,} of {n_docs:,} "
                       f"({len(state['shards'])} shard(s) done)")
    copy = root / TOKENIZER_NAME
    if not copy.is_file() or _file_sha256(copy).hexdigest() != digest:
        atomic_write_bytes(copy, tok.to_str().encode("utf-8"))  # to_str bytes: the file's sha256 is the digest

    for shard in state["shards"]:  # what a resumed run builds on must be exactly what was recorded
        file = root / shard["file"]
        if (not file.is_file() or file.stat().st_size != shard["tokens"] * dtype.itemsize
                or _file_sha256(file).hexdigest() != shard["sha256"]):
            raise ValueError(f"{names.out}: {root} holds an unfinished run whose shard {shard['file']} does not match "
                             f"its record (size or checksum); delete {root} (or choose another {names.out}) and run "
                             "again")
    writers = {split: _SplitWriter(root, split, dtype, options["shard_tokens"],
                                   [s for s in state["shards"] if s["split"] == split], state["partial"][split],
                                   names.out) for split in SPLITS}
    keep = {s["file"] for s in state["shards"]} | {w.partial_path.name for w in writers.values()}
    for path in root.iterdir():
        if _SHARD_FILE.match(path.name) and path.name not in keep:
            path.unlink()  # shards written after the last record: their documents are written again

    start = state["next_document"]

    def record(next_document: int) -> None:
        partial = {split: writer.sync() for split, writer in writers.items()}
        shards = [s for split in SPLITS for s in writers[split].published]
        atomic_write_bytes(root / PROGRESS_NAME, _json_bytes({**base, "next_document": next_document,
                                                                "shards": shards, "partial": partial}))

    def write(batch: list[str], first: int) -> None:
        for offset, encoding in enumerate(tok.encode_batch(batch, add_special_tokens=False)):
            split = "val" if is_val[first + offset] else "train"
            ids = np.empty(len(encoding.ids) + 1, dtype=dtype)
            ids[:-1] = encoding.ids
            ids[-1] = eos  # each document ends with EOS, so documents are separated by it
            if writers[split].append(ids):
                writers[split].publish()
                record(first + offset + 1)

    stream = hashlib.sha256()
    position = done_bytes = 0
    bar = tqdm(total=n_docs, initial=start, desc="tokenising", unit="doc", disable=None if progress else True)
    try:
        batch: list[str] = []
        for text in corpus.documents():
            raw = text.encode("utf-8")
            _hash_document(stream, raw)
            position += 1
            done_bytes += len(raw)
            if position <= start:
                continue  # already in the recorded shards
            batch.append(text)
            if len(batch) == _ENCODE_BATCH:
                write(batch, position - len(batch))
                bar.update(len(batch))
                bar.set_postfix_str(f"{done_bytes / 1e6:.1f}/{n_bytes / 1e6:.1f} MB", refresh=False)
                batch = []
        if batch:
            write(batch, position - len(batch))
            bar.update(len(batch))
        bar.close()
        if position != n_docs or stream.hexdigest() != content:
            raise RuntimeError(f"{corpus.source_key}: the corpus changed while it was being tokenised ({n_docs} then "
                               f"{position} documents); delete {root} and run again")
        for split in SPLITS:
            writers[split].publish()
    finally:
        for writer in writers.values():
            writer.close()

    shards = [s for split in SPLITS for s in writers[split].published]
    totals: dict[str, Any] = {"documents": n_docs, "bytes": n_bytes, "tokens": sum(s["tokens"] for s in shards)}
    for split in SPLITS:
        own = [s for s in shards if s["split"] == split]
        totals[split] = {"shards": len(own), "documents": sum(s["documents"] for s in own),
                         "tokens": sum(s["tokens"] for s in own)}
    manifest = {
        "format_version": FORMAT_VERSION,
        "tokenizer": {"file": TOKENIZER_NAME, "sha256": digest, "vocab_size": vocab_size, "eos_id": eos},
        "dtype": dtype.name,
        "options": options,
        "shards": shards,
        "totals": totals,
    }
    atomic_write_bytes(root / MANIFEST_NAME, _json_bytes(manifest))  # last: its presence marks the dir complete
    (root / PROGRESS_NAME).unlink(missing_ok=True)
    rank_zero_info(f"prepared {root}: {totals['train']['tokens']:,} train tokens in {totals['train']['shards']} "
                   f"shard(s), {totals['val']['tokens']:,} val tokens in {totals['val']['shards']} shard(s)")
    return manifest


# ------------------------------------------------------------------------------------------------ CLI
def _int_arg(text: str) -> int:
    """An integer, also written as 1e8 or 100_000_000 (ranges are checked by prepare_corpus, naming the option)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The ``lightning-dos prepare`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="lightning-dos prepare",
        description="Tokenise a text corpus into sharded token files and a manifest, for --data.dataset DIR. "
                    "Deterministic and resumable: run the same command again after an interruption.",
    )
    source = parser.add_argument_group("corpus (one of)")
    source.add_argument("--paths", nargs="+", metavar="PATH",
                        help="text files, directories (recursive) or glob patterns (default: the Python standard "
                             "library's .py files)")
    source.add_argument("--hf-dataset", metavar="NAME", help="a Hugging Face dataset name or local dataset path "
                        "(needs pip install 'lightning-dos[hf]')")
    source.add_argument("--hf-config", metavar="NAME", help="configuration of --hf-dataset, e.g. wikitext-103-raw-v1")
    source.add_argument("--hf-split", default="train", metavar="SPLIT", help="split of --hf-dataset (default train)")
    source.add_argument("--hf-text-field", default="text", metavar="COLUMN",
                        help="column of --hf-dataset holding the text (default text)")
    tok = parser.add_argument_group("tokenizer (one of)")
    tok.add_argument("--tokenizer", metavar="FILE", help="an existing tokenizer.json")
    tok.add_argument("--bpe-vocab-size", type=_int_arg, metavar="N",
                     help="train a byte-level BPE of N tokens on the corpus (default 4096; cached)")
    parser.add_argument("--max-bytes", type=_int_arg, metavar="N", help="read at most N bytes of text "
                        "(default: all)")
    parser.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                        help="fraction of documents held out for validation, at least one (default 0.05)")
    parser.add_argument("--seed", type=int, default=1234, help="seeds the train/val document split (default 1234)")
    parser.add_argument("--shard-tokens", type=_int_arg, default=DEFAULT_SHARD_TOKENS, metavar="N",
                        help=f"tokens per shard, cut at document boundaries (default {DEFAULT_SHARD_TOKENS:,})")
    parser.add_argument("--cache-dir", metavar="DIR", help="where a trained BPE is cached (default "
                        "$LIGHTNING_DOS_CACHE or ~/.cache/lightning-dos)")
    parser.add_argument("--out", metavar="DIR", help="output directory (required unless --verify)")
    parser.add_argument("--verify", metavar="DIR", help="check a prepared directory's files against the checksums "
                        "in its manifest, and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``lightning-dos prepare``: 0 on success, 1 if --verify finds damage, 2 on a usage or input error."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.verify is not None:
            if args.out is not None:
                parser.error("--verify checks an existing directory; drop --out (or drop --verify to prepare)")
            manifest = verify_prepared(args.verify, key="--verify")
            totals = manifest["totals"]
            print(f"{args.verify}: OK: {len(manifest['shards'])} shard(s), {totals['tokens']:,} tokens, "
                  "every checksum matches the manifest")
            return 0
        if args.out is None:
            parser.error("--out DIR is required: the directory to write the shards and manifest to")
        if args.paths is not None and args.hf_dataset is not None:
            parser.error("--paths and --hf-dataset are alternative corpora; give only one")
        if args.tokenizer is not None and args.bpe_vocab_size is not None:
            parser.error("--tokenizer and --bpe-vocab-size are alternatives (use a tokenizer, or train one); "
                         "give only one")
        manifest = prepare_corpus(
            args.out, paths=args.paths, hf_dataset=args.hf_dataset, hf_config=args.hf_config,
            hf_split=args.hf_split, hf_text_field=args.hf_text_field, tokenizer=args.tokenizer,
            bpe_vocab_size=4096 if args.bpe_vocab_size is None else args.bpe_vocab_size, max_bytes=args.max_bytes,
            val_fraction=args.val_fraction, seed=args.seed, shard_tokens=args.shard_tokens,
            cache_dir=args.cache_dir, progress=not args.no_progress, names=CLI_NAMES,
        )
    except (ValueError, FileNotFoundError, ImportError, RuntimeError, OSError) as err:
        print(f"lightning-dos prepare: error: {err}", file=sys.stderr)
        return 1 if args.verify is not None else 2
    except KeyboardInterrupt:
        print("lightning-dos prepare: interrupted; run the same command again to continue where it stopped",
              file=sys.stderr)
        return 130
    totals = manifest["totals"]
    print(f"{args.out}: {totals['train']['tokens']:,} train tokens ({totals['train']['shards']} shard(s)), "
          f"{totals['val']['tokens']:,} val tokens ({totals['val']['shards']} shard(s)), vocabulary "
          f"{manifest['tokenizer']['vocab_size']:,}; train on it with --data.dataset {args.out}")
    return 0

