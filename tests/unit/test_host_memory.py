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


def test_unpinning_one_tensor_leaves_the_others_locked(cudart: FakeCudart) -> None:
    registry = PinnedRegistry()
    a, b = torch.zeros(10), torch.zeros(20)
    registry.pin(a)
    registry.pin(b)
    registry.unpin(a)
    assert not registry.holds(a) and registry.holds(b) and registry.nbytes == 80
    registry.unpin(torch.zeros(3))  # not ours: nothing happens
    assert list(cudart.registered.values()) == [80]
    registry.release()


def _homes_of(sizes: list[int], registry: PinnedRegistry, accumulation: int = 1) -> object:
    """The homes mixin over DeepSpeed-like lists for ``sizes`` (16-bit partitions here in bf16 on the host)."""
    from lightning_dos.zero.homes import StateHomes

    class Optimizer(StateHomes):
        def _pinned_registry(self) -> PinnedRegistry:
            return registry

    opt = Optimizer()
    g = torch.Generator().manual_seed(0)
    opt.fp16_partitioned_groups_flat = [torch.randn(n, generator=g).to(torch.bfloat16) for n in sizes]
    opt.fp16_partitioned_groups_flat_numel = list(sizes)
    opt.fp16_partitioned_groups_flat_id = [[10 * i, 10 * i + 1] for i in range(len(sizes))]
    opt.fp32_partitioned_groups_flat = []
    opt.master_weights_and_grads_dtype = torch.float32
    opt.gradient_accumulation_dtype = torch.bfloat16  # the backward's gradients, in the partitions' dtype
    opt.gradient_accumulation_steps = accumulation
    opt.optimizer = type("CPUAdam", (), {"state": {}, "param_groups": [{"params": ["x"]}]})()
    opt._create_placeholders()
    return opt


def test_homes_are_made_once_placed_each_tensor_locked_once_at_its_exact_size(cudart: FakeCudart) -> None:
    """Nothing before placement; then each host subgroup's master (its 16-bit partition widened), zero moments and
    gradient (in the backward's 16-bit dtype: 14 bytes a parameter in all), locked once each; a device subgroup (the
    host stands in here) has no gradient and nothing locked; placing again changes nothing; moving a subgroup carries
    its values and unlocks what it leaves."""
    from lightning_dos.planning.placement import Home

    registry = PinnedRegistry()
    opt = _homes_of([100, 60], registry)
    assert [m.numel() for m in opt.fp32_partitioned_groups_flat] == [0, 0] and not opt.placed
    assert opt.optimizer.param_groups[0]["params"] == []  # the partitions join their groups only around a step
    opt.place([Home.DEVICE, None])
    assert opt.homes() == (Home.DEVICE, None) and not cudart.registered
    opt.place([Home.DEVICE, Home.HOST])
    assert opt.placed
    device, host = opt.fp32_partitioned_groups_flat
    assert torch.equal(device, opt.fp16_partitioned_groups_flat[0].float()) and device.grad is None
    assert torch.equal(host, opt.fp16_partitioned_groups_flat[1].float())
    state = opt.optimizer.state[host]
    grad = opt.update_grad(1)
    assert state["step"] == 0 and torch.equal(state["exp_avg"], torch.zeros(60)) and host.grad is None
    assert grad.dtype == torch.bfloat16 and torch.equal(grad, torch.zeros(60, dtype=torch.bfloat16))
    assert sorted(cudart.registered.values()) == [120] + [240] * 3 and registry.nbytes == 14 * 60  # grad, master, m, v
    assert opt.home_bytes() == {Home.DEVICE: 12 * 100, Home.HOST: 14 * 60}
    assert opt.update_grad(0) is None  # a device home reads the gradient the backward keeps there
    opt.place([Home.DEVICE, Home.HOST])
    assert len(cudart.registered) == 4  # nothing re-made
    state["exp_avg"].fill_(0.5)
    host.data.add_(1.0)  # as an update would write it (DeepSpeed's partitions require grad)
    values = host.detach().clone()
    opt.place([Home.DEVICE, Home.DEVICE])  # under no pressure now: the host subgroup moves to the device
    assert opt.fp32_partitioned_groups_flat[1] is host and torch.equal(host, values)  # the same key, its values
    assert torch.equal(opt.optimizer.state[host]["exp_avg"], torch.full((60,), 0.5)) and host.grad is None
    assert opt.update_grad(1) is None  # the 16-bit host gradient went with the host home
    assert not cudart.registered and registry.nbytes == 0  # everything it left on the host unlocked
    registry.release()


