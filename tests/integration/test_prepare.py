"""CPU tests of ``lightning-dos prepare`` and of training on its output: the manifest and shards, determinism,
resuming an interrupted run, byte-identity with the single-file token cache, the errors, ``data.dataset``, and
the train loader's deterministic, resumable order (with a real Lightning Trainer resuming from a checkpoint)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, DistributedSampler

import lightning_dos.data.prepare as prepare_module
from lightning_dos.data import (
    ResumableDataLoader,
    ResumableSampler,
    TextDataModule,
    prepare_corpus,
    read_manifest,
    tokenizer_digest,
    train_bpe,
    verify_prepared,
)
from lightning_dos.data.prepare import main
from tests.support.text_corpus import document, write_corpus

N_DOCS = 30


def _document(i: int) -> str:
    return document(i, seed=1000, words=(4, 12), lines=(3, 9))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus", N_DOCS, parts=2, text=_document)


def _prepare(corpus: Path, out: Path, cache: Path, **overrides) -> dict:
    kwargs = dict(paths=[str(corpus)], bpe_vocab_size=300, val_fraction=0.2, seed=7, shard_tokens=400,
                  cache_dir=str(cache), progress=False)
    kwargs.update(overrides)
    return prepare_corpus(out, **kwargs)


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------- prepare
def test_round_trip_manifest_and_checksums(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    manifest = _prepare(corpus, out, tmp_path / "cache")
    assert json.loads((out / "manifest.json").read_text()) == manifest
    names = sorted(p.name for p in out.iterdir())
    assert names[:2] == ["manifest.json", "tokenizer.json"] and not [n for n in names if n.startswith(".")]
    assert "progress.json" not in names  # a finished run leaves only the output
    assert manifest["format_version"] == 1 and manifest["dtype"] == "uint16"
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert manifest["tokenizer"] == {"file": "tokenizer.json", "sha256": tokenizer_digest(tokenizer),
                                     "vocab_size": 300, "eos_id": 0}
    assert _sha256(out / "tokenizer.json") == manifest["tokenizer"]["sha256"]
    assert manifest["options"]["source"]["documents"] == N_DOCS and manifest["options"]["shard_tokens"] == 400
    assert {k: manifest["options"][k] for k in ("seed", "val_fraction", "max_bytes", "bpe_vocab_size")} == {
        "seed": 7, "val_fraction": 0.2, "max_bytes": None, "bpe_vocab_size": 300}

    decoded: dict[str, list[str]] = {"train": [], "val": []}
    for split in ("train", "val"):
        shards = [s for s in manifest["shards"] if s["split"] == split]
        assert [s["file"] for s in shards] == [f"{split}-{k:05d}.bin" for k in range(len(shards))]
        for k, shard in enumerate(shards):
            ids = np.fromfile(out / shard["file"], dtype=np.uint16)
            assert len(ids) == shard["tokens"] and _sha256(out / shard["file"]) == shard["sha256"]
            eos_at = np.flatnonzero(ids == 0)
            assert ids[-1] == 0 and len(eos_at) == shard["documents"]  # cut at a document boundary
            if k < len(shards) - 1:  # cut at the first boundary at or past shard_tokens
                assert shard["tokens"] >= 400 > eos_at[-2] + 1
            starts = np.concatenate([[0], eos_at[:-1] + 1])
            decoded[split] += [tokenizer.decode(ids[a:b].tolist()) for a, b in zip(starts, eos_at)]
        total = manifest["totals"][split]
        assert total == {"shards": len(shards), "documents": sum(s["documents"] for s in shards),
                         "tokens": sum(s["tokens"] for s in shards)}
    assert len(decoded["train"]) > 1 and manifest["totals"]["train"]["shards"] > 1  # several shards were cut
    assert sorted(decoded["train"] + decoded["val"]) == sorted(_document(i) for i in range(N_DOCS))
    assert len(decoded["val"]) == round(0.2 * N_DOCS) and not set(decoded["train"]) & set(decoded["val"])
    assert manifest["totals"]["tokens"] == sum(s["tokens"] for s in manifest["shards"])
    assert verify_prepared(out) == manifest


def test_cli_prepares_verifies_and_reports(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    argv = ["--paths", str(corpus / "part0"), str(corpus / "part1" / "*.txt"), "--bpe-vocab-size", "300",
            "--shard-tokens", "1e3", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert main(argv) == 0
    assert f"--data.dataset {out}" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest["options"]["shard_tokens"] == 1000 and manifest["options"]["source"]["documents"] == N_DOCS
    assert main(argv) == 0  # finished with the same options: nothing to do
    assert main(["--verify", str(out)]) == 0 and "every checksum matches" in capsys.readouterr().out
    shard = out / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[3] ^= 0xFF  # same size, other content: only the checksum can tell
    shard.write_bytes(bytes(data))
    read_manifest(out)  # sizes still match: the cheap check at every start passes
    assert main(["--verify", str(out)]) == 1
    assert f"--verify: {out}: 1 file(s) do not match the checksums" in capsys.readouterr().err


def test_deterministic_and_rerun_is_a_no_op(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Separate caches: the BPE is trained twice, so the tokenizer's determinism is covered too.
    first = _prepare(corpus, tmp_path / "a", tmp_path / "cache_a")
    second = _prepare(corpus, tmp_path / "b", tmp_path / "cache_b")
    assert first == second and _files(tmp_path / "a") == _files(tmp_path / "b")
    other_seed = _prepare(corpus, tmp_path / "c", tmp_path / "cache_a", seed=8)
    assert other_seed["shards"] != first["shards"]  # the seed does change the split

    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a").iterdir()}

    def fail(*args, **kwargs):
        raise AssertionError("a finished directory must not be tokenised again")

    monkeypatch.setattr(prepare_module, "_tokenise", fail)
    monkeypatch.setattr(prepare_module, "obtain_tokenizer", fail)
    # The same corpus named differently (a glob instead of the directory) is the same output.
    again = _prepare(corpus, tmp_path / "a", tmp_path / "cache_a", paths=[str(corpus / "part*")])
    assert again == first and {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a").iterdir()} == mtimes


@pytest.mark.parametrize("crash_at", ["after_record", "after_rename", "mid_shard"])
def test_resume_after_interruption_matches_uninterrupted_run(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    reference = _prepare(corpus, tmp_path / "reference", tmp_path / "cache")
    out = tmp_path / "out"
    progress_writes, renames, recorded = [], [], {}
    atomic_write = prepare_module.atomic_write_bytes
    fsync_dir = prepare_module._fsync_dir
    append = prepare_module._SplitWriter.append

    def write_then_stop(path, data):
        atomic_write(path, data)
        progress_writes.append(path.name)
        if path.name == "progress.json":
            recorded.update(json.loads(data)["partial"])
        if crash_at == "after_record" and progress_writes.count("progress.json") == 2:
            raise KeyboardInterrupt  # the first shard is published and recorded
    def rename_then_stop(path):
        fsync_dir(path)
        renames.append(1)
        if crash_at == "after_rename" and len(renames) == 2:
            raise KeyboardInterrupt  # the second shard is published but not recorded
    def append_then_stop(self, ids):
        full = append(self, ids)
        if crash_at == "mid_shard" and progress_writes.count("progress.json") >= 2 and recorded[self.split]:
            raise KeyboardInterrupt  # a recorded unfinished shard now holds a document written after the record
        return full

    monkeypatch.setattr(prepare_module, "atomic_write_bytes", write_then_stop)
    monkeypatch.setattr(prepare_module, "_fsync_dir", rename_then_stop)
    monkeypatch.setattr(prepare_module._SplitWriter, "append", append_then_stop)
    monkeypatch.setattr(prepare_module, "_ENCODE_BATCH", 4)
    with pytest.raises(KeyboardInterrupt):
        _prepare(corpus, out, tmp_path / "cache")
    assert not (out / "manifest.json").exists() and (out / "progress.json").is_file()
    progress = json.loads((out / "progress.json").read_text())
    assert progress["shards"][0]["file"] == "train-00000.bin" and progress["next_document"] > 0
    done = progress["next_document"]
    if crash_at == "mid_shard":  # a recorded unfinished shard on disk is longer than its record: it is cut back
        assert any(p and (out / p["file"]).stat().st_size > 2 * p["tokens"] for p in progress["partial"].values())
    monkeypatch.undo()

    resumed_appends = []

    def count_append(self, ids):
        resumed_appends.append(1)
        return append(self, ids)

    monkeypatch.setattr(prepare_module._SplitWriter, "append", count_append)
    manifest = _prepare(corpus, out, tmp_path / "cache")
    assert len(resumed_appends) == N_DOCS - done  # recorded documents were not tokenised again
    assert manifest == reference and _files(out) == _files(tmp_path / "reference")


def test_one_shard_is_byte_identical_to_single_file_layout(tmp_path: Path, corpus: Path) -> None:
    """Expected streams computed here, independently: files in sorted order, each encoded alone, ids + EOS, the
    val documents the first round(val_fraction * n) of numpy's seeded permutation."""
    out = tmp_path / "out"
    _prepare(corpus, out, tmp_path / "cache", shard_tokens=10**8)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus.rglob("*.txt"))]
    val = set(np.random.default_rng(7).permutation(len(texts))[: round(0.2 * len(texts))].tolist())
    expected = {"train": [], "val": []}
    for i, text in enumerate(texts):
        expected["val" if i in val else "train"] += tokenizer.encode(text, add_special_tokens=False).ids + [0]
    for split in ("train", "val"):
        assert sorted(p.name for p in out.glob(f"{split}-*.bin")) == [f"{split}-00000.bin"]
        assert (out / f"{split}-00000.bin").read_bytes() == np.array(expected[split], dtype=np.uint16).tobytes()

    # The data module tokenises paths through the same code into its cache: same files, same manifest.
    dm = TextDataModule(paths=[str(corpus)], bpe_vocab_size=300, max_bytes=None, val_fraction=0.2, seed=7,
                        seq_len=16, batch_size=2, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    cached = dm.token_cache_dir()
    assert _files(cached) == _files(out)


# ----------------------------------------------------------------------------------------------- errors
def test_bad_inputs_fail_with_one_error_before_tokenising(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args, **kwargs):
        raise AssertionError("tokenising started despite a bad input")

    monkeypatch.setattr(prepare_module, "_tokenise", never)
    monkeypatch.setattr(prepare_module, "obtain_tokenizer", never)
    out = tmp_path / "out"
    cache = tmp_path / "cache"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "a.txt").write_bytes(b"\x00\x01")
    (tmp_path / "binary" / "b.txt").write_bytes(b"x\x00")
    (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
    (tmp_path / "a_file").write_text("x")
    cases = [
        (dict(paths=[str(tmp_path / "nope.txt")]), FileNotFoundError, r"--paths: '.*nope\.txt' does not exist"),
        (dict(paths=[str(tmp_path / "*.md")]), FileNotFoundError, r"--paths: the pattern .* matches no files"),
        (dict(paths=[str(tmp_path / "empty")]), ValueError, r"--paths: the corpus is empty"),
        (dict(paths=[str(tmp_path / "binary")]), ValueError, r"--paths: the corpus has 0 document\(s\).*at least 2"),
        (dict(paths=[str(corpus / "part0" / "doc000.txt")]), ValueError,
         r"--paths: the corpus has 1 document\(s\) within --max-bytes=None.*at least 2.*raise --max-bytes"),
        (dict(max_bytes=5), ValueError, r"--paths: the corpus has 1 document\(s\) within --max-bytes=5"),
        (dict(tokenizer=str(tmp_path / "missing.json")), FileNotFoundError,
         r"--tokenizer: .*missing\.json.* does not exist"),
        (dict(tokenizer=str(tmp_path / "bad.json")), ValueError, r"--tokenizer: .*not a valid tokenizer\.json"),
        (dict(val_fraction=1.0), ValueError, r"--val-fraction must be strictly between 0 and 1"),
        (dict(shard_tokens=0), ValueError, r"--shard-tokens must be an integer >= 1"),
        (dict(bpe_vocab_size=100), ValueError, r"--bpe-vocab-size must be an integer >= 257"),
    ]
    for overrides, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            _prepare(corpus, out, cache, **overrides)
        assert not out.exists(), overrides  # nothing written, not even an empty directory
    with pytest.raises(ValueError, match=r"--out: .*a_file exists and is not a directory; choose a new directory"):
        _prepare(corpus, tmp_path / "a_file", cache)
    with pytest.raises(ValueError, match=r"--out: cannot write to .*a_file/sub.*choose a writable directory"):
        _prepare(corpus, tmp_path / "a_file" / "sub", cache)
    with pytest.raises(ValueError, match=r"--out: .*corpus is not empty.*holds no `lightning-dos prepare` output"):
        _prepare(corpus, corpus, cache)


def test_other_corpus_into_used_out_dir_is_refused(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    _prepare(corpus, out, tmp_path / "cache")
    before = _files(out)
    refused = r"--out: .* holds the output of a different corpus or options; choose another --out, or delete"
    for overrides in (dict(seed=8), dict(shard_tokens=500), dict(paths=[str(corpus / "part0")]), dict(max_bytes=900)):
        with pytest.raises(ValueError, match=refused):
            _prepare(corpus, out, tmp_path / "cache", **overrides)
    assert _files(out) == before
    # An unfinished run is protected the same way.
    unfinished = tmp_path / "unfinished"
    monkeypatch.setattr(prepare_module._SplitWriter, "append", lambda self, ids: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):
        _prepare(corpus, unfinished, tmp_path / "cache")
    monkeypatch.undo()
    with pytest.raises(ValueError, match=refused):
        _prepare(corpus, unfinished, tmp_path / "cache", seed=9)
    # The command line says it in one line, without a traceback.
    argv = ["--paths", str(corpus), "--out", str(out), "--seed", "3", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lightning-dos prepare: error: --out: ") and "\n" not in err
    with pytest.raises(SystemExit):
        main(["--paths", str(corpus), "--out", str(out), "--tokenizer", "t.json", "--bpe-vocab-size", "512"])
    with pytest.raises(SystemExit):
        main(["--paths", str(corpus)])  # no --out


class _StubDataset:
    """The slice of ``datasets.Dataset`` the corpus reader uses, so the optional extra is not needed here."""

    def __init__(self, rows: list[str]) -> None:
        self.rows, self.column_names, self._fingerprint = rows, ["text"], "stub-v1"

    def __len__(self) -> int:
        return len(self.rows)

    def iter(self, batch_size: int):
        for i in range(0, len(self.rows), batch_size):
            yield {"text": self.rows[i : i + batch_size]}


def test_hf_dataset_source_and_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    rows = [_document(i) if i % 4 else "" for i in range(N_DOCS)]  # empty rows are not documents
    stub = types.ModuleType("datasets")
    stub.load_dataset = lambda name, config=None, split="train": _StubDataset(rows)
    monkeypatch.setitem(sys.modules, "datasets", stub)
    out = tmp_path / "out"
    manifest = prepare_corpus(out, hf_dataset="stub/corpus", hf_config="v1", bpe_vocab_size=300, shard_tokens=500,
                              cache_dir=str(tmp_path / "cache"), progress=False)
    assert manifest["options"]["source"] == {
        "kind": "hf_dataset", "name": "stub/corpus", "config": "v1", "split": "train", "text_field": "text",
        "documents": sum(1 for r in rows if r), "bytes": sum(len(r.encode()) for r in rows),
        "sha256": manifest["options"]["source"]["sha256"]}
    with pytest.raises(ValueError, match=r"--hf-text-field: 'stub/corpus' has no column 'body'; set --hf-text-field"):
        prepare_corpus(tmp_path / "other", hf_dataset="stub/corpus", hf_text_field="body", progress=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the optional extra were not installed
    assert main(["--hf-dataset", "wikitext", "--out", str(tmp_path / "hf")]) == 2
    assert "error: --hf-dataset needs the Hugging Face `datasets` package" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_a_second_writer_and_a_garbled_manifest_are_refused(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running prepare holds
    try:
        with pytest.raises(ValueError, match=r"--out: another `lightning-dos prepare` is writing to .*out"):
            _prepare(corpus, out, tmp_path / "cache")
    finally:
        os.close(fd)
    _prepare(corpus, out, tmp_path / "cache")
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["shards"][0]["tokens"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"data\.dataset: .*manifest\.json lacks or garbles a field"):
        TextDataModule(dataset=str(out))


# ------------------------------------------------------------------------------------------ data.dataset
def test_datamodule_trains_on_a_prepared_directory(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    manifest = _prepare(corpus, out, tmp_path / "cache", bpe_vocab_size=320)
    dm = TextDataModule(dataset=str(out), seq_len=8, batch_size=2, cache_dir=str(tmp_path / "unused"))
    assert dm.vocab_size == 320 and tokenizer_digest(dm.get_tokenizer()) == manifest["tokenizer"]["sha256"]
    dm.prepare_data()
    dm.setup("fit")
    assert not (tmp_path / "unused").exists()  # a prepared directory needs no cache
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    assert len(dm.train_dataset.sources) == len(train) > 1
    assert len(dm.train_dataset) == sum((s["tokens"] - 1) // 8 for s in train)  # windows never cross shards
    second = np.fromfile(out / train[1]["file"], dtype=np.uint16)
    x, y = dm.train_dataset[(train[0]["tokens"] - 1) // 8]  # the first window of the second shard
    assert x.tolist() == second[:8].tolist() and y.tolist() == second[1:9].tolist()
    assert dm.val_dataset.num_tokens == manifest["totals"]["val"]["tokens"]
    same = TextDataModule(dataset=str(out), tokenizer=str(out / "tokenizer.json"), seq_len=8, batch_size=2)
    assert same.vocab_size == 320


def test_dataset_errors_name_the_key(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    manifest = _prepare(corpus, out, tmp_path / "cache")
    other = tmp_path / "other.json"
    train_bpe((_document(i) for i in range(N_DOCS)), 280, other)
    with pytest.raises(ValueError, match=r"data\.tokenizer \(.*other\.json.*\) is not the tokenizer data\.dataset "
                                         r"\(.*\) was prepared with.*Remove data\.tokenizer"):
        TextDataModule(dataset=str(out), tokenizer=str(other))
    with pytest.raises(FileNotFoundError, match=r"data\.dataset: .*missing_dir.* is not a directory"):
        TextDataModule(dataset=str(tmp_path / "missing_dir"))
    with pytest.raises(FileNotFoundError, match=r"data\.dataset: .*corpus.* has no manifest\.json"):
        TextDataModule(dataset=str(corpus))
    unfinished = tmp_path / "unfinished"
    monkeypatch.setattr(prepare_module._SplitWriter, "append", lambda self, ids: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):
        _prepare(corpus, unfinished, tmp_path / "cache")
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match=r"data\.dataset: .*unfinished run: run the same `lightning-dos "
                                                r"prepare` command again"):
        TextDataModule(dataset=str(unfinished))
    shard = out / manifest["shards"][-1]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match=rf"data\.dataset: .* does not match its manifest: {shard.name} has"):
        TextDataModule(dataset=str(out))
    _prepare(corpus, tmp_path / "small", tmp_path / "cache")
    with pytest.raises(ValueError, match=r"data\.seq_len.*prepare a larger data\.dataset"):
        TextDataModule(dataset=str(tmp_path / "small"), seq_len=10_000).setup("fit")


# -------------------------------------------------------------------------------------- sampler, loader
def test_sampler_epoch0_is_the_previous_shuffled_order() -> None:
    for n, seed in ((1, 0), (37, 1234), (250, 7)):
        generator = torch.Generator()
        generator.manual_seed(seed)
        before = [int(i) for batch in DataLoader(range(n), batch_size=3, shuffle=True, generator=generator)
                  for i in batch]
        sampler = ResumableSampler(range(n), seed=seed)
        assert list(sampler) == before
        sampler.set_epoch(1)
        if n > 2:
            assert list(sampler) != before and sorted(sampler) == list(range(n))
        sampler.set_epoch(0)
        assert list(sampler) == before  # each epoch's order is a function of (seed, epoch) alone
    ranks = [list(ResumableSampler(range(100), num_replicas=3, rank=r, seed=5)) for r in range(3)]
    assert [len(r) for r in ranks] == [33, 33, 33] and len(set().union(*ranks)) == 99  # disjoint, equal shares


def test_datamodule_train_order_and_ranks(tmp_path: Path, corpus: Path) -> None:
    dm = TextDataModule(paths=[str(corpus)], bpe_vocab_size=300, max_bytes=None, seq_len=8, batch_size=3, seed=11,
                        cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and isinstance(loader.sampler, DistributedSampler)
    generator = torch.Generator()
    generator.manual_seed(11)
    before = DataLoader(dm.train_dataset, batch_size=3, shuffle=True, generator=generator, drop_last=True)
    batches = list(loader)
    assert len(batches) == len(before) == len(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, before))
    assert loader.state_dict() == {"epoch": 0, "batches": len(batches)}
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)  # what a two-rank Trainer reports
    sampler = dm.train_dataloader().sampler
    assert (sampler.num_replicas, sampler.rank) == (2, 1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_skips_the_batches_already_yielded(num_workers: int) -> None:
    data = [torch.tensor([i]) for i in range(40)]

    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(data, batch_size=4, sampler=ResumableSampler(data, seed=3),
                                   num_workers=num_workers, drop_last=True)

    full = loader()
    epoch0 = [b.tolist() for b in full]
    full.sampler.set_epoch(1)
    epoch1 = [b.tolist() for b in full]
    assert len(epoch0) == 10 and epoch0 != epoch1

    partial = loader()
    iterator = iter(partial)
    seen = [next(iterator).tolist() for _ in range(3)]  # workers have prefetched more than this
    assert seen == epoch0[:3] and partial.state_dict() == {"epoch": 0, "batches": 3}
    del iterator
    resumed = loader()
    resumed.load_state_dict({"epoch": 0, "batches": 3})
    assert resumed.state_dict() == {"epoch": 0, "batches": 3}
    assert [b.tolist() for b in resumed] == epoch0[3:] and len(resumed) == 10
    assert resumed.state_dict() == {"epoch": 0, "batches": 10}
    assert [b.tolist() for b in resumed] == epoch0  # the skip applies once

    later = loader()
    later.load_state_dict({"epoch": 1, "batches": 4})
    assert [b.tolist() for b in later] == epoch1[4:]
    finished = loader()
    finished.load_state_dict({"epoch": 0, "batches": 10})  # saved at the end of epoch 0
    finished.sampler.set_epoch(1)
    assert [b.tolist() for b in finished] == epoch1


class _Recorder(pl.LightningModule):
    """Records the batches it trains on; learns nothing (lr 0), so only the data order is under test."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.seen: list[list[list[int]]] = []

    def training_step(self, batch, batch_idx):
        x, _ = batch
        self.seen.append(x.tolist())
        return self.layer(x.float()).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(dm: TextDataModule, max_steps: int, ckpt_dir: Path | None = None, every: int = 0,
         ckpt_path: Path | None = None) -> _Recorder:
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, filename="{step}", every_n_train_steps=every, save_top_k=-1)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, limit_val_batches=0,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks if ckpt_dir is not None else None,
                         enable_checkpointing=ckpt_dir is not None)
    module = _Recorder()
    trainer.fit(module, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None)
    return module


@pytest.mark.parametrize(("resume_at", "num_workers"), [("mid_epoch_0", 0), ("end_of_epoch_0", 0), ("mid_epoch_1", 2)])
def test_lightning_resume_sees_the_uninterrupted_batches(
    tmp_path: Path, corpus: Path, resume_at: str, num_workers: int
) -> None:
    def data() -> TextDataModule:
        return TextDataModule(paths=[str(corpus)], bpe_vocab_size=300, max_bytes=None, seq_len=8, batch_size=16,
                              seed=5, num_workers=num_workers, cache_dir=str(tmp_path / "cache"))

    per_epoch = len(data().train_dataloader())
    assert per_epoch >= 4
    every = {"mid_epoch_0": 3, "end_of_epoch_0": per_epoch, "mid_epoch_1": per_epoch + 2}[resume_at]
    total = every + per_epoch  # crosses into the next epoch after the resume point
    uninterrupted = _fit(data(), total, tmp_path / "ckpt", every=every).seen
    assert len(uninterrupted) == total
    checkpoint = tmp_path / "ckpt" / f"step={every}.ckpt"
    state = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    epoch, done = divmod(every, per_epoch)
    if done == 0:  # saved at the last batch of an epoch, before the next one starts
        epoch, done = epoch - 1, per_epoch
    assert state == [{"epoch": epoch, "batches": done}]  # = the batches trained on

    resumed = _fit(data(), total, ckpt_path=checkpoint).seen
    assert resumed == uninterrupted[every:]
    epoch_start = epoch * per_epoch
    assert resumed != uninterrupted[epoch_start : epoch_start + len(resumed)]  # restarting the epoch would differ
