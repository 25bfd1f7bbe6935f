"""A small synthetic text corpus for the data tests: documents with a unique first word, written as files."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud tensor "
         "gradient shard window token offload interleave optimizer state memory device host").split()


def document(i: int, *, seed: int = 0, words: tuple[int, int] = (6, 14), lines: int | tuple[int, int] = 12) -> str:
    """Document ``i``: lines of random words, the first starting ``docNNN`` so a test can tell where it landed."""
    rng = random.Random(seed + i)
    n_lines = lines if isinstance(lines, int) else rng.randint(*lines)
    text = [f"doc{i:03d} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(n_lines)]
    return "\n".join(text) + "\n"


def write_corpus(root: Path, n_docs: int, parts: int, text: Callable[[int], str] = document) -> Path:
    """``n_docs`` documents as ``root/part{i % parts}/docNNN.txt``; returns ``root``."""
    for i in range(n_docs):
        sub = root / f"part{i % parts}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:03d}.txt").write_text(text(i), encoding="utf-8")
    return root
