"""CPU tests of the data pipeline: corpus resolution, BPE tokenizer and its cache, the token cache and
split, (x, y) windows and shuffling, pre-tokenised shards, and the synthetic benchmark module.
(``lightning-dos prepare``, ``data.dataset`` and the resumable train order: tests/integration/test_prepare.py.)"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import lightning_dos.data.prepare as prepare_module
import lightning_dos.data.text as text_module
import lightning_dos.data.tokenizer as tokenizer_module
from lightning_dos.data import (
    EOS_TOKEN,
    SyntheticDataModule,
    TextDataModule,
    load_tokenizer,
    read_documents,
    resolve_paths,
    split_indices,
    stdlib_source_files,
    train_bpe,
)
from tests.support.text_corpus import document, write_corpus

N_DOCS = 40


def _document(i: int) -> str:
    # a unique marker per document lets the tests tell which split each document landed in
    return document(i)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus", N_DOCS, parts=3)


def _module(corpus: Path, cache: Path, **overrides) -> TextDataModule:
    kwargs = dict(paths=[str(corpus)], bpe_vocab_size=320, max_bytes=None, seq_len=16, batch_size=4,
                  val_fraction=0.25, seed=7, cache_dir=str(cache))
    kwargs.update(overrides)
    return TextDataModule(**kwargs)


def _split_tokens(dm: TextDataModule, split: str) -> np.ndarray:
    """A cached split's token stream: its shards, in order."""
    shards = sorted(dm.token_cache_dir().glob(f"{split}-*.bin"))
    return np.concatenate([np.fromfile(p, dtype=np.uint16) for p in shards])


def _split_documents(dm: TextDataModule) -> dict[str, list[str]]:
    """Decode each cached split back into its documents (split on EOS)."""
    tokenizer = dm.get_tokenizer()
    eos = tokenizer.token_to_id(EOS_TOKEN)
    out = {}
    for split in ("train", "val"):
        ids = _split_tokens(dm, split)
        assert ids[-1] == eos  # every document ends with EOS
        cuts = np.flatnonzero(ids == eos)
        starts = np.concatenate([[0], cuts[:-1] + 1])
        out[split] = [tokenizer.decode(ids[a:b].tolist()) for a, b in zip(starts, cuts)]
    return out


# ------------------------------------------------------------------------------------------------ corpus
def test_resolve_paths_files_directories_globs(tmp_path: Path, corpus: Path) -> None:
    (corpus / "__pycache__").mkdir()
    (corpus / "__pycache__" / "x.txt").write_text("cached")
    (corpus / "weights.bin").write_bytes(b"\x00\x01")
    single = corpus / "part0" / "doc000.txt"

    from_dir = resolve_paths(str(corpus))
    assert len(from_dir) == N_DOCS and from_dir == sorted(from_dir)
    assert all(p.suffix == ".txt" and "__pycache__" not in p.parts for p in from_dir)

    from_glob = resolve_paths([str(corpus / "part1" / "*.txt")])
    assert [p.name for p in from_glob] == sorted(f"doc{i:03d}.txt" for i in range(N_DOCS) if i % 3 == 1)

    # Files keep the order given; an entry also covered by a directory is not listed twice.
    mixed = resolve_paths([str(single), str(corpus / "part0")])
    assert mixed[0] == single.resolve() and len(mixed) == len(set(mixed)) == len(from_dir) // 3 + 1


