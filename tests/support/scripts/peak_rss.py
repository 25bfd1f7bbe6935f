"""Peak host RSS of 3 training steps of a ~34M-parameter MLP LM under one strategy; prints one JSON line.

Usage: python tests/support/scripts/peak_rss.py PLAN   (PLAN "vanilla" for ZeRO-3 offload, else a DOS plan)
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.support
from lightning_dos.optim import adamw  # noqa: E402
from tests.support.parity import VOCAB, make_strategy, token_loader  # noqa: E402

# 32 x 1M-param layers: subgroups of ~1M, ~0.54 GB of fp32 state and grads. DOS's growth was 94% of vanilla's at 96
# layers and at 32 (the share is what the test weighs; three times fewer layers take a quarter of the time)
HIDDEN, LAYERS = 1024, 32


class DeepMLP(pl.LightningModule):
    def configure_model(self) -> None:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = [torch.nn.Embedding(VOCAB, HIDDEN)]
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(HIDDEN, HIDDEN, bias=False), torch.nn.GELU()]
        layers.append(torch.nn.Linear(HIDDEN, VOCAB, bias=False))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).view(-1, VOCAB), y.view(-1))

    def configure_optimizers(self) -> Any:
        return adamw(self.trainer, self.net.parameters(), lr=1e-4)


def main() -> None:
    base = _rss_now()
    plan_arg = sys.argv[1]
    plan = None if plan_arg == "vanilla" else (float(plan_arg) if plan_arg[0].isdigit() else plan_arg)
    kwargs = {"buffers": 1} if plan is not None else {}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=make_strategy(plan, sub_group_size=1_000_000, **kwargs),
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(DeepMLP(), train_dataloaders=token_loader(3))
    opt = trainer.strategy.model.optimizer
    numel = sum(t.numel() for t in opt.fp32_partitioned_groups_flat)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss": peak, "base_rss": base, "growth": peak - base, "numel": numel,
                      "device_standin": _device_standin_bytes(trainer.strategy)}))


def _device_standin_bytes(strategy: Any) -> int:
    """Bytes the device lane held on the host standing in for the device: GPU memory on a GPU host, not host RAM.

    The buffer slots of the update phase and the upload ring, plus the gradients kept "on the device" through
    backward, in their own dtype.
    """
    manager = getattr(strategy, "manager", None)
    if manager is None or not manager.records:
        return 0
    slots = max(r.timings.device_buffer_bytes for r in manager.records)
    per_param = manager.cost.device_grad_bytes_per_param
    kept = sum(per_param * manager.sizes[i] for i in strategy.model.optimizer.device_grad_subgroups)
    return int(slots + kept)


def _rss_now() -> int:
    """Resident set size now (after imports, before any model or state exists)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


if __name__ == "__main__":
    main()
