"""Page-locking in place: exact bytes registered, each storage once, everything unregistered on release.

A CPU-only machine has no CUDA runtime, so a recording stand-in takes its place; the GPU tier exercises the
real one (tests/gpu).
"""

from __future__ import annotations

import gc

import pytest
import torch

import lightning_dos.update.host_memory as host_memory
from lightning_dos.update.host_memory import PinnedRegistry


class FakeCudart:
    def __init__(self, fail: bool = False) -> None:
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.fail = fail

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:  # noqa: N802
        if self.fail:
            return 2  # cudaErrorMemoryAllocation
        assert address not in self.registered, "registered twice"
        self.registered[address] = nbytes
        return 0

    def cudaHostUnregister(self, address: int) -> int:  # noqa: N802
        assert address in self.registered, "unregistering memory that was never registered"
        del self.registered[address]
        self.unregistered.append(address)
        return 0


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    fake = FakeCudart()
    monkeypatch.setattr(host_memory, "_cudart", lambda: fake)
    return fake


def test_registers_exact_bytes_once_and_releases(cudart: FakeCudart) -> None:
    registry = PinnedRegistry()
    a = torch.zeros(1000)
    b = torch.zeros(333, dtype=torch.float32)
    assert registry.pin(a) is a
    registry.pin(b)
    registry.pin(a)  # already registered: nothing happens
    registry.pin(a[10:20])  # a view of a registered storage: nothing happens
    assert cudart.registered == {a.data_ptr(): 4000, b.data_ptr(): 1332}  # no rounding up
    assert len(registry) == 2 and registry.nbytes == 5332
    registry.release()
    assert cudart.registered == {} and sorted(cudart.unregistered) == sorted([a.data_ptr(), b.data_ptr()])
    registry.release()  # idempotent
    assert len(cudart.unregistered) == 2


def test_memory_stays_alive_while_registered_and_is_released_on_collection(cudart: FakeCudart) -> None:
    registry = PinnedRegistry()
    address = registry.pin(torch.ones(64)).data_ptr()  # the caller drops its only reference at once
    gc.collect()
    held = next(iter(registry._tensors.values()))
    assert held.data_ptr() == address and torch.equal(held, torch.ones(64))  # the registry keeps it alive
    del held, registry
    gc.collect()
    assert cudart.unregistered == [address]


def test_failure_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "_cudart", lambda: FakeCudart(fail=True))
    with pytest.raises(RuntimeError, match="pin_memory=False"):
        PinnedRegistry().pin(torch.zeros(8))


def test_only_host_tensors(cudart: FakeCudart) -> None:
    with pytest.raises(ValueError, match="host tensors"):
        PinnedRegistry().pin(torch.zeros(2, device="meta"))


def test_state_homes_are_made_at_the_first_update_and_locked_once(cudart: FakeCudart) -> None:
    """The moments are created when the first update phase needs them (as vanilla's CPU Adam does), page-locked
    once each; moments that exist but are not locked (a checkpoint loaded before the first step) are copied into
    fresh locked homes with their values; the next call changes nothing."""
    from types import SimpleNamespace

    from lightning_dos.zero.optimizer import InterleavedZeroOptimizer

    registry = PinnedRegistry()
    masters = [torch.randn(100), torch.randn(60)]
    for master in masters:
        registry.pin(master)  # done with the master weights at start-up
    loaded = {"step": 7, "exp_avg": torch.full((60,), 0.5), "exp_avg_sq": torch.full((60,), 0.25)}
    state = {masters[1]: dict(loaded)}
    fake = SimpleNamespace(fp32_partitioned_groups_flat=masters, optimizer=SimpleNamespace(state=state),
                           _pinned_registry=lambda: registry)

    InterleavedZeroOptimizer._ensure_state_homes(fake)
    first, second = state[masters[0]], state[masters[1]]
    assert first["step"] == 0 and torch.equal(first["exp_avg"], torch.zeros(100))
    assert second["step"] == 7 and torch.equal(second["exp_avg_sq"], loaded["exp_avg_sq"])
    assert second["exp_avg"] is not loaded["exp_avg"]  # copied into a home of its own
    for s in (first, second):
        assert registry.holds(s["exp_avg"]) and registry.holds(s["exp_avg_sq"])
    assert len(cudart.registered) == 6 and registry.nbytes == 12 * 160  # master, m, v: 12 bytes/param, once

    homes = [(s["exp_avg"], s["exp_avg_sq"]) for s in (first, second)]
    InterleavedZeroOptimizer._ensure_state_homes(fake)
    for s, (exp_avg, exp_avg_sq) in zip((first, second), homes):  # the same tensors: nothing re-made
        assert s["exp_avg"] is exp_avg and s["exp_avg_sq"] is exp_avg_sq
    assert len(cudart.registered) == 6
    registry.release()
