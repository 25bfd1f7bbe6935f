"""Owns the host's memory as this package sees it: page-locking host tensors in place (and unlocking them before their
memory can be freed), and reading how much memory the whole host has available.

torch's pinned allocator rounds every block up to a power of two, so a 400 MB subgroup of optimizer state
takes 512 MB, about 28% more host memory than the same state unpinned. Registering an ordinary host
allocation with the CUDA driver page-locks exactly its bytes, and the copy engines then move it
asynchronously just as they do pinned memory.

A :class:`PinnedRegistry` keeps a reference to every tensor it registered, so no registered memory can be
freed while it is locked, and unregisters all of them in :meth:`PinnedRegistry.release` (also called when
the registry is collected). A tensor that is still referenced elsewhere after the release stays valid: it
is simply pageable again.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

log = logging.getLogger(__name__)

#: ``cudaHostRegisterPortable``: the memory counts as pinned for every CUDA context.
_PORTABLE = 1


def _cudart() -> Any:
    return torch.cuda.cudart()


def read_meminfo(meminfo: str = "/proc/meminfo") -> tuple[int, int] | None:
    """The whole host's ``MemTotal`` and ``MemAvailable`` now, in bytes (pages the CUDA driver pinned count as in use,
    not available); None where there is no such file or it lacks them."""
    try:
        with open(meminfo) as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        total, available = (int(fields[key].split()[0]) * 1024 for key in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return total, available


class PinnedRegistry:
    """Page-locks host tensors in place (``cudaHostRegister``) and unlocks them all on :meth:`release`."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}  # storage address -> a tensor keeping that storage alive
        self._finalizer = weakref.finalize(self, _unregister_all, self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def nbytes(self) -> int:
        """Bytes page-locked by this registry."""
        return sum(t.untyped_storage().nbytes() for t in self._tensors.values())

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage was page-locked by this registry."""
        return tensor.device.type == "cpu" and tensor.untyped_storage().data_ptr() in self._tensors

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """Page-lock ``tensor``'s whole storage where it is; return ``tensor`` (already pinned: unchanged)."""
        if tensor.device.type != "cpu":
            raise ValueError(f"only host tensors can be page-locked, got one on {tensor.device}")
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self._tensors or storage.nbytes() == 0 or tensor.is_pinned():
            return tensor
        code = int(_cudart().cudaHostRegister(address, storage.nbytes(), _PORTABLE))
        if code != 0:
            raise RuntimeError(
                f"pin_memory: page-locking {storage.nbytes() / 2**20:.0f} MiB of host memory failed (CUDA error "
                f"{code}); the host may be short of lockable memory (see `ulimit -l`). Set pin_memory=False to "
                "keep the optimizer state pageable."
            )
        self._tensors[address] = tensor
        return tensor

    def unpin(self, tensor: torch.Tensor) -> None:
        """Unlock ``tensor``'s storage, if this registry locked it, so that its memory can be freed."""
        address = tensor.untyped_storage().data_ptr() if tensor.device.type == "cpu" else None
        if address in self._tensors:
            _unregister_all({address: self._tensors.pop(address)})

    def release(self) -> None:
        """Unlock every registered tensor (idempotent)."""
        _unregister_all(self._tensors)


def _unregister_all(tensors: dict[int, torch.Tensor]) -> None:
    for address in list(tensors):
        try:
            code = int(_cudart().cudaHostUnregister(address))
        except Exception:  # the CUDA runtime may already be gone at interpreter exit  # noqa: BLE001
            code = -1
        if code != 0:
            log.debug("cudaHostUnregister(%#x) returned %d", address, code)
        tensors.pop(address, None)
