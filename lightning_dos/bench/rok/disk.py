"""Owns the NVMe directory's measured bandwidth: a temporary file written in 8 MiB chunks and fsync-ed, read back
bypassing the page cache (``O_DIRECT``, else after ``posix_fadvise(DONTNEED)``: the report says which), removed.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

__all__ = ["CHUNK_BYTES", "measure_disk"]

#: Bytes per write and read call (a multiple of the page size, as ``O_DIRECT`` needs).
CHUNK_BYTES = 8 << 20
MB = 1e6


@contextmanager
def _open(path: Path, flags: int) -> Iterator[tuple[int, bool]]:
    """``(fd, direct)``: ``path`` opened with ``O_DIRECT`` where the filesystem takes it, else without."""
    direct_flag = getattr(os, "O_DIRECT", 0)
    fd, direct = -1, False
    if direct_flag:
        try:
            fd, direct = os.open(path, flags | direct_flag, 0o600), True
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
    if fd < 0:
        fd = os.open(path, flags, 0o600)
    try:
        yield fd, direct
    finally:
        os.close(fd)


def _transfer(fd: int, total: int, chunk: mmap.mmap, write: bool, bar: Any) -> float:
    """Seconds to write (then fsync) or read ``total`` bytes in ``chunk``-sized calls."""
    started = time.perf_counter()
    done = 0
    while done < total:
        n = os.pwrite(fd, chunk, done) if write else os.preadv(fd, [chunk], done)
        if n <= 0:
            raise OSError(errno.EIO, f"short {'write' if write else 'read'} at byte {done}")
        done += n
        bar.update(n)
    if write:
        os.fsync(fd)
    return time.perf_counter() - started


def measure_disk(directory: str | Path, mib: int, progress: bool = True) -> dict[str, Any]:
    """Write ``mib`` MiB to a temporary file under ``directory`` (fsync), read it back, remove it: ``write_mb_s`` and
    ``read_mb_s`` (10^6 bytes), the seconds, ``direct``, ``read_cache`` (how the cache was avoided), ``error``."""
    total = max(1, -(-mib * 2**20 // CHUNK_BYTES)) * CHUNK_BYTES  # whole chunks
    path = Path(directory) / f".lightning-dos-bandwidth-{uuid.uuid4().hex}"
    out: dict[str, Any] = {"directory": str(directory), "bytes": total, "write_mb_s": None, "read_mb_s": None,
                           "write_s": None, "read_s": None, "direct": None, "read_cache": None, "error": None}
    chunk = mmap.mmap(-1, CHUNK_BYTES)  # page-aligned, as O_DIRECT needs
    chunk.write(os.urandom(4096) * (CHUNK_BYTES // 4096))
    try:
        with tqdm(total=2 * total, desc="disk bandwidth", unit="B", unit_scale=True, disable=not progress,
                  dynamic_ncols=True) as bar:
            with _open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC) as (fd, direct_write):
                out["write_s"] = _transfer(fd, total, chunk, True, bar)
            with _open(path, os.O_RDONLY) as (fd, direct_read):
                if direct_read:
                    out["read_cache"] = "O_DIRECT: the page cache is bypassed"
                elif hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    out["read_cache"] = ("buffered: the file's cached pages were dropped first (posix_fadvise "
                                         "DONTNEED, best effort)")
                else:
                    out["read_cache"] = "buffered: the read may come from the page cache"
                out["read_s"] = _transfer(fd, total, chunk, False, bar)
        out["direct"] = direct_write and direct_read
        out["write_mb_s"] = total / MB / out["write_s"] if out["write_s"] else None
        out["read_mb_s"] = total / MB / out["read_s"] if out["read_s"] else None
    except OSError as err:
        out["error"] = f"{type(err).__name__}: {err.strerror or err}"
    finally:
        chunk.close()
        path.unlink(missing_ok=True)
    return out
