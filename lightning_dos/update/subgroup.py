"""Owns the plain view of one optimizer-state subgroup that the executor works on.

The DeepSpeed seam (``lightning_dos.zero``) builds these from ZeRO-3's private lists; nothing below the
seam knows DeepSpeed. Every tensor here is *the* tensor DeepSpeed owns (no copies): the executor reads
and writes them in place, so DeepSpeed's own checkpoint code sees every update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class AdamHyper:
    """The current hyperparameters of a subgroup's param group, read at every step (schedulers change them)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    adamw: bool  # decoupled weight decay (AdamW) rather than L2 added to the gradient


@dataclass
class Subgroup:
    """One subgroup of this rank's ZeRO-3 partition: its optimizer state, where it lives, and its 16-bit params."""

    index: int
    numel: int
    master: torch.Tensor  # fp32 master weights in the subgroup's home: the device (resident) or the host (pinned)
    exp_avg: torch.Tensor  # fp32 first moment, beside the master, the tensor in the optimizer's state dict
    exp_avg_sq: torch.Tensor  # fp32 second moment, likewise
    state: dict[str, Any]  # the optimizer's state dict entry; holds the integer 'step'
    # gradient: fp32 pinned host buffer, or on the device in its own dtype (grad_on_device); None in the device
    # lane's own list once its last read is issued (the executor lets it go early, ``DeviceLane.let_go``)
    grad: torch.Tensor | None
    param16: torch.Tensor  # flat partition of the model's params on the device, in their own dtype
    hyper: AdamHyper
    grad_on_device: bool = False  # the gradient stayed on the device through backward (no PCIe for it)
