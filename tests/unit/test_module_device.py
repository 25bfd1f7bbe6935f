"""The module state ZeRO-3 does not place (metrics, buffers) follows the device; ZeRO-3's parameters are not touched.

The CPU tier has no second device, so the tests move to ``meta``: every tensor that must move shows it, and every
one that must stay keeps its CPU storage. The GPU tier (tests/gpu/test_recipes_gpu.py) runs every recipe, with its
validation metric, on CUDA.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torchmetrics import MeanMetric, MetricCollection, SumMetric

from lightning_dos.strategies.module_device import move_module_state

META = torch.device("meta")


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0))
        self.register_buffer("absent", None)
        self.linear = torch.nn.Linear(3, 3)
        self.linear.weight.ds_id = 0  # what DeepSpeed marks a ZeRO-3 parameter with


class _Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()
        self.val_loss = MeanMetric()
        self.collection = MetricCollection({"total": SumMetric()})
        self.register_buffer("steps", torch.zeros(()))


def test_buffers_and_metrics_move_parameters_stay() -> None:
    module = _Module()
    moved = move_module_state(module, META)
    assert sorted(moved) == ["collection.total", "inner.table", "steps", "val_loss"]
    assert module.inner.table.device == META and module.steps.device == META
    assert module.inner.absent is None
    assert module.val_loss.mean_value.device == META and module.val_loss.device == META
    assert module.collection["total"].sum_value.device == META
    # parameters (ZeRO-3 places its own) keep their storage
    assert module.inner.linear.weight.device.type == "cpu" and module.inner.linear.bias.device.type == "cpu"
    # LightningModule.device follows, so code that reads self.device sees the training device
    assert module.device == META


def test_nothing_moves_when_everything_is_in_place() -> None:
    module = _Module()
    assert move_module_state(module, torch.device("cpu")) == []
    assert module.device == torch.device("cpu")

