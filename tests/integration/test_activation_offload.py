"""Activation offload: bit-identical training with activations in host memory or files, and the rules of what moves.

Every parity test compares against the same run without offload, bit for bit (``torch.equal`` on gradients or fp32
masters, ``==`` on losses), on a small GPT with and without activation checkpointing: plain torch, plain Lightning,
the DOS strategy (through its own ``activation_offload`` argument) and DeepSpeed's ZeRO-3 offload (through the
callback), with ZeRO-3 gathering and releasing every parameter (persistence 0). On the CPU the copy lanes and the
NVMe I/O are real threads, so the ordering tests hold their copies at gates the test opens, and check that the reader
arrived before the bytes had landed and still read them only once they had (no sleep, no measured wait).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_dos import DeepOptimizerStatesStrategy, ZeRO3OffloadStrategy
from lightning_dos.activations import ActivationOffload, ActivationOffloadCallback, options, pool, store, streams
from lightning_dos.activations.store import RUN_DIR_PREFIX, NVMeStore
from lightning_dos.models.gpt import GPT, GPTConfig
from tests.support.offload_fit import BATCH, LAYERS, SEQ, VOCAB, dos_strategy, fit, offload_callback


# ---------------------------------------------------------------------- helpers
def tiny_gpt(checkpointing: bool) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=LAYERS, n_embd=32, n_head=4, n_kv_head=2, vocab_size=VOCAB, block_size=SEQ,
                         activation_checkpointing=checkpointing))


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, VOCAB, (n, BATCH, SEQ + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def train_plain(offload: ActivationOffload | None, checkpointing: bool, steps: int = 2
                ) -> tuple[list[float], list[list[torch.Tensor]]]:
    """A few SGD steps of the tiny GPT in plain torch; losses and every step's gradients."""
    model = tiny_gpt(checkpointing)
    if offload is not None:
        offload.attach(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for x, y in batches(steps):
        opt.zero_grad()
        if offload is not None:
            offload.begin_step()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        if offload is not None:
            offload.end_step()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return losses, grads


def assert_identical(run: tuple[list[float], list[list[torch.Tensor]]],
                     ref: tuple[list[float], list[list[torch.Tensor]]]) -> None:
    assert run[0] == ref[0] and len(run[1]) == len(ref[1])
    for step, (got, want) in enumerate(zip(run[1], ref[1])):
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"step {step}: gradient {i} differs"


def make_offload(placement: str, tmp_path: Path, **kwargs: Any) -> ActivationOffload:
    kwargs.setdefault("min_tensor_bytes", 0)
    nvme = {"nvme_path": tmp_path} if placement == "nvme" else {}
    return ActivationOffload(placement, record_decisions=True, **nvme, **kwargs)


@pytest.fixture(scope="module")
def reference() -> dict[bool, tuple[list[float], list[list[torch.Tensor]]]]:
    return {ckpt: train_plain(None, ckpt) for ckpt in (False, True)}


# ---------------------------------------------------------------------- plain torch parity
@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_plain_torch_is_bit_identical(placement: str, checkpointing: bool, tmp_path: Path,
                                      reference: dict) -> None:
    offload = make_offload(placement, tmp_path)
    run = train_plain(offload, checkpointing)
    assert_identical(run, reference[checkpointing])
    m = offload.metrics()
    assert m["act/offloaded_bytes"] > 0 and m["act/offloaded_bytes"] == m["act/restored_bytes"]
    assert m["act/late_restores"] == 0  # every restore was prefetched before backward asked for it
    assert offload.live_entries == 0
    if placement == "nvme":
        assert m["act/nvme_written_bytes"] == m["act/nvme_read_bytes"] == m["act/offloaded_bytes"]
        offload.store.drain()
        assert offload.store.files() == []  # each file went once backward had read it
    offload.close()
    assert list(tmp_path.iterdir()) == []


def test_checkpointing_offloads_only_the_block_inputs(tmp_path: Path) -> None:
    offload = make_offload("host", tmp_path, keep_last_layers=0)
    train_plain(offload, checkpointing=True, steps=1)
    moved = [d for d in offload.decisions if d.action == "offload" and d.layer < LAYERS]
    x_bytes = BATCH * SEQ * 32 * 4
    # one residual-stream input per block (the rotary tables are one storage shared by every block)
    assert sorted(d.layer for d in moved if d.nbytes == x_bytes) == list(range(LAYERS))
    offload.close()


def test_host_pool_is_reused_across_steps(tmp_path: Path) -> None:
    offload = make_offload("host", tmp_path)
    model = tiny_gpt(False)
    offload.attach(model)
    allocations = []
    for x, y in batches(3):
        with offload:
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        allocations.append(offload._pool.allocations)
    assert allocations[0] > 0 and allocations[0] == allocations[1] == allocations[2]
    assert offload.metrics()["act/host_pool_bytes"] == offload._pool.capacity_bytes
    offload.close()


def test_keep_placement_measures_what_offload_saves(tmp_path: Path) -> None:
    peaks = {}
    for placement in ("keep", "host"):
        offload = make_offload(placement, tmp_path, keep_last_layers=1)
        train_plain(offload, checkpointing=False, steps=1)
        peaks[placement] = offload.metrics()
        offload.close()
    keep, host = peaks["keep"], peaks["host"]
    assert keep["act/offloaded_bytes"] == 0 and keep["act/kept_placement"] > 0
    assert host["act/device_peak_bytes"] < keep["act/device_peak_bytes"]
    assert keep["act/saved_tensors"] == host["act/saved_tensors"]


# ---------------------------------------------------------------------- what moves
def test_last_layers_and_the_tail_stay(tmp_path: Path) -> None:
    offload = make_offload("host", tmp_path, keep_last_layers=2)
    train_plain(offload, checkpointing=False, steps=1)
    by_layer: dict[int, set[str]] = {}
    for d in offload.decisions:
        if d.reason != "parameter":
            by_layer.setdefault(d.layer, set()).add(d.reason or d.action)
    assert "offload" in by_layer[0] and "offload" in by_layer[1]
    assert by_layer[2] <= {"last_layers", "dedup"} and by_layer[3] <= {"last_layers", "dedup"}
    assert by_layer[LAYERS] <= {"tail", "dedup"}
    offload.close()
    none_kept = make_offload("host", tmp_path, keep_last_layers=0)
    train_plain(none_kept, checkpointing=False, steps=1)
    assert any(d.action == "offload" and d.layer == LAYERS - 1 for d in none_kept.decisions)
    assert not any(d.action == "offload" and d.layer == LAYERS for d in none_kept.decisions)
    none_kept.close()


def test_small_tensors_stay(tmp_path: Path) -> None:
    threshold = 20_000
    offload = make_offload("host", tmp_path, min_tensor_bytes=threshold, keep_last_layers=0)
    train_plain(offload, checkpointing=False, steps=1)
    small = [d for d in offload.decisions if d.nbytes < threshold and d.reason != "parameter"]
    large = [d for d in offload.decisions if d.nbytes >= threshold and d.layer < LAYERS and d.reason != "parameter"]
    assert small and all(d.reason == "small" or d.action == "dedup" for d in small)
    assert large and all(d.action in ("offload", "dedup") for d in large)
    assert offload.metrics()["act/kept_small"] == sum(d.reason == "small" for d in offload.decisions)
    offload.close()


class ParamSaver(nn.Module):
    """Saves a parameter itself (mul), a view of one (linear's transposed weight) and a cast of one."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(64, 64))
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x * self.scale)
        return (h.double() @ self.scale.double()).float()  # the float64 cast of the weight is saved


def _torch_linear() -> Any:
    """torch's own ``linear``, whether or not an earlier ZeRO-3 engine of this process replaced it."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    return getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None) or torch.nn.functional.linear


def _zero3_linear() -> Any:
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    return zero3_linear_wrap


@pytest.mark.parametrize(("linear", "kept"), [(_torch_linear, 3), (_zero3_linear, 4)], ids=["torch", "zero3"])
def test_parameters_are_never_offloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linear: Any,
                                        kept: int) -> None:
    """Under torch's ``linear`` three tensors saved are parameters (scale, lin.weight.t(), scale.double()); under the
    ``linear`` a ZeRO-3 engine puts into torch, a fourth: the weight itself. None of them is offloaded."""
    monkeypatch.setattr(torch.nn.functional, "linear", linear())
    torch.manual_seed(0)
    model = ParamSaver()
    x = torch.randn(64, 64, requires_grad=True)
    ref = torch.autograd.grad(model(x).square().sum(), [x, *model.parameters()])
    offload = make_offload("host", tmp_path, layers=[model], keep_last_layers=0)
    with offload:
        got = torch.autograd.grad(model(x).square().sum(), [x, *model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert offload.metrics()["act/kept_parameter"] == kept
    moved = [d for d in offload.decisions if d.action == "offload"]
    assert moved and not any(d.storage_ptr in params for d in moved)
    offload.close()


class Saver(nn.Module):
    """Saves the same storage twice (x * x), two views of one output, a non-contiguous view with an offset, and a
    sparse matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 32))

    def forward(self, x: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        sq = x * x  # mul saves both operands: one storage, two saves
        h = sq @ self.w
        a, b = h[:, 1:17], h[:, 16:]  # views of one storage, offset and strided
        y = a.t() @ b
        return y.sum() + torch.sparse.mm(sparse, x).sum() + (sq.tanh() * 2).sum()


def test_dedup_views_and_odd_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Saver()
    x = torch.randn(64, 32, requires_grad=True)
    sparse = torch.randn(8, 64).relu().to_sparse().requires_grad_()
    ref = torch.autograd.grad(model(x, sparse), [x, model.w, sparse])
    offload = make_offload("host", tmp_path, layers=[model], keep_last_layers=0)
    with offload:
        got = torch.autograd.grad(model(x, sparse), [x, model.w, sparse])
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert torch.equal(got[2].to_dense(), ref[2].to_dense())
    m = offload.metrics()
    x_ptr = x.untyped_storage().data_ptr()
    x_saves = [d for d in offload.decisions if d.storage_ptr == x_ptr]
    # x: saved by x * x twice and by sparse.mm: moved once, then two dedup hits
    assert [d.action for d in x_saves] == ["offload", "dedup", "dedup"]
    assert m["act/dedup_hits"] >= 3  # x twice, and h's second view
    assert m["act/kept_not_dense"] >= 1  # the sparse matrix
    moved = [d for d in offload.decisions if d.action == "offload"]
    assert m["act/offloaded_bytes"] == sum(d.nbytes for d in moved)  # each storage counted once
    assert len({d.storage_ptr for d in moved}) == len(moved)
    offload.close()


def test_a_new_storage_at_a_freed_address_is_not_a_dedup_hit(tmp_path: Path) -> None:
    array = np.ones(1024, dtype=np.float32)
    offload = make_offload("host", tmp_path, layers=[nn.Identity()], keep_last_layers=0)
    with offload:
        w1, w2 = torch.ones((), requires_grad=True), torch.ones((), requires_grad=True)
        first = torch.from_numpy(array)
        loss1 = (first * w1).sum()  # saves first (for w1's gradient): moved to the host
        ptr = first.untyped_storage().data_ptr()
        del first  # its storage is gone (only its host copy lives on); the array's memory stays
        offload._lanes.synchronize()  # the copy has read the ones before they change
        array[:] = 2.0
        second = torch.from_numpy(array)  # a different storage at the same address
        assert second.untyped_storage().data_ptr() == ptr
        loss2 = (second * w2).sum()
        (g2,) = torch.autograd.grad(loss2, [w2])
        (g1,) = torch.autograd.grad(loss1, [w1])
    assert float(g1) == 1024.0 and float(g2) == 2048.0  # a false dedup hit would have given g2 = 1024
    assert offload.metrics()["act/dedup_hits"] == 0
    offload.close()


def test_in_place_change_after_save_is_an_error(tmp_path: Path) -> None:
    for min_bytes in (0, 1 << 30):  # moved, and kept
        offload = make_offload("host", tmp_path, layers=[nn.Identity()], keep_last_layers=0,
                               min_tensor_bytes=min_bytes)
        x = torch.randn(256, requires_grad=True)
        with offload:
            y = x * 1
            z = y.sin()  # saves y
            y.mul_(2)
            with pytest.raises(RuntimeError, match="modified in place after it was saved"):
                z.sum().backward()
        offload.close()


def test_prefetch_runs_in_reverse_layer_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[int] = []
    issue = ActivationOffload._issue_restore

    def recording(self: ActivationOffload, entry: Any) -> None:
        order.append(entry.layer)
        issue(self, entry)

    monkeypatch.setattr(ActivationOffload, "_issue_restore", recording)
    offload = make_offload("host", tmp_path, keep_last_layers=1)
    train_plain(offload, checkpointing=False, steps=1)
    assert order and order == sorted(order, reverse=True)
    # layers 0-2 move; a storage first saved in layer 0 and again in layer 3 (the rotary tables) is restored for 3
    assert {0, 1, 2} <= set(order) <= {0, 1, 2, 3}
    assert offload.metrics()["act/late_restores"] == 0
    offload.close()


# ---------------------------------------------------------------------- ordering: nothing read before it landed
#: A gate the test forgot to open fails the test after this long instead of hanging it (no ordering depends on it).
HANG_GUARD_S = 120.0


class _Gate:
    """Holds the calls it wraps until the test opens it: when a copy or an I/O lands is the test's choice, not the
    machine's speed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.opened = threading.Event()
        self.held = 0  # calls that reached the gate

    def wrap(self, call: Any, thread_prefix: str = "") -> Any:
        """``call`` held at the gate when made on a thread named ``thread_prefix...`` (every thread by default)."""

        def gated(*args: Any) -> None:
            if threading.current_thread().name.startswith(thread_prefix):
                self.held += 1
                if not self.opened.wait(HANG_GUARD_S):
                    raise AssertionError(f"{self.name}: the gate was never opened")
            call(*args)

        return gated

    def open(self) -> None:
        self.opened.set()


def _on_arrival(monkeypatch: pytest.MonkeyPatch, then: Any = None) -> list[bool]:
    """Per saved tensor that backward asks for (``ActivationOffload._restored``: the consumer arrives, before it waits
    for the bytes), whether its restore had landed by then; ``then()`` runs at each arrival, before the wait."""
    landed: list[bool] = []
    restored = ActivationOffload._restored

    def arriving(self: ActivationOffload, entry: Any) -> torch.Tensor:
        landed.append(entry.restore is not None and entry.restore.done())
        if then is not None:
            then()
        return restored(self, entry)

    monkeypatch.setattr(ActivationOffload, "_restored", arriving)
    return landed


def _poisoned(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device)  # NaN in every float dtype


def _poison_host_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = pool.HostBufferPool._allocate
    monkeypatch.setattr(pool.HostBufferPool, "_allocate", lambda self, capacity: _fill(fresh(self, capacity)))


@pytest.mark.parametrize("lane", ["act-h2d", "act-d2h"])
def test_restores_wait_for_held_copies(lane: str, tmp_path: Path, reference: dict,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every copy of one lane is held until backward first asks for a saved tensor, so that consumer arrives before
    its bytes have landed (a restore held, or waiting for its held offload); it waits, and every gradient is the
    reference's bit for bit although restored bytes start as NaN."""
    gate = _Gate(lane)
    monkeypatch.setattr(streams, "_copy", gate.wrap(streams._copy, lane))
    monkeypatch.setattr(streams, "_allocate", _poisoned)  # restored bytes start as NaN
    _poison_host_buffers(monkeypatch)  # host buffers too
    landed = _on_arrival(monkeypatch, then=gate.open)
    offload_landed: list[bool] = []  # per restore issued: whether the offloads it follows had landed
    restore = streams.CopyLanes.restore

    def noting_restore(self: streams.CopyLanes, src: torch.Tensor, dst: torch.Tensor, after: Any = ()) -> Any:
        offload_landed.append(all(event.done() for event in after))
        return restore(self, src, dst, after)

    monkeypatch.setattr(streams.CopyLanes, "restore", noting_restore)
    offload = make_offload("host", tmp_path)
    run = train_plain(offload, checkpointing=True)
    assert gate.held  # the gate was on the path
    assert_identical(run, reference[True])
    assert landed and not landed[0]  # the first consumer came before its restore had landed ...
    assert offload.total.restore_wait_s > 0  # ... and waited for it
    if lane == "act-d2h":
        assert not offload_landed[0]  # the first restore was issued before its offload had landed, and waited
    offload.close()


def _fill(buffer: Any) -> Any:
    buffer.data.fill_(0xFF)
    return buffer


@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_reading_before_landing_is_caught(placement: str, tmp_path: Path, reference: dict,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: with the consumer's wait removed and every restore held until the step is
    over, backward reads the poisoned bytes and the gradients are wrong, so bit-identity there is evidence of the
    ordering and not of luck."""
    gate = _Gate("act-h2d")
    monkeypatch.setattr(streams, "_copy", gate.wrap(streams._copy, "act-h2d"))
    monkeypatch.setattr(streams, "_allocate", _poisoned)
    monkeypatch.setattr(streams.CopyLanes, "consume", lambda self, event, tensor: None)
    offload = make_offload(placement, tmp_path)
    try:
        losses, grads = train_plain(offload, checkpointing=True, steps=1)
    finally:
        gate.open()  # the step is over: let the restores land, so the lanes can close
        offload.close()
    assert gate.held  # restores were issued, and none had landed when backward read them
    assert not all(torch.equal(a, b) for a, b in zip(grads[0], reference[True][1][0]))


def test_nvme_reads_and_writes_are_ordered(tmp_path: Path, reference: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """File writes are held until the forward's write throttle waits for one, and reads until backward first asks
    for a saved tensor: both waits happen, each write is waited for before the next starts, and every gradient is
    the reference's bit for bit."""
    calls: list[str] = []
    writes, reads = _Gate("writes"), _Gate("reads")

    def noting(kind: str, call: Any) -> Any:
        def noted(fd: int, data: memoryview) -> None:
            calls.append(kind)
            call(fd, data)

        return noted

    monkeypatch.setattr(store, "_pwrite", writes.wrap(noting("write", store._pwrite)))
    monkeypatch.setattr(store, "_pread", reads.wrap(noting("read", store._pread)))
    monkeypatch.setattr(streams, "_allocate", _poisoned)
    _poison_host_buffers(monkeypatch)
    in_flight_at_write: list[int] = []
    write = store.NVMeStore.write

    def watched_write(self: NVMeStore, *args: Any, **kwargs: Any) -> Any:
        in_flight_at_write.append(self.pending_write_bytes)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(store.NVMeStore, "write", watched_write)
    write_landed: list[bool] = []  # per wait of the throttle: whether the write it waits for had landed
    oldest_write = store.NVMeStore.oldest_write

    def throttling(self: NVMeStore) -> Any:
        future = oldest_write(self)
        if future is not None:
            write_landed.append(future.done())
            writes.open()
        return future

    monkeypatch.setattr(store.NVMeStore, "oldest_write", throttling)
    landed = _on_arrival(monkeypatch, then=reads.open)
    offload = make_offload("nvme", tmp_path, max_inflight_write_bytes=0)  # each write waits for the one before
    run = train_plain(offload, checkpointing=True)
    assert_identical(run, reference[True])
    assert calls.count("write") == calls.count("read") > 0 and writes.held and reads.held
    assert len(in_flight_at_write) == calls.count("write") and not any(in_flight_at_write)
    assert write_landed and not write_landed[0] and offload.total.write_wait_s > 0  # the forward waited for a write
    assert landed and not landed[0] and offload.total.restore_wait_s > 0  # backward waited for a read
    offload.close()


# ---------------------------------------------------------------------- NVMe files
def test_disk_budget_stops_with_a_clear_error(tmp_path: Path) -> None:
    offload = make_offload("nvme", tmp_path, keep_last_layers=0).open()
    offload.store.budget_bytes = 8192
    with pytest.raises(OSError, match="nvme_path: the activation files would leave less than the reserve"):
        train_plain(offload, checkpointing=False, steps=1)
    offload.close()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(placement="disk"), "placement: unknown placement 'disk'"),
        (dict(placement="nvme"), "nvme_path: placement='nvme' needs a directory"),
        (dict(placement="nvme", nvme_path="/does/not/exist"), "nvme_path: '/does/not/exist' does not exist"),
        (dict(placement="nvme", nvme_path=__file__), "is not a directory"),
        (dict(placement="nvme", nvme_path="/proc/self"), "nvme_path: cannot write and read back a file"),
        (dict(placement="host", nvme_path="/tmp"), "nvme_path: set only with placement='nvme'"),
        (dict(min_tensor_bytes=-1), "min_tensor_bytes: -1 is not a byte count"),
        (dict(keep_last_layers=1.5), "keep_last_layers: 1.5 is not a number of layers"),
        (dict(prefetch_layers=0), "prefetch_layers: 0 is not a number of layers"),
    ],
)
def test_bad_options_fail_with_one_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActivationOffload(**kwargs)
    with pytest.raises(ValueError, match=message):
        ActivationOffloadCallback(**kwargs)


def test_too_little_disk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "MIN_FREE_DISK_BYTES", 1 << 62)
    with pytest.raises(ValueError, match="activation_nvme_path: .* GiB free, less than the .* GiB minimum"):
        DeepOptimizerStatesStrategy(activation_offload="nvme", activation_nvme_path=tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(activation_offload="keep"), "activation_offload: unknown placement 'keep'; set one of null, 'host'"),
        (dict(activation_offload="nvme"), "activation_nvme_path: activation_offload='nvme' needs a directory"),
        (dict(activation_offload="nvme", activation_nvme_path="/no/such/dir"), "activation_nvme_path: '/no/such"),
        (dict(activation_offload="nvme", activation_nvme_path="/proc/self"), "activation_nvme_path: cannot write"),
        (dict(activation_nvme_path="/tmp"), "activation_nvme_path: set only with activation_offload='nvme'"),
        (dict(activation_offload="host", activation_min_tensor_bytes="1MB"), "activation_min_tensor_bytes: '1MB'"),
        (dict(activation_offload="host", activation_keep_last_layers=-2), "activation_keep_last_layers: -2"),
    ],
)
def test_strategy_validates_activation_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeepOptimizerStatesStrategy(**kwargs)


