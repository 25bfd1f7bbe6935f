"""Owns Adam on the device: torch's fused Adam(W) with a subgroup's current hyperparameters, whole or in chunks.

Both the device lane (:mod:`lightning_dos.update.device_lane`) and the resident subgroups
(:mod:`lightning_dos.update.resident`) update with it. :func:`adam_widened` reads a gradient in another dtype (the 16
bits it was kept in on the device) or on the host through a scratch buffer of ``CHUNK`` fp32 elements: each chunk is
widened (exactly) into the scratch, multiplied by the step's unscale/clip factor and updated. Adam is elementwise and
``CHUNK`` a multiple of every vector width, so the chunks give the values of one call over a whole fp32 copy, bit for
bit, with 64 MB of scratch instead of a whole gradient's worth. No DeepSpeed import here.
"""

from __future__ import annotations

import torch

from lightning_dos.update.subgroup import Subgroup

#: Elements per chunk of a widened gradient (64 MB of fp32 scratch on the device).
CHUNK = 16 * 1024 * 1024


def adam(sg: Subgroup, master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
         step: torch.Tensor) -> None:
    """Fused Adam(W) on the device, with the param group's current hyperparameters (``grad`` in fp32)."""
    h = sg.hyper
    kernel = torch._fused_adamw_ if h.adamw else torch._fused_adam_
    kernel(
        [master],
        [grad],
        [exp_avg],
        [exp_avg_sq],
        [],
        [step],
        lr=h.lr,
        beta1=h.beta1,
        beta2=h.beta2,
        weight_decay=h.weight_decay,
        eps=h.eps,
        amsgrad=False,
        maximize=False,
    )


def scratch_for(numel: int, device: torch.device) -> torch.Tensor:
    """A scratch buffer for :func:`adam_widened` over subgroups of up to ``numel`` parameters."""
    return torch.empty(max(1, min(CHUNK, numel)), dtype=torch.float32, device=device)


def adam_widened(sg: Subgroup, master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                 exp_avg_sq: torch.Tensor, step: torch.Tensor, scratch: torch.Tensor, inv: torch.Tensor,
                 unit_scale: bool) -> None:
    """:func:`adam` with ``grad`` read chunk by chunk through ``scratch``: widened to fp32 (or copied from the host),
    multiplied by ``inv`` unless ``unit_scale``. ``grad`` itself is not written."""
    n = master.numel()
    flat = grad.reshape(-1)
    size = scratch.numel()
    for start in range(0, n, size):
        m = min(size, n - start)
        g = scratch[:m]
        g.copy_(flat.narrow(0, start, m), non_blocking=flat.is_pinned())
        if not unit_scale:
            g.mul_(inv)
        adam(sg, master.narrow(0, start, m), g, exp_avg.narrow(0, start, m), exp_avg_sq.narrow(0, start, m), step)