def test_a_checkpoint_loaded_before_placement_is_what_placement_copies_in(cudart: FakeCudart) -> None:
    from lightning_dos.planning.placement import Home

    registry = PinnedRegistry()
    opt = _homes_of([50], registry, accumulation=2)
    loaded = torch.arange(50, dtype=torch.float32)
    opt._adopt_loaded_masters([loaded])
    master = opt.fp32_partitioned_groups_flat[0]
    assert master.data_ptr() == loaded.data_ptr()  # the loaded tensor itself: no copy before placement
    opt.optimizer.state[master] = {"step": 7, "exp_avg": torch.full((50,), 2.0), "exp_avg_sq": torch.ones(50)}
    opt.place([Home.HOST])
    assert master.data_ptr() != loaded.data_ptr() and torch.equal(master, loaded) and registry.holds(master)
    state = opt.optimizer.state[master]
    assert state["step"] == 7 and torch.equal(state["exp_avg"], torch.full((50,), 2.0))
    assert registry.holds(state["exp_avg"]) and registry.holds(state["exp_avg_sq"])
    # gradients accumulate here: DeepSpeed's boundary copy writes the master's fp32 .grad, which the update reads
    assert master.grad.dtype == torch.float32 and opt.update_grad(0) is master.grad and registry.holds(master.grad)
    registry.release()


def test_a_host_gradient_made_before_placement_is_the_one_placement_keeps(cudart: FakeCudart) -> None:
    """Before placement a subgroup that will live on the host gets only its gradient (16-bit, zeros, locked): it is
    what the host holds; placement keeps that tensor, with what the backward wrote in it, and adds the master and
    moments; nothing is made under gradient accumulation; such a subgroup cannot go to the device."""
    from lightning_dos.planning.placement import Home

    registry = PinnedRegistry()
    opt = _homes_of([100, 60], registry)
    opt.make_host_gradients([1])
    early = opt.update_grad(1)
    assert early.dtype == torch.bfloat16 and torch.equal(early, torch.zeros(60, dtype=torch.bfloat16))
    assert opt.homes() == (None, None) and opt.fp32_partitioned_groups_flat[1].numel() == 0
    assert opt.home_bytes() == {Home.DEVICE: 0, Home.HOST: 2 * 60} and registry.nbytes == 2 * 60
    early.fill_(3.0)  # as the first backward writes it
    opt.place([Home.DEVICE, Home.HOST])
    assert opt.update_grad(1) is early and torch.equal(early, torch.full((60,), 3.0, dtype=torch.bfloat16))
    assert opt.home_bytes() == {Home.DEVICE: 12 * 100, Home.HOST: 14 * 60} and registry.nbytes == 14 * 60
    assert len(cudart.registered) == 4  # the gradient locked once, then master and both moments
    registry.release()

    accumulating = _homes_of([50], PinnedRegistry(), accumulation=2)
    accumulating.make_host_gradients([0])
    assert accumulating.update_grad(0) is None and accumulating.home_bytes()[Home.HOST] == 0

    wrong = _homes_of([50], PinnedRegistry())
    wrong.make_host_gradients([0])
    with pytest.raises(RuntimeError, match="subgroup 0: its gradient was made on the host before placement"):
        wrong.place([Home.DEVICE])
    assert wrong.homes() == (None,) and wrong.update_grad(0) is not None  # refused before anything changed