def test_every_problem_is_in_the_one_error() -> None:
    with pytest.raises(ValueError) as info:
        DeepOptimizerStatesStrategy(activation_offload="nvme", activation_min_tensor_bytes=-1,
                                    activation_keep_last_layers=None)
    text = str(info.value)
    for key in ("activation_nvme_path:", "activation_min_tensor_bytes:", "activation_keep_last_layers:"):
        assert key in text


def test_no_layers_is_a_clear_error(tmp_path: Path) -> None:
    offload = make_offload("host", tmp_path)
    with pytest.raises(ValueError, match="no layers; pass layers=model"):
        offload.begin_step()
    with pytest.raises(ValueError, match=r"found no repeated blocks .* in Linear, .* set layers .* or layer_types"):
        offload.attach(nn.Linear(2, 2))


# ---------------------------------------------------------------------- Lightning: any strategy
class FileWatcher(pl.Callback):
    """Sees the activation files between forward and backward."""

    def __init__(self) -> None:
        self.files: list[int] = []

    def on_before_backward(self, trainer: pl.Trainer, pl_module: Any, loss: torch.Tensor) -> None:
        callback = next(cb for cb in trainer.callbacks if isinstance(cb, ActivationOffloadCallback))
        callback.offload.store.drain()
        self.files.append(len(callback.offload.store.files()))


