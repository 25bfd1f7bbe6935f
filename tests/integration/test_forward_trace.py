"""ZeRO-3's module trace completes under Lightning when ``training_step`` calls ``self(x)``
(``lightning_dos.zero.forward_trace``), and training is unchanged.

Lightning calls the engine, which calls the LightningModule; a ``training_step`` that calls ``self(x)`` calls it a
second time, and DeepSpeed's start-of-forward hook reset ZeRO-3's step counter at both calls: its trace never
completed, so every persistent parameter was released after each module and gathered again before the next use.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from lightning_dos.zero.forward_trace import reset_once_per_forward, trace_complete
from tests.support.parity import VOCAB, TinyLM, assert_tracks, make_strategy, train

FP32_TOL = 1e-5


class SelfCallLM(TinyLM):
    """A LightningModule the usual way: ``training_step`` and ``validation_step`` call ``self(x)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x).float().view(-1, VOCAB), y.view(-1))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x).float().view(-1, VOCAB), y.view(-1)))


class TraceProbe(pl.Callback):
    """Per training iteration: whether ZeRO-3's trace is complete once it ends, and whether every parameter was
    still whole (not released) when the backward began."""

    def __init__(self) -> None:
        self.complete: list[bool | None] = []
        self.whole_at_backward: list[bool] = []

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self.whole_at_backward.append(all(p.ds_status == ZeroParamStatus.AVAILABLE for p in pl_module.parameters()))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.complete.append(trace_complete(trainer.strategy.model.optimizer))


def test_the_trace_completes_and_persistent_parameters_stay_whole() -> None:
    probe = TraceProbe()
    run = train(0.5, steps=5, model=SelfCallLM(), every_step=probe)
    assert run.strategy.persistence_threshold is not None  # one rank: every parameter persists
    # the first forward records the trace, the second completes it, and from then on it holds
    assert probe.complete == [False, True, True, True, True]
    # while recording, ZeRO-3 releases every parameter after its module; with the trace complete it releases none
    assert probe.whole_at_backward == [False, True, True, True, True]


def test_stock_deepspeed_hooks_never_complete_the_trace() -> None:
    """The control: Lightning's own DeepSpeed strategy (vanilla ZeRO-3 offload) with the same module."""
    probe = TraceProbe()
    train(None, steps=4, model=SelfCallLM(), every_step=probe)
    assert probe.complete == [False] * 4


def test_training_is_unchanged_with_validation_every_step() -> None:
    vanilla = train(None, steps=5, model=SelfCallLM(), val_batches=2)
    probe = TraceProbe()
    dos = train(0.5, steps=5, model=SelfCallLM(), val_batches=2, every_step=probe)
    # validation (a forward without backward) invalidates the trace; training records it again and completes it
    assert any(probe.complete)
    assert_tracks(dos, vanilla, FP32_TOL)


class _Coordinator:
    def __init__(self) -> None:
        self.resets = 0

    def reset_step(self) -> None:
        self.resets += 1


class _Offload:
    """What ``reset_once_per_forward`` uses of DeepSpeed's parameter offload: its module, its start-of-forward hook
    and its coordinator."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.coordinator = _Coordinator()
        self.fwd_pre_hook = module.register_forward_pre_hook(lambda *_: self.coordinator.reset_step())

    def get_param_coordinator(self) -> _Coordinator:
        return self.coordinator


class _Optimizer:
    def __init__(self, module: torch.nn.Module) -> None:
        self.parameter_offload = _Offload(module)


class Nested(torch.nn.Module):
    """Calls itself once more from inside its forward (as Lightning's redirected forward does)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.fail = False

    def forward(self, x: torch.Tensor, inner: bool = False) -> torch.Tensor:
        if inner:
            if self.fail:
                raise RuntimeError("inner forward failed")
            return self.linear(x)
        return self(x, inner=True)


def test_one_reset_per_outermost_call_even_after_a_forward_raised() -> None:
    module = Nested()
    optimizer = _Optimizer(module)
    coordinator = optimizer.parameter_offload.coordinator
    module(torch.zeros(1, 2))
    assert coordinator.resets == 2  # DeepSpeed's hook: once per call
    assert reset_once_per_forward(optimizer)
    assert not reset_once_per_forward(optimizer)  # once only
    module(torch.zeros(1, 2))
    module(torch.zeros(1, 2))
    assert coordinator.resets == 4
    module.fail = True
    try:
        module(torch.zeros(1, 2))
    except RuntimeError:
        pass
    assert coordinator.resets == 5
    module.fail = False
    module(torch.zeros(1, 2))  # the failed forward left no depth behind: this one resets
    assert coordinator.resets == 6


def test_no_zero3_optimizer_nothing_to_replace() -> None:
    assert not reset_once_per_forward(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    assert trace_complete(object()) is None


def test_torch_linear_where_every_parameter_persists() -> None:
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    train(None, steps=1, model=SelfCallLM())  # stock ZeRO-3 replaces torch's linear, process-wide
    assert torch.nn.functional.linear is zero3_linear_wrap
    run = train(0.5, steps=1, model=SelfCallLM())
    assert run.strategy.config["zero_optimization"]["memory_efficient_linear"] is False
    assert torch.nn.functional.linear is not zero3_linear_wrap
    # without persistence the wrapper is what lets ZeRO-3 release weights between forward and backward: kept
    run = train(0.5, steps=1, model=SelfCallLM(), strategy=make_strategy(0.5, param_persistence=False))
    assert "memory_efficient_linear" not in run.strategy.config["zero_optimization"]
    assert torch.nn.functional.linear is zero3_linear_wrap
    # a setting in the user's config wins
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 2000,
                                    "memory_efficient_linear": True}}
    run = train(0.5, steps=1, model=SelfCallLM(), strategy=make_strategy(0.5, config=config))
    assert run.strategy.config["zero_optimization"]["memory_efficient_linear"] is True
    assert torch.nn.functional.linear is zero3_linear_wrap