def test_resolve_paths_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data\.paths.*nope\.txt"):
        resolve_paths([str(tmp_path / "nope.txt")])
    with pytest.raises(FileNotFoundError, match=r"data\.paths.*matches no files"):
        resolve_paths(str(tmp_path / "*.md"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(ValueError, match=r"data\.paths: the corpus is empty"):
        resolve_paths(str(tmp_path / "empty"))
    (tmp_path / "binonly").mkdir()
    (tmp_path / "binonly" / "blob.bin").write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"data\.paths: the corpus is empty"):
        resolve_paths(str(tmp_path / "binonly"))


def test_read_documents_budget_and_skips(tmp_path: Path) -> None:
    files = []
    for i, payload in enumerate([b"hello world\n", b"\x00binary\x00", "caf\u00e9 \u2603\n".encode(), b"tail\n"]):
        files.append(tmp_path / f"f{i}.txt")
        files[-1].write_bytes(payload)
    docs = list(read_documents(files))
    assert [p.name for p, _ in docs] == ["f0.txt", "f2.txt", "f3.txt"]  # the binary file is skipped
    assert docs[1][1] == "caf\u00e9 \u2603\n"
    # 16 bytes: all of f0 (12), then 4 of f2, which end inside "\u00e9": the split character is dropped.
    cut = list(read_documents(files, max_bytes=16))
    assert [t for _, t in cut] == ["hello world\n", "caf"]
    assert list(read_documents(files, max_bytes=16)) == cut


def test_stdlib_corpus_is_default_and_sorted() -> None:
    files = stdlib_source_files()
    assert len(files) > 100 and files == sorted(files)
    assert all(p.suffix == ".py" for p in files)
    assert not any({"site-packages", "dist-packages", "__pycache__"} & set(p.parts) for p in files)
    assert any(p.name == "os.py" for p in files)


# --------------------------------------------------------------------------------------------- tokenizer
def test_bpe_train_round_trip_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "tok" / "tokenizer.json"
    tokenizer = train_bpe((_document(i) for i in range(N_DOCS)), 300, path)
    assert path.is_file() and not list(path.parent.glob(".*tmp*"))  # written atomically, no temp left behind
    assert tokenizer.token_to_id(EOS_TOKEN) == 0
    assert tokenizer.get_vocab_size() == 300
    samples = [_document(3), "  leading spaces\tand tabs\r\n", "unicode: caf\u00e9 \u2603 \u4e2d\u6587 \U0001f600",
               "def f(x):\n    return x ** 2  # unseen words too\n", ""]
    reloaded = load_tokenizer(str(path))
    for s in samples:
        ids = tokenizer.encode(s).ids
        assert tokenizer.decode(ids) == s
        assert reloaded.encode(s).ids == ids
    assert load_tokenizer(str(path.parent)).encode(samples[0]).ids == tokenizer.encode(samples[0]).ids


def test_load_tokenizer_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"data\.tokenizer"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))

    def offline(name: str):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(tokenizer_module.Tokenizer, "from_pretrained", staticmethod(offline))
    with pytest.raises(OSError, match=r"data\.tokenizer.*unreachable.*tokenizer\.json"):
        load_tokenizer("some-org/some-tokenizer")


# ------------------------------------------------------------------------------------- config validation
def test_datamodule_rejects_bad_config(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"data\.paths and data\.shards"):
        TextDataModule(paths=[str(corpus)], shards=str(tmp_path / "*.npy"), cache_dir=str(cache))
    with pytest.raises(ValueError, match=r"data\.paths and data\.hf_dataset"):
        TextDataModule(paths=[str(corpus)], hf_dataset="wikitext", cache_dir=str(cache))
    with pytest.raises(ValueError, match=r"data\.paths and data\.dataset.*set only one of"):
        TextDataModule(paths=[str(corpus)], dataset=str(tmp_path / "prepared"), cache_dir=str(cache))
    with pytest.raises(ValueError, match=r"data\.seq_len"):
        _module(corpus, cache, seq_len=0)
    with pytest.raises(ValueError, match=r"data\.batch_size"):
        _module(corpus, cache, batch_size=0)
    with pytest.raises(ValueError, match=r"data\.val_fraction"):
        _module(corpus, cache, val_fraction=1.0)
    with pytest.raises(ValueError, match=r"data\.bpe_vocab_size"):
        _module(corpus, cache, bpe_vocab_size=100)
    with pytest.raises(FileNotFoundError, match=r"data\.paths.*not_there"):
        _module(corpus, cache, paths=[str(corpus), str(tmp_path / "not_there")])
    with pytest.raises(ValueError, match=r"data\.paths.*at least 2"):
        _module(corpus, cache, paths=[str(corpus / "part0" / "doc000.txt")])
    with pytest.raises(ValueError, match=r"data\.tokenizer.*data\.shards"):
        TextDataModule(shards=str(corpus / "**" / "*.txt"), tokenizer="gpt2", cache_dir=str(cache))
    with pytest.raises(FileNotFoundError, match=r"data\.shards"):
        TextDataModule(shards=str(tmp_path / "none" / "*.npy"), cache_dir=str(cache))
    monkeypatch.setitem(sys.modules, "datasets", None)  # behave as if the optional extra is not installed
    with pytest.raises(ImportError, match=r"data\.hf_dataset.*lightning-dos\[hf\]"):
        TextDataModule(hf_dataset="wikitext", cache_dir=str(cache))
    assert not cache.exists()  # bad configs fail before anything is cached


