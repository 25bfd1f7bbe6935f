"""A LightningModule written for plain PyTorch, as a new user brings one: trained under a strategy, and the results.

``OwnModel`` builds its network in ``__init__`` (an embedding, an ``nn.ModuleList`` of torch's
``TransformerEncoderLayer``, a head) and returns ``torch.optim.AdamW(self.parameters(), ...)`` with a per-step
``LambdaLR`` warm-up from ``configure_optimizers``: nothing in it knows DeepSpeed or this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

import lightning_dos  # noqa: F401  (registers the strategies)
from tests.support.parity import token_loader

VOCAB = 61
SEQ = 12
HIDDEN = 32
CLIP = 0.05  # small: the clip factor is not 1 at any step


def warmup(step: int) -> float:
    """A per-step warm-up then decay: the lr differs at every step."""
    return min(1.0, (step + 1) / 3) / (1.0 + 0.15 * step)


class OwnModel(pl.LightningModule):
    """Embedding -> ``layers`` ``TransformerEncoderLayer`` blocks in an ``nn.ModuleList`` -> head.

    Args:
        optimizer: ``"adamw"`` (torch.optim.AdamW, decoupled decay) or ``"adam"`` (torch.optim.Adam, L2 decay);
            ``"ds-adamw"``/``"ds-adam"``: DeepSpeed's CPU Adam with the same hyperparameters, as a module written for
            this package returns it; or a callable ``params -> optimizer``.
        schedule: a per-step ``LambdaLR`` (:func:`warmup`); without it the lr stays constant.
        weight_decay: the optimizer's weight decay.
        groups: two param groups (matrices with decay at the given lr, the rest without decay at half of it).
    """

    def __init__(self, optimizer: Any = "adamw", schedule: bool = True, weight_decay: float = 0.1,
                 groups: bool = False, layers: int = 2, lr: float = 1e-2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(HIDDEN, nhead=4, dim_feedforward=2 * HIDDEN, dropout=0.0, batch_first=True,
                                       bias=False)
            for _ in range(layers))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.optimizer, self.schedule, self.weight_decay, self.groups, self.lr = (
            optimizer, schedule, weight_decay, groups, lr)
        self.steps_run = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps_run += 1
        x, y = batch
        return nn.functional.cross_entropy(self(x).view(-1, VOCAB), y.view(-1))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x).view(-1, VOCAB), y.view(-1)))

    def _params(self) -> Any:
        if not self.groups:
            return self.parameters()
        matrices = [p for n, p in self.named_parameters() if n.endswith("weight") and "norm" not in n]
        rest = [p for n, p in self.named_parameters() if not (n.endswith("weight") and "norm" not in n)]
        return [{"params": matrices}, {"params": rest, "weight_decay": 0.0, "lr": self.lr / 2}]

    def configure_optimizers(self) -> Any:
        hyper = dict(lr=self.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=self.weight_decay)
        if callable(self.optimizer):
            opt = self.optimizer(self._params())
        elif self.optimizer.startswith("ds-"):  # what a module written for this package returns (optim.adamw)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(self._params(), adamw_mode=self.optimizer == "ds-adamw", **hyper)
        else:
            cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[self.optimizer]
            opt = cls(self._params(), **hyper)
        if not self.schedule:
            return opt
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Recorder(pl.Callback):
    """Each step's loss and the lr the engine's optimizer holds when the step is taken."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.lrs: list[list[float]] = []
        self.params: dict[str, torch.Tensor] = {}
        self.stepped: Any = None  # the optimizer the engine steps
        self.driven: Any = None  # the optimizer the LR scheduler drives

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        engine_optimizer = trainer.optimizers[0]
        self.stepped = getattr(engine_optimizer, "optimizer", engine_optimizer)  # the optimizer inside ZeRO's
        configs = trainer.lr_scheduler_configs
        self.driven = configs[0].scheduler.optimizer if configs else None

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.lrs.append([float(g["lr"]) for g in trainer.optimizers[0].param_groups])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        wait = getattr(trainer.strategy, "wait_for_update", None)
        if wait is not None:
            wait()  # with overlap the last update may still run
        self.params = full_params(trainer, pl_module)


@dataclass
class Run:
    losses: list[float]
    params: dict[str, torch.Tensor]
    lrs: list[list[float]]
    trainer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def flat(self) -> torch.Tensor:
        return torch.cat([self.params[name].flatten() for name in sorted(self.params)])


def full_params(trainer: pl.Trainer, module: pl.LightningModule) -> dict[str, torch.Tensor]:
    """Every parameter of ``module`` in fp32, whole: ZeRO-3's fp32 masters (gathered) under DeepSpeed, else the
    module's own."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if isinstance(trainer.strategy, DeepSpeedStrategy) and trainer.strategy.model is not None:
        from deepspeed.utils import safe_get_full_fp32_param

        return {n: safe_get_full_fp32_param(p).detach().float().cpu().clone() for n, p in module.named_parameters()}
    return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}


def fit(strategy: Any, steps: int = 6, clip: float | None = CLIP, module: OwnModel | None = None,
        callbacks: list[pl.Callback] | None = None, ckpt_path: str | None = None, save_to: str | None = None,
        root: str | None = None, batches: int | None = None, logger: Any = False, accelerator: str = "cpu",
        **trainer_kwargs: Any) -> Run:
    """Train ``module`` (an :class:`OwnModel` by default) for ``steps`` optimizer steps in one process (a CPU's by
    default), the batches in order under every strategy (Lightning would put a shuffling sampler under DeepSpeed's)."""
    recorder = Recorder()
    # with ``batches`` per epoch: whole epochs, so that a checkpoint lands on an epoch boundary
    epochs = {"max_steps": -1, "max_epochs": steps // batches} if batches else {"max_steps": steps}
    trainer = pl.Trainer(accelerator=accelerator, devices=1, strategy=strategy, precision="32-true", **epochs,
                         gradient_clip_val=clip, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, use_distributed_sampler=False,
                         callbacks=[recorder, *(callbacks or [])], **trainer_kwargs)
    module = module or OwnModel()
    trainer.fit(module, train_dataloaders=token_loader(batches or steps, vocab=VOCAB, seq=SEQ), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return Run(recorder.losses, recorder.params, recorder.lrs, trainer,
               {"stepped": recorder.stepped, "driven": recorder.driven, "module": module})


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def max_loss_rel(a: Run, b: Run) -> float:
    assert len(a.losses) == len(b.losses) and a.losses
    return max(abs(x - y) / abs(y) for x, y in zip(a.losses, b.losses))
