"""Owns the host buffers activations are copied into: a pool of page-locked buffers reused across layers and steps.

A transformer saves the same few tensor sizes in every layer and every step, so after the first step every offload finds
a free buffer of its size class and no new host memory is allocated or page-locked. Buffers are page-locked in place
(``cudaHostRegister`` through :class:`~lightning_dos.update.host_memory.PinnedRegistry`, exactly their bytes, not a
power of two), start at a page boundary and span whole pages, as direct file I/O needs. A released buffer is handed out
again only once the event of the last copy that reads it has completed. On a host without CUDA the buffers are ordinary
memory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch

__all__ = ["HostBuffer", "HostBufferPool", "size_class"]

#: Buffers start at, and span a multiple of, this many bytes (one page: what direct I/O needs).
ALIGN = 4096
#: Size classes per doubling above 1 MiB: at most 1/8 (12.5%) of a buffer is slack.
CLASSES_PER_OCTAVE = 8


def size_class(nbytes: int) -> int:
    """The capacity of the buffer that holds ``nbytes``: whole pages, and above 1 MiB one of 8 sizes per doubling."""
    pages = max(1, -(-nbytes // ALIGN))
    capacity = pages * ALIGN
    if capacity <= 1 << 20:
        return capacity
    step = (1 << (capacity.bit_length() - 1)) // CLASSES_PER_OCTAVE
    return -(-capacity // step) * step


@dataclass(eq=False)
class HostBuffer:
    """One pooled host buffer: ``data`` is ``capacity`` bytes, page-aligned."""

    data: torch.Tensor
    capacity: int
    after: Any = None  # event of the last copy that reads it, set on release

    def view(self, nbytes: int) -> torch.Tensor:
        return self.data[:nbytes]


class HostBufferPool:
    """Reusable page-aligned host buffers by size class, page-locked when ``pin`` (needs CUDA).

    Thread-safe: the NVMe writer threads release buffers as their writes complete.
    """

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._registry: Any = None
        if pin:
            from lightning_dos.update.host_memory import PinnedRegistry

            self._registry = PinnedRegistry()
        self._free: dict[int, list[HostBuffer]] = {}
        self._lock = threading.Lock()
        self.capacity_bytes = 0
        """Host memory the pool holds (free and in use)."""
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0
        self.allocations = 0
        """Buffers allocated (and page-locked) so far; every other acquire reused one."""
        self.acquires = 0

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least ``nbytes`` that no copy reads any more."""
        capacity = size_class(nbytes)
        with self._lock:
            self.acquires += 1
            free = self._free.get(capacity, [])
            for index, buffer in enumerate(free):
                if buffer.after is None or buffer.after.done():
                    free.pop(index)
                    buffer.after = None
                    self._count_in(capacity)
                    return buffer
        buffer = self._allocate(capacity)  # outside the lock: page-locking takes a while
        with self._lock:
            self.allocations += 1
            self.capacity_bytes += capacity
            self._count_in(capacity)
        return buffer

    def release(self, buffer: HostBuffer, after: Any = None) -> None:
        """Give ``buffer`` back; it is reused only once ``after`` (an event, or None) has completed."""
        buffer.after = after
        with self._lock:
            self.in_use_bytes -= buffer.capacity
            self._free.setdefault(buffer.capacity, []).append(buffer)

    def _count_in(self, capacity: int) -> None:
        self.in_use_bytes += capacity
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)

    def _allocate(self, capacity: int) -> HostBuffer:
        backing = torch.empty(capacity + ALIGN, dtype=torch.uint8)
        start = (-backing.data_ptr()) % ALIGN
        data = backing[start:start + capacity]
        if self._registry is not None:
            self._registry.pin(backing)
        return HostBuffer(data=data, capacity=capacity)

    def close(self) -> None:
        """Wait for the copies that still read free buffers, then drop and unlock every buffer."""
        with self._lock:
            buffers = [b for free in self._free.values() for b in free]
            self._free.clear()
            self.capacity_bytes -= sum(b.capacity for b in buffers)
        for buffer in buffers:
            if buffer.after is not None:
                try:
                    buffer.after.wait_host()
                except Exception:  # noqa: BLE001  (a failed copy already raised where it was awaited)
                    pass
        if self._registry is not None and self.in_use_bytes == 0:
            self._registry.release()

    @property
    def stats(self) -> dict[str, Optional[int]]:
        return {"capacity_bytes": self.capacity_bytes, "in_use_bytes": self.in_use_bytes,
                "peak_in_use_bytes": self.peak_in_use_bytes, "allocations": self.allocations}