def test_default_cache_dir_from_env(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_DOS_CACHE", str(tmp_path / "envcache"))
    dm = TextDataModule(paths=[str(corpus)])
    assert dm.cache_dir == tmp_path / "envcache"


# --------------------------------------------------------------------------------- caches, split, windows
def test_vocab_size_before_prepare_and_cache_reuse(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = _module(corpus, cache)
    assert first.vocab_size == 320  # trains the tokenizer; works before prepare_data, as the CLI link needs
    assert not (cache / "tokens").exists()
    first.prepare_data()
    first.setup("fit")
    files = sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))
    assert {p.name for p in files} >= {"train-00000.bin", "val-00000.bin", "manifest.json", "tokenizer.json"}
    assert not [p for p in files if p.name == "progress.json" or p.name.endswith(".partial")]  # a finished run
    assert not [p for p in files if ".tmp-" in p.name]  # atomic writes leave no temp files
    mtimes = {p: p.stat().st_mtime_ns for p in files}

    def fail(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(tokenizer_module, "train_bpe", fail)
    monkeypatch.setattr(text_module, "prepare_corpus", fail)
    second = _module(corpus, cache)
    assert second.vocab_size == 320
    second.prepare_data()
    second.setup("fit")
    assert {p: p.stat().st_mtime_ns for p in files} == mtimes
    x1, _ = next(iter(first.train_dataloader()))
    x2, _ = next(iter(second.train_dataloader()))
    assert torch.equal(x1, x2)


def test_interrupted_cache_build_is_unused_then_finished(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = _module(corpus, tmp_path / "cache")
    original = prepare_module._SplitWriter.append
    calls = []

    def crash_midway(self, ids):
        calls.append(1)
        if len(calls) > 10:
            raise RuntimeError("disk full")
        return original(self, ids)

    monkeypatch.setattr(prepare_module, "_ENCODE_BATCH", 8)
    monkeypatch.setattr(prepare_module._SplitWriter, "append", crash_midway)
    with pytest.raises(RuntimeError, match="disk full"):
        dm.prepare_data()
    out = dm.token_cache_dir()
    assert len(calls) == 11 and not (out / "manifest.json").exists()  # no manifest: never read as a finished cache
    assert not list(out.glob("*-*.bin"))  # nothing published under a shard's final name
    monkeypatch.undo()
    dm.prepare_data()  # a later run finishes the cache
    clean = _module(corpus, tmp_path / "clean")
    clean.prepare_data()
    for name in ("manifest.json", "train-00000.bin", "val-00000.bin", "tokenizer.json"):
        assert (out / name).read_bytes() == (clean.token_cache_dir() / name).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "tokenizer.json", "train-00000.bin",
                                                     "val-00000.bin"]


def test_split_is_by_document_deterministic_and_disjoint(tmp_path: Path, corpus: Path) -> None:
    documents = {_document(i) for i in range(N_DOCS)}
    dm = _module(corpus, tmp_path / "a")
    dm.prepare_data()
    split = _split_documents(dm)
    train, val = set(split["train"]), set(split["val"])
    assert len(val) == round(0.25 * N_DOCS) and not (train & val) and train | val == documents

    again = _module(corpus, tmp_path / "b")  # fresh cache, same seed: the same split is rebuilt
    again.prepare_data()
    assert _split_documents(again) == split
    other = _module(corpus, tmp_path / "c", seed=8)
    other.prepare_data()
    assert set(_split_documents(other)["val"]) != val
    assert other.token_cache_dir() != dm.token_cache_dir()  # the seed is part of the cache key

    train_idx, val_idx = split_indices(N_DOCS, 0.01, 0)
    assert len(val_idx) == 1 and len(train_idx) == N_DOCS - 1  # at least one validation document


def test_windows_shift_and_seeded_shuffle(tmp_path: Path, corpus: Path) -> None:
    dm = _module(corpus, tmp_path / "cache")
    dm.prepare_data()
    dm.setup("fit")
    tokens = _split_tokens(dm, "train")
    length = dm.seq_len
    assert len(dm.train_dataset) == (len(tokens) - 1) // length
    for i in (0, 1, len(dm.train_dataset) - 1):
        x, y = dm.train_dataset[i]
        assert x.dtype == y.dtype == torch.long
        assert x.tolist() == tokens[i * length : i * length + length].tolist()
        assert y.tolist() == tokens[i * length + 1 : i * length + length + 1].tolist()

    loader = dm.train_dataloader()
    batches = [x for x, _ in loader]
    assert len(batches) == len(dm.train_dataset) // dm.batch_size  # drop_last
    x, y = next(iter(loader))
    assert x.shape == y.shape == (dm.batch_size, length)
    assert torch.equal(x[:, 1:], y[:, :-1])

    same = [x for x, _ in dm.train_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(batches, same))
    in_order = [dm.train_dataset[i][0] for i in range(dm.batch_size)]
    assert not torch.equal(batches[0], torch.stack(in_order))  # shuffled
    dm.seed = 99  # the datasets are already built, so only the shuffle seed changes
    assert not all(torch.equal(a, b) for a, b in zip(batches, (x for x, _ in dm.train_dataloader())))

    val = [x for x, _ in dm.val_dataloader()]
    assert torch.equal(val[0][0], dm.val_dataset[0][0])  # validation is not shuffled


def test_too_short_split_names_seq_len(tmp_path: Path, corpus: Path) -> None:
    dm = _module(corpus, tmp_path / "cache", seq_len=100_000)
    dm.prepare_data()
    with pytest.raises(ValueError, match=r"data\.seq_len.*data\.max_bytes"):
        dm.setup("fit")


class _StubDataset:
    """The slice of ``datasets.Dataset`` the data module uses, so the optional extra is not needed here."""

    def __init__(self, rows: list[str]) -> None:
        self.rows, self.column_names, self._fingerprint = rows, ["text", "id"], "stub-v1"

    def __len__(self) -> int:
        return len(self.rows)

    def iter(self, batch_size: int):
        for i in range(0, len(self.rows), batch_size):
            yield {"text": self.rows[i : i + batch_size], "id": list(range(i, i + batch_size))}


def test_hf_dataset_source_with_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_document(i) if i % 5 else "" for i in range(N_DOCS)]  # empty rows are skipped, not documents
    stub = types.ModuleType("datasets")
    stub.load_dataset = lambda name, config=None, split="train": _StubDataset(rows)
    monkeypatch.setitem(sys.modules, "datasets", stub)
    dm = TextDataModule(hf_dataset="stub/corpus", bpe_vocab_size=300, max_bytes=None, seq_len=16, batch_size=2,
                        val_fraction=0.25, cache_dir=str(tmp_path))
    assert dm.vocab_size == 300
    dm.prepare_data()
    split = _split_documents(dm)
    assert set(split["train"]) | set(split["val"]) == {r for r in rows if r}
    assert len(split["val"]) == round(0.25 * sum(1 for r in rows if r))
    wrong_field = TextDataModule(hf_dataset="stub/corpus", hf_text_field="body", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"data\.hf_text_field.*'text'"):
        _ = wrong_field.vocab_size


