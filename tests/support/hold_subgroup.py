"""A delayed host lane under ``overlap=True``: a callback that holds one subgroup's CPU Adam on the update worker until
the training loop can go on no further without it, and records which module forwards ran before that subgroup was
written. Shared by ``tests/integration/test_overlap.py`` and ``tests/gpu/test_overlap_gpu.py``."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.update.executor import UpdateExecutor
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.zero.cpu_adam_nogil import HostAdam

#: A held subgroup that nothing releases fails the test after this long instead of hanging it (no ordering depends on
#: it).
HANG_GUARD_S = 120.0


class _BlockingEvent(threading.Event):
    """One of the gates of an update in flight (``InFlightUpdate.issued``/``grad_free``) that calls ``on_block`` when a
    thread is about to wait on it while it is not set, i.e. when that thread can go on no further without the
    subgroup."""

    def __init__(self, on_block: Any) -> None:
        super().__init__()
        self.on_block = on_block

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            self.on_block()
        return super().wait(timeout)


class HoldOneSubgroup(pl.Callback):
    """Runs the host lane with the head's weight subgroup ``k`` last, and holds ``k``'s CPU Adam on the worker until
    the training loop can go on no further without it: a thread waits at one of ``k``'s gates, the loop joins the
    phase, or (a gate missing) the head's forward has run. Whatever ran before that ran before ``k``'s update,
    whatever the machine's speed.

    Per module forward (a pre-hook registered after DeepSpeed's, so it runs after the gate) it records whether the
    module holds ``k`` and whether ``k``'s write had been issued when the module's compute began.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold: bool = True) -> None:
        self.released = threading.Event()  # the loop needs k now: the worker may run k's CPU Adam
        self.k_done = threading.Event()  # k's CPU Adam of the phase in flight has run
        self.forwards: list[tuple[str, bool, bool]] = []  # (module, holds k, k written), while a phase is in flight
        self.pending_after_step: list[bool] = []
        self.timed_out = False
        self.k = -1
        self.target: Any = None
        if hold:
            self._patch(monkeypatch)

    def _patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        host_step, init, join, issue = HostAdam.step, InFlightUpdate.__init__, InFlightUpdate.join, UpdateExecutor.issue

        def held_step(adam: HostAdam, state: dict, master: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if master is self.target:
                self.timed_out |= not self._until_released()
            host_step(adam, state, master, *args, **kwargs)
            if master is self.target:
                self.k_done.set()

        def watched_init(phase: InFlightUpdate, *args: Any, **kwargs: Any) -> None:
            init(phase, *args, **kwargs)
            if self.k >= 0:  # before the worker starts: nothing has set them yet
                phase.issued[self.k] = _BlockingEvent(self.released.set)
                phase.grad_free[self.k] = _BlockingEvent(self._grad_wait)

        def releasing_join(phase: InFlightUpdate) -> Any:
            self.released.set()
            return join(phase)

        def fresh_issue(executor: UpdateExecutor, *args: Any, **kwargs: Any) -> InFlightUpdate:
            self.released.clear()  # what set it belonged to the phase before
            self.k_done.clear()
            return issue(executor, *args, **kwargs)

        monkeypatch.setattr(HostAdam, "step", held_step)
        monkeypatch.setattr(InFlightUpdate, "__init__", watched_init)
        monkeypatch.setattr(InFlightUpdate, "join", releasing_join)
        monkeypatch.setattr(UpdateExecutor, "issue", fresh_issue)

    def _until_released(self) -> bool:
        """On the worker, before k's CPU Adam: wait until the loop needs k (False: nothing released it)."""
        return self.released.wait(HANG_GUARD_S)

    def _grad_wait(self) -> None:
        """A thread is about to wait for k's host gradient to be free: it needs k's CPU Adam."""
        self.released.set()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        opt = trainer.strategy.model.optimizer
        owner = {p.ds_id: i for i, group in enumerate(opt.fp16_groups) for p in group}
        self.k = owner[pl_module.net[-1].weight.ds_id]
        self.target = opt.fp32_partitioned_groups_flat[self.k]
        manager = trainer.strategy.manager
        others = [i for i in range(len(manager.sizes)) if i != self.k]
        manager.set_plan(Plan(lanes=(Lane.HOST,) * len(manager.sizes), buffers=2, source="test",
                              host_order=(*others, self.k)))
        for name, module in pl_module.net.named_children():
            holds = any(owner.get(p.ds_id) == self.k for p in module.parameters(recurse=False))
            module.register_forward_pre_hook(partial(self._forward, trainer, name, holds))
            if holds:
                module.register_forward_hook(partial(self._forward_done, trainer))

    def _forward(self, trainer: pl.Trainer, name: str, holds: bool, module: Any, args: Any) -> None:
        phase = trainer.strategy.model.optimizer.in_flight
        if phase is not None:
            self.forwards.append((name, holds, phase.issued[self.k].is_set()))

    def _forward_done(self, trainer: pl.Trainer, module: Any, args: Any, output: Any) -> None:
        # released only once the head's compute has run: without a gate it read k as it was, never a write racing it
        if trainer.strategy.model.optimizer.in_flight is not None:
            self.released.set()  # k's update may run now

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        phase = trainer.strategy.model.optimizer.in_flight
        self.pending_after_step.append(phase is not None and not phase.issued[self.k].is_set())
