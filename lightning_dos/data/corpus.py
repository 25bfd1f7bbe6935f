"""Owns finding the raw text corpus and reading it as a deterministic stream of documents.

A document is one file, or one non-empty row of a Hugging Face dataset (:class:`Corpus` covers both). The
default corpus is the Python standard library's own ``.py`` files: it needs no network and exists on every
machine that runs Python, so a recipe works out of the box. :class:`OptionNames` spells the options as the
user set them (``data.paths`` in a recipe, ``--paths`` on the command line), so every error names its key.
"""

from __future__ import annotations

import codecs
import glob
import os
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Suffixes picked up when a directory is given: anything a tokenizer can sensibly learn from.
TEXT_SUFFIXES = frozenset(
    {
        ".txt", ".md", ".rst", ".tex", ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".rs", ".go",
        ".java", ".js", ".ts", ".sh", ".json", ".jsonl", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".csv",
        ".tsv", ".html", ".xml", ".css", ".sql",
    }
)  # fmt: skip

# Directory names never descended into: installed packages, bytecode caches and VCS metadata.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", ".git", ".hg", ".svn"})

_GLOB_CHARS = ("*", "?", "[")


def _walk(root: Path, suffixes: frozenset[str] | None) -> list[Path]:
    """Files under ``root`` (symlinked directories not followed), sorted, skipping ``_SKIP_DIRS``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place stops os.walk from descending; sorting makes the walk order reproducible.
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if suffixes is None or Path(name).suffix.lower() in suffixes:
                found.append(Path(dirpath) / name)
    return sorted(found)


def stdlib_source_files() -> list[Path]:
    """The standard library's own ``.py`` files, sorted; installed third-party packages are excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in _walk(root, frozenset({".py"})) if p.is_file()]


