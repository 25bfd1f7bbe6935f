"""Owns moving a ZeRO-3 module's state that DeepSpeed does not manage onto the training device.

Lightning's ``DeepSpeedStrategy`` never calls ``module.to(device)``, and DeepSpeed skips it for a ZeRO-3 model,
because ``zero.Init`` places the partitioned parameters itself. Everything else registered on the module stays
where it was made: buffers created outside ``zero.Init`` and torchmetrics states (a ``MeanMetric`` built in
``__init__``). The first metric update with a CUDA loss then fails
("Encountered different devices in metric calculation"). :func:`move_module_state` moves all of it and sets
Lightning's ``module.device`` to match. Parameters are left alone: by the time it runs, DeepSpeed has made every
parameter of the module a ZeRO-3 parameter (``_convert_to_zero_parameters``), trainable or frozen, and placed it.
"""

from __future__ import annotations

import torch
from lightning.fabric.utilities.device_dtype_mixin import _update_properties
from torchmetrics import Metric

__all__ = ["move_module_state"]


def move_module_state(root: torch.nn.Module, device: torch.device) -> list[str]:
    """Move every buffer and metric state under ``root`` to ``device``, in place; parameters stay where they are.

    Returns the qualified names of what moved (for logs and tests). A metric moves through its own ``to``, which
    also moves its registered states and defaults, and its children with it.
    """
    device = torch.device(device)
    moved: list[str] = []
    _move(root, "", device, moved)
    _update_properties(root, device=device)  # LightningModule.device (and every nested Lightning module's)
    return moved


def _move(module: torch.nn.Module, prefix: str, device: torch.device, moved: list[str]) -> None:
    if isinstance(module, Metric):
        if torch.device(module.device) != device:
            module.to(device)
            moved.append(prefix.rstrip("."))
        return
    for name, buffer in module._buffers.items():
        if buffer is not None and buffer.device != device:
            module._buffers[name] = buffer.to(device)
            moved.append(f"{prefix}{name}")
    for name, child in module._modules.items():
        if child is not None:
            _move(child, f"{prefix}{name}.", device, moved)
