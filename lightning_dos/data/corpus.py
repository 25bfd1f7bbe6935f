"""Owns finding the raw text corpus on disk and reading it as documents.

A document is one file. The default corpus is the Python standard library's own ``.py`` files: it needs
no network and exists on every machine that runs Python, so a recipe works out of the box.
"""

from __future__ import annotations

import codecs
import glob
import os
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

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


def resolve_paths(paths: str | list[str]) -> list[Path]:
    """Expand files, directories (recursively, text-like files only) and glob patterns into a file list.

    Order follows ``paths``; each directory or glob contributes its files sorted; duplicates are dropped.

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
                raise FileNotFoundError(f"data.paths: the pattern {entry!r} matches no files; fix or remove it")
            for match in matches:
                files.extend(_walk(match, TEXT_SUFFIXES) if match.is_dir() else [match])
            continue
        path = Path(text)
        if path.is_dir():
            files.extend(_walk(path, TEXT_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"data.paths: {entry!r} does not exist; fix or remove it (omit data.paths "
                                    "to train on the Python standard library)")
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if not any(p.stat().st_size > 0 for p in unique):
        raise ValueError(
            f"data.paths: the corpus is empty ({len(unique)} files, none with any content) for {entries!r}; "
            f"point data.paths at text files or directories holding files ending in one of "
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
