"""Owns the train loader's order: seeded per epoch, split over ranks, and resumable mid-epoch from a checkpoint.

:class:`ResumableSampler` is a ``DistributedSampler``, so Lightning keeps it under several ranks (it injects its
own sampler only into loaders without one) and calls its ``set_epoch`` every epoch. :class:`ResumableDataLoader`
implements Lightning's ``_Stateful`` protocol (``state_dict``/``load_state_dict``): the fit loop stores its state
in every checkpoint and loads it back when a run resumes, and the next iteration then skips the batches that were
already trained on, so a resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

__all__ = ["ResumableDataLoader", "ResumableSampler"]


class ResumableSampler(DistributedSampler):
    """Seeded shuffle per epoch (``seed + epoch``), each rank taking every ``num_replicas``-th index.

    Epoch 0 on one rank is exactly the order of ``DataLoader(shuffle=True, generator=torch.Generator()
    .manual_seed(seed))``, the train order before this sampler existed. Every rank gets the same number of
    indices (the tail that does not divide evenly is dropped), so ranks step in lockstep.

    Args:
        dataset: The map-style dataset (only its length is used).
        num_replicas: Number of ranks (``trainer.world_size``).
        rank: This rank (``trainer.global_rank``).
        seed: Seeds the order; epoch ``e`` uses ``seed + e``.
        shuffle: False gives the sequential order.
    """

    def __init__(self, dataset: Sized, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                 shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,  # type: ignore[arg-type]
                         drop_last=True)
        #: Indices of this rank's epoch to skip on the next iteration only (set by ResumableDataLoader).
        self.start = 0

    def epoch_indices(self) -> list[int]:
        """This rank's indices for the current epoch, in order, none skipped."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            # DataLoader(generator=g) draws its workers' base seed from g before shuffling; drawing it here too keeps
            # epoch 0 the order that loader gave, so earlier runs' losses are reproduced.
            torch.empty((), dtype=torch.int64).random_(generator=generator)
            indices = torch.randperm(n, generator=generator).tolist()
        else:
            indices = list(range(n))
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self.epoch_indices()
        start, self.start = self.start, 0  # a skip applies to one iteration only
        return iter(indices[start:])


class ResumableDataLoader(DataLoader):
    """A DataLoader over a :class:`ResumableSampler` whose position Lightning checkpoints and restores.

    State: the sampler's epoch and the batches this loader has yielded in that epoch, counted where batches
    leave the iterator (so worker prefetching does not inflate it). After :meth:`load_state_dict`, the next
    iteration of that epoch skips exactly that many batches without loading them; an iteration of another
    epoch starts at its beginning. ``len()`` stays the full epoch, as Lightning's progress tracking expects.
    Takes the arguments of ``torch.utils.data.DataLoader``; ``sampler`` must be a :class:`ResumableSampler`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, ResumableSampler) or self.batch_size is None:
            raise ValueError("ResumableDataLoader needs sampler=ResumableSampler(...) and a batch_size, so a resume "
                             "can skip whole batches by skipping sampler indices")
        self._epoch = 0
        self._batches = 0
        self._pending: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._resumable_iter()

    def _resumable_iter(self) -> Iterator[Any]:
        # A generator: nothing runs until the first batch is asked for, which is after Lightning's set_epoch.
        sampler = self.sampler
        assert isinstance(sampler, ResumableSampler) and self.batch_size is not None
        skip = 0
        if self._pending is not None:
            epoch, batches = self._pending
            self._pending = None
            if epoch == sampler.epoch:
                skip = batches
        self._epoch, self._batches = sampler.epoch, skip
        sampler.start = skip * self.batch_size
        for batch in super().__iter__():
            self._batches += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": e, "batches": b}``: b batches of epoch e have been yielded (or are to be skipped)."""
        return {"epoch": self._epoch, "batches": self._batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Make the next iteration of ``state_dict["epoch"]`` skip ``state_dict["batches"]`` batches."""
        epoch, batches = int(state_dict["epoch"]), int(state_dict["batches"])
        self._pending = (epoch, batches)
        self._epoch, self._batches = epoch, batches
        # Lightning sets the epoch itself too; setting it here covers workers started before it does.
        self.sampler.set_epoch(epoch)  # type: ignore[union-attr]
