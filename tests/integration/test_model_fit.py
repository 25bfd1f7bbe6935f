"""The GPT pretraining LightningModule trained by Lightning's Trainer on the CPU: what it logs, its optimizer groups,
its learning-rate schedule (the network and its accounting alone: tests/unit/test_model.py)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_dos.models import GPTModule, lr_factor
from lightning_dos.telemetry.callbacks import PerfMetrics


def test_fit_logs_metrics(tmp_path: Path) -> None:
    torch.manual_seed(0)
    vocab, seq_len = 64, 16
    data = torch.randint(0, vocab, (12, seq_len + 1))
    dataset = TensorDataset(data[:, :-1], data[:, 1:])
    module = GPTModule(
        name="debug", vocab_size=vocab, block_size=seq_len, n_layer=1, n_embd=32, warmup_steps=1, peak_flops=1e12
    )
    trainer = Trainer(
        accelerator="cpu",
        max_steps=3,
        limit_val_batches=2,
        logger=CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[PerfMetrics()],  # the throughput is the callback's (the CLI adds it to every run)
    )
    trainer.fit(module, DataLoader(dataset, batch_size=4), DataLoader(dataset, batch_size=4))

    metrics = {**trainer.callback_metrics, **trainer.logged_metrics}
    for key in ("train/loss", "train/lr", "val/loss", "val/ppl", "perf/tokens_per_s", "perf/mfu"):
        assert key in metrics, key
    assert not any(key.startswith("train/") and key not in ("train/loss", "train/lr") for key in metrics)
    assert math.isfinite(metrics["train/loss"].item())
    assert math.isfinite(metrics["val/loss"].item())
    assert metrics["val/ppl"].item() == pytest.approx(math.exp(metrics["val/loss"].item()), rel=1e-5)
    # the module's FLOPs per token and its peak_flops argument are what PerfMetrics turns into TFLOP/s and MFU
    tokens_per_s = float(metrics["perf/tokens_per_s"])
    assert tokens_per_s > 0
    # PaLM's 6 N + 12 L d T, N counted off the network's own modules: every parameter but the embedding tables, plus
    # the output projection where it reuses the token embedding (a matmul all the same)
    tables = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    tied = any(id(m.weight) in tables for m in module.modules() if isinstance(m, torch.nn.Linear))
    n = sum(p.numel() for p in module.parameters() if id(p) not in tables) + (vocab * 32 if tied else 0)
    assert module.flops_per_token(seq_len) == 6 * n + 12 * 1 * 32 * seq_len
    flops_per_s = tokens_per_s * module.flops_per_token(seq_len)
    assert float(metrics["perf/tflops_per_s"]) == pytest.approx(flops_per_s / 1e12, rel=1e-5)
    assert float(metrics["perf/mfu"]) == pytest.approx(flops_per_s / 1e12, rel=1e-5)  # peak_flops=1e12

    optimizer = trainer.optimizers[0]
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    assert all(p.dim() >= 2 for p in optimizer.param_groups[0]["params"])
    assert all(p.dim() < 2 for p in optimizer.param_groups[1]["params"])
    # three steps of warm-up 1 then cosine to step 3: the last logged lr (step 2) is lr_factor(2, 1, 3, 0.1) * peak
    assert metrics["train/lr"].item() == pytest.approx(3e-4 * lr_factor(2, 1, 3, 0.1))

    with open(Path(trainer.logger.log_dir) / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    columns = set(rows[0])
    assert {"train/loss", "train/lr", "val/loss", "val/ppl", "perf/tflops_per_s"} <= columns
    train_losses = [float(row["train/loss"]) for row in rows if row["train/loss"]]
    assert len(train_losses) == 3 and all(math.isfinite(v) for v in train_losses)