@pytest.fixture(scope="module")
def lightning_reference() -> dict[tuple[str, bool], dict[str, Any]]:
    out = {}
    for ckpt in (False, True):
        out[("plain", ckpt)] = fit("auto", ckpt)
        out[("dos", ckpt)] = fit(dos_strategy(), ckpt)
        out[("zero3", ckpt)] = fit(zero3_strategy(), ckpt)
    return out


def zero3_strategy() -> ZeRO3OffloadStrategy:
    strategy = ZeRO3OffloadStrategy(sub_group_size=4000)
    strategy.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return strategy


def _options(placement: str, tmp_path: Path) -> dict[str, Any]:
    return {"placement": placement, "nvme_path": tmp_path if placement == "nvme" else None, "min_tensor_bytes": 0}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_lightning_is_bit_identical(placement: str, checkpointing: bool, tmp_path: Path,
                                   lightning_reference: dict) -> None:
    ref = lightning_reference[("plain", checkpointing)]
    watcher = FileWatcher() if placement == "nvme" else None
    run = fit("auto", checkpointing,
              [ActivationOffloadCallback(**_options(placement, tmp_path)), *([watcher] if watcher else [])])
    assert run["losses"] == ref["losses"] and len(run["losses"]) == 3
    for got, want in zip(run["grads"], ref["grads"]):
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    metrics = offload_callback(run["trainer"]).offload.metrics()
    assert metrics["act/offloaded_bytes"] > 0 and metrics["act/late_restores"] == 0
    if watcher is not None:
        assert all(n > 0 for n in watcher.files) and len(watcher.files) == 3
    assert list(tmp_path.iterdir()) == []  # the end of fit removed the run directory