def resolve_paths(paths: str | list[str], key: str = "data.paths") -> list[Path]:
    """Expand files, directories (recursively, text-like files only) and glob patterns into a file list.

    Order follows ``paths``; each directory or glob contributes its files sorted; duplicates are dropped.
    ``key`` is the option named in errors.

    Raises:
        FileNotFoundError: an entry names nothing that exists (or a glob matches nothing).
        ValueError: the entries resolve to no files, or only to empty files.
    """
    entries = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    files: list[Path] = []
    for entry in entries:
        text = os.path.expanduser(str(entry))
        if any(ch in text for ch in _GLOB_CHARS):
            matches = sorted(Path(m) for m in glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{key}: the pattern {entry!r} matches no files; fix or remove it")
            for match in matches:
                files.extend(_walk(match, TEXT_SUFFIXES) if match.is_dir() else [match])
            continue
        path = Path(text)
        if path.is_dir():
            files.extend(_walk(path, TEXT_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{key}: {entry!r} does not exist; fix or remove it (omit {key} "
                                    "to use the Python standard library)")
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if not any(p.stat().st_size > 0 for p in unique):
        raise ValueError(
            f"{key}: the corpus is empty ({len(unique)} files, none with any content) for {entries!r}; "
            f"point {key} at text files or directories holding files ending in one of "
            f"{', '.join(sorted(TEXT_SUFFIXES))}"
        )
    return unique


def read_documents(files: Iterable[Path], max_bytes: int | None = None) -> Iterator[tuple[Path, str]]:
    """Yield ``(path, text)`` per file, in order, until ``max_bytes`` of raw text has been read.

    The last document is cut at the budget so the total is exact. Unreadable files, and binary files
    (containing NUL bytes), are skipped; invalid UTF-8 is replaced rather than failing the whole corpus.
    """
    remaining = max_bytes
    for path in files:
        if remaining is not None and remaining <= 0:
            return
        try:
            raw = Path(path).read_bytes()
        except OSError:
            continue  # vanished or unreadable: the rest of the corpus is still usable
        if not raw or b"\x00" in raw:
            continue
        if remaining is not None and len(raw) > remaining:
            # An incremental decode drops a multi-byte character split by the budget instead of replacing it.
            text = codecs.getincrementaldecoder("utf-8")("replace").decode(raw[:remaining], final=False)
            remaining = 0
        else:
            text = raw.decode("utf-8", errors="replace")
            remaining = None if remaining is None else remaining - len(raw)
        yield Path(path), text


@dataclass(frozen=True)
class OptionNames:
    """How each option is spelled where the user sets it; errors name these keys."""

    paths: str = "data.paths"
    hf_dataset: str = "data.hf_dataset"
    hf_config: str = "data.hf_config"
    hf_split: str = "data.hf_split"
    hf_text_field: str = "data.hf_text_field"
    max_bytes: str = "data.max_bytes"
    tokenizer: str = "data.tokenizer"
    bpe_vocab_size: str = "data.bpe_vocab_size"
    val_fraction: str = "data.val_fraction"
    seed: str = "data.seed"
    shard_tokens: str = "shard_tokens"
    out: str = "data.cache_dir"


#: Option names in a recipe (``data.*`` of TextDataModule).
DATA_NAMES = OptionNames()
#: Option names of ``lightning-dos prepare``.
CLI_NAMES = OptionNames(
    paths="--paths", hf_dataset="--hf-dataset", hf_config="--hf-config", hf_split="--hf-split",
    hf_text_field="--hf-text-field", max_bytes="--max-bytes", tokenizer="--tokenizer",
    bpe_vocab_size="--bpe-vocab-size", val_fraction="--val-fraction", seed="--seed", shard_tokens="--shard-tokens",
    out="--out",
)  # fmt: skip


def import_datasets(key: str = "data.hf_dataset") -> Any:
    """The optional ``datasets`` package, or an ImportError saying how to install it."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(f"{key} needs the Hugging Face `datasets` package: pip install 'lightning-dos[hf]' "
                          "(or use local text files instead)") from err
    return datasets


@dataclass
class Corpus:
    """A text corpus read as a deterministic stream of documents, cut at ``max_bytes`` of text.

    Either ``files`` (one file = one document; ``paths`` is how they were given, None for the standard
    library) or a Hugging Face dataset ``hf_dataset`` (one non-empty row of ``hf_text_field`` = one document).
    Build one with :meth:`from_paths` or :meth:`from_hf`.
    """

    files: list[Path] | None = None
    paths: list[str] | None = None
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "train"
    hf_text_field: str = "text"
    max_bytes: int | None = None
    names: OptionNames = DATA_NAMES
    _hf_data: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_paths(cls, paths: str | list[str] | None, max_bytes: int | None,
                   names: OptionNames = DATA_NAMES) -> Corpus:
        """Files, directories or globs (None: the standard library's ``.py`` files); a missing path fails here."""
        if paths is None:
            files = stdlib_source_files()
            if not files:
                raise ValueError(f"the Python standard library's .py files were not found here; set {names.paths}")
            return cls(files=files, paths=None, max_bytes=max_bytes, names=names)
        entries = [str(paths)] if isinstance(paths, str | os.PathLike) else [str(p) for p in paths]
        if not entries:
            raise ValueError(f"{names.paths} is an empty list: list files/directories/globs, or omit {names.paths} "
                             "to use the Python standard library")
        return cls(files=resolve_paths(entries, key=names.paths), paths=entries, max_bytes=max_bytes, names=names)

    @classmethod
    def from_hf(cls, name: str, config: str | None, split: str, text_field: str, max_bytes: int | None,
                names: OptionNames = DATA_NAMES) -> Corpus:
        """A Hugging Face dataset (loaded lazily); fails here if ``datasets`` is not installed."""
        import_datasets(names.hf_dataset)
        return cls(hf_dataset=name, hf_config=config, hf_split=split, hf_text_field=text_field,
                   max_bytes=max_bytes, names=names)

    @property
    def source_key(self) -> str:
        """The option that chose this corpus, for errors."""
        return self.names.paths if self.files is not None else self.names.hf_dataset

    def load_hf(self) -> Any:
        """The loaded Hugging Face dataset (cached), checked to have the text column."""
        if self._hf_data is None:
            datasets = import_datasets(self.names.hf_dataset)
            try:
                data = datasets.load_dataset(self.hf_dataset, self.hf_config, split=self.hf_split)
            except Exception as err:
                names = self.names
                raise RuntimeError(f"{names.hf_dataset}: could not load {self.hf_dataset!r} ({names.hf_config}="
                                   f"{self.hf_config!r}, {names.hf_split}={self.hf_split!r}): {err}") from err
            columns = list(getattr(data, "column_names", None) or [])
            if self.hf_text_field not in columns:
                key = self.names.hf_text_field
                raise ValueError(f"{key}: {self.hf_dataset!r} has no column {self.hf_text_field!r}; "
                                 f"set {key} to one of {columns}")
            self._hf_data = data
        return self._hf_data

    def documents(self) -> Iterator[str]:
        """The documents' texts, in a fixed order, the last one cut so the total stays within ``max_bytes``."""
        if self.files is not None:
            for _, text in read_documents(self.files, self.max_bytes):
                yield text
            return
        remaining = self.max_bytes
        for batch in self.load_hf().iter(batch_size=1024):
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

    def corpus_id(self) -> Any:
        """A cheap identity of the corpus (no reading): keys the tokenizer and token caches."""
        if self.files is not None:
            stats = []
            for path in self.files:
                st = os.stat(path)
                stats.append((str(path), st.st_size, st.st_mtime_ns))  # mtime: any edit makes a new key
            return {"files": stats, "max_bytes": self.max_bytes}
        data = self.load_hf()
        return {"hf": [self.hf_dataset, self.hf_config, self.hf_split, self.hf_text_field],
                "fingerprint": getattr(data, "_fingerprint", None), "rows": len(data), "max_bytes": self.max_bytes}

    def describe(self) -> dict[str, Any]:
        """How the corpus was chosen, for a manifest: no timestamps, nothing that changes between runs."""
        if self.files is not None:
            if self.paths is None:
                return {"kind": "python-stdlib", "files": len(self.files)}
            return {"kind": "paths", "paths": list(self.paths), "files": len(self.files)}
        return {"kind": "hf_dataset", "name": self.hf_dataset, "config": self.hf_config, "split": self.hf_split,
                "text_field": self.hf_text_field}
