"""Owns the files activations go to under the ``"nvme"`` placement: one directory per run, and its I/O threads.

Each run writes into a directory of its own under ``nvme_path`` (``lightning-dos-activations-<host>-<pid>-<random>``)
and holds an exclusive ``flock`` on the ``owner.lock`` file inside it for as long as it lives (taken before the
directory appears under that name). :meth:`NVMeStore.close` (end of fit, or the exception that stopped it) removes
the directory. A run that crashed leaves its directory behind, unlocked: the next store opened on the same
``nvme_path`` removes every such directory it can lock, and leaves alone those of live runs (other ranks, other
jobs), whose locks it cannot take.

I/O is a pool of threads doing positioned reads and writes (``os.pwrite``/``os.preadv``) with ``O_DIRECT`` where the
filesystem takes it (it bypasses the page cache, so activations really leave host memory; buffers and sizes are
page-aligned for it), else buffered. DeepSpeed's AIO op (libaio) is not used: it builds only where libaio's headers
are installed (not on this project's CPU test host; not checked on its GPU hosts), and plain threads serve. All work
on one activation (write, read back, delete) runs on the same thread, in the order it was submitted, so a read never
overtakes its write and a delete never overtakes its read. :func:`_pwrite` and :func:`_pread` are the only I/O calls,
so a test can slow them down.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from lightning_dos.activations.options import MIN_FREE_DISK_BYTES
from lightning_dos.activations.pool import ALIGN, HostBuffer

log = logging.getLogger(__name__)

__all__ = ["RUN_DIR_PREFIX", "NVMeStore", "remove_stale_runs"]

RUN_DIR_PREFIX = "lightning-dos-activations-"
#: A run directory is made under this name, locked, and only then renamed to ``RUN_DIR_PREFIX...``: a directory under
#: that name always has its lock taken, so a cleaner never sees one in between.
CREATING_PREFIX = "." + RUN_DIR_PREFIX + "creating-"
LOCK_NAME = "owner.lock"
#: A run directory without a lock file is only taken for stale after this long (its owner may be creating it now).
UNLOCKED_GRACE_S = 60.0
DEFAULT_IO_THREADS = 4


def remove_stale_runs(root: Path) -> list[Path]:
    """Remove the run directories under ``root`` whose owner is gone (their lock can be taken); return them."""
    removed = []
    for creating in root.glob(CREATING_PREFIX + "*"):
        # a directory being set up is renamed into place within microseconds: one this old was left by a crash
        if creating.is_dir() and time.time() - creating.stat().st_mtime > UNLOCKED_GRACE_S:
            shutil.rmtree(creating, ignore_errors=True)
            removed.append(creating)
    for run in sorted(root.glob(RUN_DIR_PREFIX + "*")):
        if not run.is_dir():
            continue
        lock = run / LOCK_NAME
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            if time.time() - run.stat().st_mtime < UNLOCKED_GRACE_S:
                continue
            fd = None
        except OSError:
            continue
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live run holds it
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
            log.info("activation offload: removed %s, left by a run that did not finish", run)
        finally:
            if fd is not None:
                os.close(fd)
    return removed


class NVMeStore:
    """Activation files of one run under ``root``, written and read by ``threads`` I/O threads.

    Args:
        root: an existing, writable directory (checked by :func:`~lightning_dos.activations.options.check_nvme_path`).
        direct: open files with ``O_DIRECT`` (buffers must then be page-aligned and span whole pages).
        threads: I/O threads; each activation's reads and writes stay on one of them.
        reserve_bytes: free space to leave on the disk; a write that would leave less fails with a clear error.
        key: the option name errors cite.
    """

    def __init__(self, root: Path, direct: bool = False, threads: int = DEFAULT_IO_THREADS,
                 reserve_bytes: int = MIN_FREE_DISK_BYTES, key: str = "nvme_path") -> None:
        self.root = Path(root)
        self.key = key
        self.direct = bool(direct)
        self.stale_removed = remove_stale_runs(self.root)
        creating = Path(tempfile.mkdtemp(prefix=CREATING_PREFIX, dir=self.root))
        self._lock_fd: Optional[int] = os.open(creating / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        unique = creating.name[len(CREATING_PREFIX):]
        self.dir = self.root / f"{RUN_DIR_PREFIX}{socket.gethostname()}-{os.getpid()}-{unique}"
        os.rename(creating, self.dir)  # the lock is on the file, so it moves with the directory
        self.budget_bytes = shutil.disk_usage(self.root).free - reserve_bytes
        self._lanes = [cf.ThreadPoolExecutor(1, thread_name_prefix=f"act-io{i}") for i in range(max(1, threads))]
        self._lock = threading.Lock()
        self._writes: dict[int, cf.Future] = {}
        self._sizes: dict[int, int] = {}
        self._pending_writes: dict[int, int] = {}
        self.bytes_on_disk = 0
        """Bytes of the activation files that exist or are being written."""
        self.peak_bytes_on_disk = 0
        self.written_bytes = 0
        self.read_bytes = 0
        self._closed = False

    def _lane(self, key: int) -> cf.ThreadPoolExecutor:
        return self._lanes[key % len(self._lanes)]

    def _path(self, key: int) -> Path:
        return self.dir / f"{key}.act"

    def write(self, key: int, buffer: HostBuffer, nbytes: int, after: Any, then: Callable[[], None]) -> cf.Future:
        """Write ``nbytes`` of ``buffer`` to activation ``key``'s file once ``after`` (the offload's event) has
        completed, then call ``then`` (which gives the buffer back)."""
        size = _io_size(nbytes, self.direct)
        with self._lock:
            if self.bytes_on_disk + size > self.budget_bytes:
                message = (
                    f"{self.key}: the activation files would leave less than the reserve free on {str(self.root)!r} "
                    f"({(self.bytes_on_disk + size) / 2**30:.2f} GiB needed, "
                    f"{max(0, self.budget_bytes) / 2**30:.2f} GiB usable); free space there, set {self.key} to a "
                    "larger disk, or keep more on the device (raise min_tensor_bytes or keep_last_layers)")
                raise OSError(errno.ENOSPC, message)
            self.bytes_on_disk += size
            self.peak_bytes_on_disk = max(self.peak_bytes_on_disk, self.bytes_on_disk)
            self.written_bytes += nbytes
            self._sizes[key] = size
            self._pending_writes[key] = size
        future = self._lane(key).submit(self._write, key, buffer, size, after, then)
        self._writes[key] = future
        return future

    def _write(self, key: int, buffer: HostBuffer, size: int, after: Any, then: Callable[[], None]) -> None:
        try:
            if after is not None:
                after.wait_host()  # the device->host copy has landed in the buffer
            fd = os.open(self._path(key), self._flags(os.O_CREAT | os.O_WRONLY | os.O_TRUNC), 0o600)
            try:
                _pwrite(fd, memoryview(buffer.data.numpy())[:size])
            finally:
                os.close(fd)
        finally:
            with self._lock:
                self._pending_writes.pop(key, None)
            then()

    def read(self, key: int, buffer: HostBuffer, nbytes: int, then: Callable[[], Any]) -> cf.Future:
        """Read activation ``key`` back into ``buffer`` (after its write), then return what ``then()`` returns."""
        with self._lock:
            self.read_bytes += nbytes
        return self._lane(key).submit(self._read, key, buffer, self._sizes[key], then)

    def _read(self, key: int, buffer: HostBuffer, size: int, then: Callable[[], Any]) -> Any:
        self._writes[key].result()  # same thread, submitted earlier: done; re-raises a failed write
        fd = os.open(self._path(key), self._flags(os.O_RDONLY))
        try:
            _pread(fd, memoryview(buffer.data.numpy())[:size])
        finally:
            os.close(fd)
        return then()

    def remove(self, key: int) -> cf.Future:
        """Delete activation ``key``'s file once its earlier work is done."""
        return self._lane(key).submit(self._remove, key)

    def _remove(self, key: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))
        with self._lock:
            self.bytes_on_disk -= self._sizes.pop(key, 0)
        self._writes.pop(key, None)

    @property
    def pending_write_bytes(self) -> int:
        """Bytes submitted for writing whose write has not finished (their host buffers are still held)."""
        with self._lock:
            return sum(self._pending_writes.values())

    def oldest_write(self) -> Optional[cf.Future]:
        with self._lock:
            key = next(iter(self._pending_writes), None)
        return None if key is None else self._writes.get(key)

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.act")) if self.dir.exists() else []

    def drain(self) -> None:
        """Wait until every submitted I/O has finished."""
        for lane in self._lanes:
            lane.submit(lambda: None).result()

    def close(self) -> None:
        """Finish the I/O, remove the run directory and give up its lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes:
            lane.shutdown(wait=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _flags(self, flags: int) -> int:
        return flags | (getattr(os, "O_DIRECT", 0) if self.direct else 0)


def _io_size(nbytes: int, direct: bool) -> int:
    """Bytes moved for ``nbytes``: whole pages under direct I/O (the pool's buffers span them)."""
    return -(-nbytes // ALIGN) * ALIGN if direct else nbytes


def _pwrite(fd: int, data: memoryview) -> None:
    """Write all of ``data`` at offset 0 of ``fd``."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def _pread(fd: int, data: memoryview) -> None:
    """Fill all of ``data`` from offset 0 of ``fd``."""
    done = 0
    while done < len(data):
        got = os.preadv(fd, [data[done:]], done)
        if got == 0:
            raise OSError(errno.EIO, f"activation file ended after {done} of {len(data)} bytes")
        done += got
