"""A finished fit leaves nothing of its DeepSpeed engine behind once the user drops the trainer and the module.

DeepSpeed 0.19.8 keeps every engine alive for the life of the process (a module-level stack, a class-level memo and
a hook cycle through autograd's C++ nodes; lightning_dos/zero/engine_release.py). Each engine holds a reduce bucket
of ``reduce_bucket_size`` elements (800 MB here) and, on a GPU host, pinned host buffers: a notebook or a sweep that
fits several times would run out of host memory.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from deepspeed.runtime.zero import parameter_offload
from torch.utils.checkpoint import checkpoint

from tests.support.parity import TinyLM, train


class CheckpointedTinyLM(TinyLM):
    """TinyLM with its hidden layers under activation checkpointing (the recomputation pushes submodules on
    DeepSpeed's forward-module stack and leaves them there)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.net[0](x)
        h = checkpoint(lambda t: self.net[3](self.net[2](self.net[1](t))), h, use_reentrant=False)
        logits = self.net[5](self.net[4](h))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


def _fit_and_drop(plan: Any, **kw: Any) -> tuple[weakref.ref, weakref.ref]:
    run = train(plan, steps=2, **kw)
    engine = run.strategy.model
    refs = weakref.ref(engine), weakref.ref(engine.optimizer)
    del run, engine
    return refs


@pytest.mark.parametrize("plan", [0.5, None], ids=["dos", "vanilla"])
def test_engine_is_freed_after_fit(plan: Any, tmp_path: Path) -> None:
    stack_before = len(parameter_offload.FWD_MODULE_STACK)
    refs = [_fit_and_drop(plan), _fit_and_drop(plan, save_to=str(tmp_path / "after_fit.ckpt")),
            _fit_and_drop(plan, model=CheckpointedTinyLM())]
    gc.collect()
    assert [(engine(), optimizer()) for engine, optimizer in refs] == [(None, None)] * 3
    assert len(parameter_offload.FWD_MODULE_STACK) == stack_before
    assert (tmp_path / "after_fit.ckpt" / "checkpoint").is_dir()  # saving after fit still works


@pytest.mark.parametrize("plan", [0.5, None], ids=["dos", "vanilla"])
def test_teardown_leaves_the_optimizer_state_where_it_lives(plan: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's teardown would move every optimizer's state to the CPU: for state resident on a GPU that is host
    memory it was never given, at the end of the run, only to be freed with the engine. No optimizer reaches it."""
    from lightning.pytorch.strategies import strategy as lightning_strategy

    moved: list[list[Any]] = []
    move = lightning_strategy._optimizers_to_device
    monkeypatch.setattr(lightning_strategy, "_optimizers_to_device",
                        lambda optimizers, device: (moved.append(list(optimizers)), move(optimizers, device))[1])
    run = train(plan, steps=2)
    assert moved == [[]]
    assert run.strategy.optimizers  # and the strategy still has them afterwards


@pytest.mark.parametrize("plan", [0.5, None], ids=["dos", "vanilla"])
def test_teardown_leaves_the_module_where_it_lives(plan: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's teardown would move the module to the CPU: DOS's 16-bit parameters, whole on the device, would be
    copied to the host while the optimizer state still holds it. The module is not moved; its own ``cpu`` is back."""
    moved: list[torch.nn.Module] = []
    move = torch.nn.Module.cpu
    monkeypatch.setattr(torch.nn.Module, "cpu", lambda self: (moved.append(self), move(self))[1])
    module = TinyLM()
    run = train(plan, steps=2, model=module)
    assert module not in moved and run.strategy.lightning_module is module
    assert "cpu" not in vars(module)
    module.cpu()  # a user's own call still moves it
    assert moved == [module]
