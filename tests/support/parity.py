"""Shared harness for parity tests: train one tiny LM under a strategy and return losses and fp32 masters."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning_dos  # noqa: F401  (registers the strategy)
from lightning_dos import DeepOptimizerStatesStrategy, ZeRO3OffloadStrategy
from lightning_dos.optim import adamw, weight_decay_groups
from lightning_dos.planning.plan import random_plan

VOCAB = 97
SEQ = 16


class TinyLM(pl.LightningModule):
    """Embedding -> 3 linear layers -> head: several params of different sizes, so several subgroups."""

    def __init__(self, hidden: int = 48, lr: float = 1e-2, schedule: bool = True) -> None:
        super().__init__()
        self.hidden, self.lr, self.schedule = hidden, lr, schedule
        self.net: torch.nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(0)
        h = self.hidden
        self.net = torch.nn.Sequential(
            torch.nn.Embedding(VOCAB, h),
            torch.nn.Linear(h, 2 * h),
            torch.nn.GELU(),
            torch.nn.Linear(2 * h, h),
            torch.nn.LayerNorm(h),
            torch.nn.Linear(h, VOCAB),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        return loss

    def configure_optimizers(self) -> Any:
        groups = weight_decay_groups(self.net.parameters(), 0.1)
        opt = adamw(self.trainer, groups, lr=self.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        if not self.schedule:
            return opt
        # the lr changes at every step: GPU-lane subgroups must follow it
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + 0.3 * step))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def token_loader(n_batches: int, batch_size: int = 4, seed: int = 1234, vocab: int = VOCAB,
                 seq: int = SEQ) -> DataLoader:
    """``n_batches`` batches of random tokens (inputs and the next tokens), the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (n_batches * batch_size, seq + 1), generator=g)
    return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=batch_size, shuffle=False)


class LossRecorder(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.lrs: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses.append(float(outputs["loss"]))
        self.lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))


@dataclass
class RunResult:
    losses: list[float]
    masters: torch.Tensor
    lrs: list[float]
    strategy: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def masters_of(strategy: Any) -> torch.Tensor:
    opt = strategy.model.optimizer
    return torch.cat([t.detach().float().cpu().clone() for t in opt.fp32_partitioned_groups_flat])


def make_strategy(plan: Any | None, sub_group_size: int = 2000, **kwargs: Any) -> Any:
    if plan is None:  # vanilla ZeRO-3 optimizer offload, the control run
        return ZeRO3OffloadStrategy(sub_group_size=sub_group_size, **kwargs)
    kwargs.setdefault("overlap", False)  # serial unless a test asks (the default turns it on with CUDA devices)
    kwargs.setdefault("resident_gib", 0)  # the lanes as planned unless a test asks (the default keeps what fits)
    return DeepOptimizerStatesStrategy(plan=plan, sub_group_size=sub_group_size, **kwargs)


def train(
    plan: Any | None,
    steps: int = 6,
    precision: str = "32-true",
    accumulate: int = 1,
    clip: float | None = 1.0,
    root: str | None = None,
    ckpt_path: str | None = None,
    model: TinyLM | None = None,
    strategy: Any = None,
    every_step: Any = None,
    epoch_batches: int | None = None,
    save_to: str | None = None,
    accelerator: str = "cpu",
    val_batches: int = 0,
) -> RunResult:
    rec = LossRecorder()
    callbacks: list[pl.Callback] = [rec]
    if every_step is not None:  # one callback or several
        callbacks.extend(every_step if isinstance(every_step, (list, tuple)) else [every_step])
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=strategy or make_strategy(plan),
        precision=precision,
        # whole epochs when epochs are short, so a checkpoint lands on an epoch boundary
        max_steps=-1 if epoch_batches else steps,
        max_epochs=steps * accumulate // epoch_batches if epoch_batches else None,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=callbacks,
        # with val_batches: validation after every training batch (the model needs a validation_step)
        **({"val_check_interval": 1, "num_sanity_val_steps": 0} if val_batches else {}),
    )
    module = model or TinyLM()
    loader = token_loader(epoch_batches or steps * accumulate)
    val_loader = token_loader(val_batches, seed=99) if val_batches else None
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val_loader, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return RunResult(rec.losses, masters_of(trainer.strategy), rec.lrs, trainer.strategy, {"trainer": trainer})


_SHARED: dict[tuple, RunResult] = {}


def shared_run(plan: Any | None, steps: int = 6, accumulate: int = 1, clip: float | None = 0.05) -> RunResult:
    """``train(plan, ...)`` under the default strategy, run once per test session for each setting: the vanilla
    controls and the serial DOS runs that several modules compare with (the same seed, data and steps every time, so
    one run serves them all; plan auto's choices depend on timings, so only one test may read its run). Keeps the
    losses, fp32 masters, learning rates and, under DOS, the manager's ``records`` and subgroup ``sizes`` in
    ``extra``; not the engine."""
    key = (tuple(plan) if isinstance(plan, list) else plan, steps, accumulate, clip)
    if key not in _SHARED:
        run = train(plan, steps=steps, accumulate=accumulate, clip=clip)
        manager = getattr(run.strategy, "manager", None)
        extra = {} if manager is None else {"records": list(manager.records), "sizes": list(manager.sizes)}
        _SHARED[key] = RunResult(run.losses, run.masters, run.lrs, None, extra)
    return _SHARED[key]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def assert_tracks(run: RunResult, ref: RunResult, tol: float) -> None:
    """``run`` trained as the control ``ref``: as many losses (at least one), each within ``tol`` of the control's
    (relative), and fp32 masters within ``tol`` (relative norm)."""
    assert len(run.losses) == len(ref.losses) and run.losses
    for step, (a, b) in enumerate(zip(run.losses, ref.losses)):
        assert abs(a - b) <= tol * abs(b), f"step {step}: loss {a} vs control {b}"
    assert rel(run.masters, ref.masters) <= tol



#: What an in-process fit writes into ``os.environ`` for its process group, which a child must not inherit: the group
#: keeps listening on MASTER_PORT until the process ends.
RANK_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                  "LOCAL_WORLD_SIZE", "CROSS_RANK", "CROSS_SIZE")


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child run: this test's, without the rank variables an in-process fit of the same test
    left behind (conftest resets the environment only between tests), plus ``extra``."""
    import os

    return {**{k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}, **extra}


class RandomPlanEveryStep(pl.Callback):
    """Sets a fresh random plan (lanes, buffering, host order: ``random_plan``) before every step; ``seen`` holds the
    lanes of each, in order."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.seen: list[str] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, idx: int) -> None:
        manager = trainer.strategy.manager
        plan = random_plan(self.rng, len(manager.sizes))
        manager.set_plan(plan)
        self.seen.append(plan.lane_letters())