@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_dos_strategy_is_bit_identical(placement: str, checkpointing: bool, tmp_path: Path,
                                       lightning_reference: dict) -> None:
    ref = lightning_reference[("dos", checkpointing)]
    strategy = dos_strategy(activation_offload=placement, activation_min_tensor_bytes=0,
                            activation_nvme_path=tmp_path if placement == "nvme" else None)
    run = fit(strategy, checkpointing)
    assert run["losses"] == ref["losses"] and len(run["losses"]) == 3
    assert torch.equal(run["masters"], ref["masters"])
    callback = offload_callback(run["trainer"])
    assert callback is strategy.activation_offload_callback
    metrics = callback.offload.metrics()
    assert metrics["act/offloaded_bytes"] > 0 and metrics["act/kept_parameter"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("checkpointing", [False, True], ids=["saved", "checkpointed"])
@pytest.mark.parametrize("placement", ["host", "nvme"])
def test_zero3_offload_is_bit_identical(placement: str, checkpointing: bool, tmp_path: Path,
                                        lightning_reference: dict) -> None:
    ref = lightning_reference[("zero3", checkpointing)]
    run = fit(zero3_strategy(), checkpointing, [ActivationOffloadCallback(**_options(placement, tmp_path))])
    assert run["losses"] == ref["losses"] and len(run["losses"]) == 3
    assert torch.equal(run["masters"], ref["masters"])
    assert offload_callback(run["trainer"]).offload.metrics()["act/offloaded_bytes"] > 0
    assert list(tmp_path.iterdir()) == []


def test_dos_strategy_with_gradient_accumulation_is_bit_identical(tmp_path: Path) -> None:
    ref = fit(dos_strategy(), True, steps=2, accumulate=2)
    run = fit(dos_strategy(activation_offload="nvme", activation_nvme_path=tmp_path, activation_min_tensor_bytes=0),
              True, steps=2, accumulate=2)
    assert run["losses"] == ref["losses"] and len(run["losses"]) == 4  # one per micro-batch
    assert torch.equal(run["masters"], ref["masters"])
    offload = offload_callback(run["trainer"]).offload
    assert offload.steps == 4 and offload.total.offloaded_bytes == offload.total.restored_bytes > 0


def test_strategy_option_and_a_callback_conflict(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationException, match="activation_offload: set on the strategy, and the trainer"):
        fit(dos_strategy(activation_offload="host"), False, [ActivationOffloadCallback("host")], steps=1)


def test_files_are_removed_when_fit_fails(tmp_path: Path) -> None:
    class Boom(pl.Callback):
        def on_before_backward(self, trainer: pl.Trainer, pl_module: Any, loss: torch.Tensor) -> None:
            offload_callback(trainer).offload.store.drain()
            assert list(tmp_path.glob(f"{RUN_DIR_PREFIX}*/*.act"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit("auto", False, [ActivationOffloadCallback(**_options("nvme", tmp_path)), Boom()], steps=1)
    assert list(tmp_path.iterdir()) == []
