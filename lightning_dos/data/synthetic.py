"""Owns the synthetic data module: random token windows for throughput and memory benchmarks.

No corpus, tokenizer or disk cache: every window is generated from ``(seed, index)``, so batches are
identical across runs, processes and DataLoader workers, and cost no I/O.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

# Offsets the validation stream's seeds so val windows differ from train windows.
_VAL_SEED_OFFSET = 1_000_003


class RandomTokenWindows(Dataset):
    """``length`` windows of uniform random token ids; item i -> (x, y) with y = x shifted by one."""

    def __init__(self, vocab_size: int, seq_len: int, length: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.length, self.seed = vocab_size, seq_len, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(f"window {index} out of range for {self.length} windows")
        # A generator per item makes item i independent of access order and of the worker that builds it.
        generator = torch.Generator().manual_seed(self.seed * 1_000_000_007 + index)
        tokens = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=generator, dtype=torch.long)
        return tokens[:-1], tokens[1:]


class SyntheticDataModule(pl.LightningDataModule):
    """Deterministic random token batches, in the same (x, y) format as ``TextDataModule``.

    Args:
        vocab_size: Token ids are drawn uniformly from ``[0, vocab_size)``.
        seq_len: Tokens per window (the model's context length).
        batch_size: Windows per batch, per device.
        num_batches: Train batches per epoch (per device before distributed sampling splits them).
        seed: Same seed -> same batches.
        num_val_batches: Validation batches (drawn from a different stream than train).
    """

    def __init__(
        self,
        vocab_size: int = 50304,
        seq_len: int = 2048,
        batch_size: int = 4,
        num_batches: int = 64,
        seed: int = 1234,
        num_val_batches: int = 4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        for key, value, minimum in (("vocab_size", vocab_size, 1), ("seq_len", seq_len, 1),
                                    ("batch_size", batch_size, 1), ("num_batches", num_batches, 1),
                                    ("num_val_batches", num_val_batches, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"data.{key} must be an integer >= {minimum}, got {value!r}")
        self._vocab_size = vocab_size
        self.seq_len, self.batch_size, self.num_batches, self.seed = seq_len, batch_size, num_batches, seed
        self.num_val_batches = num_val_batches
        self.train_dataset = RandomTokenWindows(vocab_size, seq_len, num_batches * batch_size, seed)
        self.val_dataset = RandomTokenWindows(vocab_size, seq_len, num_val_batches * batch_size,
                                              seed + _VAL_SEED_OFFSET)

    @property
    def vocab_size(self) -> int:
        """Vocabulary size for the model's embedding."""
        return self._vocab_size

    def train_dataloader(self) -> DataLoader:
        """Windows in index order, split over ranks, resumable mid-epoch: the same batches under every strategy."""
        from lightning_dos.data.loader import ResumableDataLoader, ResumableSampler

        trainer = getattr(self, "trainer", None)
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        # No shuffle: the windows are already random. The sampler is a DistributedSampler, so Lightning does not put
        # its own shuffling one in its place under a distributed strategy (DeepSpeed) while a single-device strategy
        # keeps this order: without it, the two saw different batches.
        sampler = ResumableSampler(self.train_dataset, num_replicas=num_replicas, rank=rank, seed=self.seed,
                                   shuffle=False)
        return ResumableDataLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset, batch_size=self.batch_size, shuffle=False, drop_last=False)
