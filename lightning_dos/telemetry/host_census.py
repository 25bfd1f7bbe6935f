"""Owns the host-memory census of a process: where its host memory went, at a moment of a run.

The figures a size study reports (the whole host in use, the process's peak RSS) say how much; a run killed by the
kernel's out-of-memory killer needs to say what. :func:`take` reads, at one moment:

- the process's resident set split by the kernel (``/proc/self/status``: anonymous, file-backed, shared; ``VmPin``,
  the pages a driver pinned, e.g. optimizer state page-locked in place);
- the whole host (``/proc/meminfo``: in use, ``Shmem``, which holds the CUDA driver's page-locked allocations);
- torch's page-locked host allocator, where ``pin_memory()`` allocations are cached (rounded to powers of two);
- every host tensor the Python heap reaches, by storage (each counted once): bytes by dtype and page-locking, and
  the largest storages. What the process holds beyond them is libraries, the interpreter and the allocator's
  own keeping.

:class:`HostCensusLog` writes one line of the host in use after every training batch (a run killed by the kernel
leaves the lines before its end in its log) and a census after the batches it is given and at the end of training.
"""

from __future__ import annotations

import gc
import re
import sys
import warnings
from collections import Counter
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dos.planning.placement import GIB
from lightning_dos.telemetry.callbacks import host_in_use_gib

#: /proc/self/status fields read, in kB there.
STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPin", "VmLck")
#: /proc/meminfo fields read, in kB there.
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "AnonPages", "Shmem", "Mlocked", "Cached")


#: A line :class:`HostCensusLog` writes: when it was read, and the host in use then (GiB).
_READING = re.compile(r"^(?:host census \((?P<when>[^)]+)\): host in use (?P<census>[0-9.]+) GiB"
                      r"|host in use (?P<after>after training batch \d+): (?P<line>[0-9.]+) GiB)")


def last_reading(log: str) -> tuple[str, float] | None:
    """The last reading a :class:`HostCensusLog` wrote into ``log`` (a worker's log): when it was taken and the host
    in use then, in GiB; None where it wrote none."""
    for line in reversed(log.splitlines()):
        found = _READING.match(line.strip())
        if found:
            return found["when"] or found["after"], float(found["census"] or found["line"])
    return None


def read_kb_fields(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """The ``key: N kB`` fields of a /proc file, in bytes (those absent or unreadable are left out)."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys and rest.split():
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return out


def host_storages() -> list[tuple[int, str, bool, tuple[int, ...]]]:
    """Every host tensor storage the Python heap reaches, once each: (bytes, dtype, page-locked, a tensor's shape)."""
    seen: dict[int, tuple[int, str, bool, tuple[int, ...]]] = {}
    with warnings.catch_warnings():  # isinstance on a deprecated module attribute (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        if obj.device.type != "cpu" or obj.is_meta:
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other layouts without one storage
            continue
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or address in seen and seen[address][0] >= nbytes:
            continue
        seen[address] = (nbytes, str(obj.dtype).removeprefix("torch."), bool(obj.is_pinned()), tuple(obj.shape))
    return sorted(seen.values(), reverse=True)


def take(largest: int = 5) -> dict[str, Any]:
    """The census now (bytes): ``process`` and ``host`` fields, ``pinned_allocator`` (torch's page-locked host
    allocator, where it reports), ``tensors`` (bytes by ``dtype pinned|pageable``), ``tensor_bytes`` and the
    ``largest`` storages."""
    storages = host_storages()
    by_kind: Counter[str] = Counter()
    for nbytes, dtype, pinned, _ in storages:
        by_kind[f"{dtype} {'pinned' if pinned else 'pageable'}"] += nbytes
    allocator: dict[str, int] = {}
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if torch.cuda.is_available() and callable(stats):
        reading = stats()
        for key in ("allocated_bytes.current", "reserved_bytes.current"):
            if key in reading:
                allocator[key.split("_")[0]] = int(reading[key])  # "allocated", "reserved"
    return {
        "process": read_kb_fields("/proc/self/status", STATUS_KEYS),
        "host": read_kb_fields("/proc/meminfo", MEMINFO_KEYS),
        "pinned_allocator": allocator,
        "tensors": dict(by_kind.most_common()),
        "tensor_bytes": sum(nbytes for nbytes, *_ in storages),
        "largest": [{"bytes": n, "dtype": d, "pinned": p, "shape": list(s)} for n, d, p, s in storages[:largest]],
    }


def describe(census: dict[str, Any], when: str) -> str:
    """A few lines of ``census`` in GiB, headed by ``when`` it was taken."""
    def gib(n: int | None) -> str:
        return "-" if n is None else f"{n / GIB:.2f}"

    p, h = census["process"], census["host"]
    in_use = h["MemTotal"] - h["MemAvailable"] if {"MemTotal", "MemAvailable"} <= h.keys() else None
    lines = [
        f"host census ({when}): host in use {gib(in_use)} GiB (Shmem {gib(h.get('Shmem'))}, Mlocked "
        f"{gib(h.get('Mlocked'))}); this process: RSS {gib(p.get('VmRSS'))} = anonymous {gib(p.get('RssAnon'))} "
        f"+ file {gib(p.get('RssFile'))} + shared {gib(p.get('RssShmem'))}, driver-pinned {gib(p.get('VmPin'))}",
        f"  host tensors {gib(census['tensor_bytes'])} GiB: "
        + (", ".join(f"{kind} {gib(n)}" for kind, n in census["tensors"].items()) or "none"),
    ]
    allocator = census["pinned_allocator"]
    if allocator:
        lines.append(f"  torch's page-locked allocator: {gib(allocator.get('allocated'))} GiB allocated, "
                     f"{gib(allocator.get('reserved'))} reserved")
    if census["largest"]:
        lines.append("  largest: " + ", ".join(
            f"{t['dtype']}{t['shape']} {gib(t['bytes'])}{' pinned' if t['pinned'] else ''}" for t in census["largest"]))
    return "\n".join(lines)


class HostCensusLog(Callback):
    """Writes the host in use after every training batch, and a :func:`take` census after batches ``at`` and at the
    end of training, to standard output (rank zero; every census is kept in :attr:`censuses`).

    Args:
        at: the training batches (counted from 1) after which a census is taken.
    """

    def __init__(self, at: tuple[int, ...] = (1,)) -> None:
        self.at = at
        self.batches = 0
        self.censuses: dict[str, dict[str, Any]] = {}

    def record(self, trainer: pl.Trainer | None, when: str) -> None:
        """Take a census now, keep it under ``when`` and print it (rank zero)."""
        census = take()
        self.censuses[when] = census
        if trainer is None or trainer.is_global_zero:
            print(describe(census, when), file=sys.stdout, flush=True)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.batches += 1
        if self.batches in self.at:
            self.record(trainer, f"after training batch {self.batches}")
        elif trainer.is_global_zero:
            in_use = host_in_use_gib()
            if in_use is not None:
                print(f"host in use after training batch {self.batches}: {in_use:.2f} GiB", flush=True)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record(trainer, "at the end of training")