# -------------------------------------------------------------------------------------------------- shards
def test_npy_shards_split_by_file(tmp_path: Path) -> None:
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for k in range(4):
        np.save(shard_dir / f"shard{k}.npy", (np.arange(200) + 1000 * k).astype(np.uint16))
    dm = TextDataModule(shards=str(shard_dir / "*.npy"), shards_vocab_size=5000, seq_len=8, batch_size=2,
                        val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    assert dm.vocab_size == 5000
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.val_dataset.sources) == 1 and len(dm.train_dataset.sources) == 3
    assert {s[0] for s in dm.val_dataset.sources}.isdisjoint({s[0] for s in dm.train_dataset.sources})
    assert len(dm.train_dataset) == 3 * (199 // 8)  # windows never cross a shard boundary
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 8) and torch.equal(y, x + 1)  # arange shards: the target is the next id
    assert not (tmp_path / "cache").exists()  # shards need no cache


def test_bin_shard_tail_split_and_id_check(tmp_path: Path) -> None:
    (np.arange(1000) % 500).astype(np.uint16).tofile(tmp_path / "tokens.bin")
    dm = TextDataModule(shards=str(tmp_path / "*.bin"), shards_vocab_size=500, seq_len=16, batch_size=2,
                        val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    (_, _, a, b), (_, _, c, d) = dm.train_dataset.sources[0], dm.val_dataset.sources[0]
    assert (a, b, c, d) == (0, 900, 900, 1000)
    assert dm.val_dataset[0][0].tolist() == [(900 + i) % 500 for i in range(16)]

    too_small = TextDataModule(shards=str(tmp_path / "*.bin"), shards_vocab_size=400, seq_len=16,
                               cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"data\.shards_vocab_size"):
        too_small.setup("fit")


# ----------------------------------------------------------------------------------------------- synthetic
def test_synthetic_module_is_deterministic() -> None:
    dm = SyntheticDataModule(vocab_size=97, seq_len=12, batch_size=3, num_batches=5, seed=1)
    assert dm.vocab_size == 97
    batches = list(dm.train_dataloader())
    assert len(batches) == 5
    for x, y in batches:
        assert x.shape == y.shape == (3, 12) and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 97 and int(x.min()) >= 0
    again = list(SyntheticDataModule(vocab_size=97, seq_len=12, batch_size=3, num_batches=5, seed=1).train_dataloader())
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    other = list(SyntheticDataModule(vocab_size=97, seq_len=12, batch_size=3, num_batches=5, seed=2).train_dataloader())
    assert not torch.equal(batches[0][0], other[0][0])
    val = next(iter(dm.val_dataloader()))[0]
    assert not torch.equal(val, batches[0][0])
    with pytest.raises(ValueError, match=r"data\.seq_len"):
        SyntheticDataModule(seq_len=0)


# --------------------------------------------------------------------------------------- real default corpus
def test_stdlib_corpus_end_to_end(tmp_path: Path) -> None:
    dm = TextDataModule(max_bytes=300_000, bpe_vocab_size=512, seq_len=64, batch_size=4, cache_dir=str(tmp_path))
    assert dm.vocab_size == 512
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_dataset) > 100 and len(dm.val_dataset) >= 1
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 64) and torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 512
    tokenizer = dm.get_tokenizer()
    source = stdlib_source_files()[0].read_text(encoding="utf-8", errors="replace")[:2000]
    assert tokenizer.decode(tokenizer.encode(source).ids) == source
