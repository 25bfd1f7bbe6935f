"""Owns the activation-offload options: placement names, defaults, and the validation every entry point runs.

The same checks serve :class:`~lightning_dos.activations.ActivationOffload`, its Lightning callback and the
``activation_*`` arguments of ``DeepOptimizerStatesStrategy``; only the key names in the messages differ
(:class:`OptionKeys`), so each error names the argument the user actually wrote. The NVMe checks run for real: the
directory must exist, take a probe file written and read back, and have at least :data:`MIN_FREE_DISK_BYTES` free.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

__all__ = [
    "DEFAULT_KEEP_LAST_LAYERS",
    "DEFAULT_KEYS",
    "DEFAULT_MIN_TENSOR_BYTES",
    "DEFAULT_PREFETCH_LAYERS",
    "MIN_FREE_DISK_BYTES",
    "OFFLOAD_PLACEMENTS",
    "PLACEMENTS",
    "STRATEGY_KEYS",
    "OptionKeys",
    "OptionsError",
    "check_nvme_path",
    "validate_options",
]

#: Where saved activations go: ``"keep"`` leaves them on the device (the hooks only measure), ``"host"`` moves them
#: to pinned host memory, ``"nvme"`` further to files on a local disk.
PLACEMENTS = ("keep", "host", "nvme")
#: The placements that move anything (what the strategy's ``activation_offload`` accepts besides ``None``).
OFFLOAD_PLACEMENTS = ("host", "nvme")
#: Saved tensors whose storage is smaller than this stay on the device: one copy costs a launch and an event whatever
#: its size, and a transformer's small saved tensors (norm statistics, rotary tables) add up to little memory.
DEFAULT_MIN_TENSOR_BYTES = 1 << 20
#: The last block's activations are the first backward needs: moving them out only to bring them straight back in
#: costs two transfers and saves no peak memory.
DEFAULT_KEEP_LAST_LAYERS = 1
#: Layers restored ahead of the one backward is in: one is enough to hide a layer's copy behind a layer's compute.
DEFAULT_PREFETCH_LAYERS = 1
#: Free space an NVMe directory must have at the start; the run also stops with an error before its activation files
#: would leave less than this on the disk.
MIN_FREE_DISK_BYTES = 1 << 30
#: Probe size and the alignment direct I/O needs (one page on every filesystem that supports it).
PROBE_BYTES = 4096


@dataclass(frozen=True)
class OptionKeys:
    """The argument names errors cite: the callback's and ``ActivationOffload``'s, or the strategy's."""

    placement: str = "placement"
    nvme_path: str = "nvme_path"
    min_tensor_bytes: str = "min_tensor_bytes"
    keep_last_layers: str = "keep_last_layers"
    prefetch_layers: str = "prefetch_layers"


#: The names ``ActivationOffload`` and its callback use.
DEFAULT_KEYS = OptionKeys()

#: The names of the same options on ``DeepOptimizerStatesStrategy``.
STRATEGY_KEYS = OptionKeys(
    placement="activation_offload",
    nvme_path="activation_nvme_path",
    min_tensor_bytes="activation_min_tensor_bytes",
    keep_last_layers="activation_keep_last_layers",
)


class OptionsError(ValueError):
    """Every problem with the activation-offload options, one line each in ``problems`` (a caller with options of its
    own reports them together with its own)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("activation offload: " + "; ".join(problems))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_options(
    placement: Optional[str],
    nvme_path: Optional[Union[str, os.PathLike]],
    min_tensor_bytes: Any,
    keep_last_layers: Any,
    prefetch_layers: Any = DEFAULT_PREFETCH_LAYERS,
    *,
    keys: OptionKeys = DEFAULT_KEYS,
    placements: tuple[Optional[str], ...] = PLACEMENTS,
    min_free_bytes: Optional[int] = None,
) -> tuple[Optional[Path], bool]:
    """Raise one ``ValueError`` (an :class:`OptionsError`) listing every problem with these options; return the NVMe
    directory (resolved) and whether it takes direct I/O (``O_DIRECT``), or ``(None, False)`` for the other placements.

    ``min_free_bytes``: free space the NVMe directory needs (None: :data:`MIN_FREE_DISK_BYTES`).
    """
    problems: list[str] = []
    if placement not in placements:
        shown = ", ".join("null" if p is None else repr(p) for p in placements)
        problems.append(f"{keys.placement}: unknown placement {placement!r}; set one of {shown}")
    if not _is_count(min_tensor_bytes):
        problems.append(f"{keys.min_tensor_bytes}: {min_tensor_bytes!r} is not a byte count; set an integer >= 0 "
                        f"(default {DEFAULT_MIN_TENSOR_BYTES}: smaller saved tensors stay on the device)")
    if not _is_count(keep_last_layers):
        problems.append(f"{keys.keep_last_layers}: {keep_last_layers!r} is not a number of layers; set an integer "
                        f">= 0 (default {DEFAULT_KEEP_LAST_LAYERS})")
    if not _is_count(prefetch_layers) or prefetch_layers < 1:
        problems.append(f"{keys.prefetch_layers}: {prefetch_layers!r} is not a number of layers; set an integer "
                        f">= 1 (default {DEFAULT_PREFETCH_LAYERS})")
    path: Optional[Path] = None
    direct = False
    if placement == "nvme":
        if nvme_path is None:
            problems.append(f"{keys.nvme_path}: {keys.placement}='nvme' needs a directory on a local disk; set "
                            f"{keys.nvme_path} to one (or set {keys.placement}='host')")
        else:
            try:
                path, direct = check_nvme_path(nvme_path, key=keys.nvme_path, min_free_bytes=min_free_bytes)
            except ValueError as error:
                problems.append(str(error))
    elif nvme_path is not None and placement in placements:
        problems.append(f"{keys.nvme_path}: set only with {keys.placement}='nvme' (it is {placement!r}); remove "
                        f"{keys.nvme_path} or set {keys.placement}='nvme'")
    if problems:
        raise OptionsError(problems)
    return path, direct


def check_nvme_path(
    nvme_path: Union[str, os.PathLike], key: str = "nvme_path", min_free_bytes: Optional[int] = None
) -> tuple[Path, bool]:
    """Check that ``nvme_path`` is an existing, writable directory with room, by writing and reading a probe file.

    Returns the resolved directory and whether it takes ``O_DIRECT`` (page-cache-free) I/O; raises ``ValueError``
    naming ``key`` and the fix otherwise.
    """
    path = Path(nvme_path).expanduser()
    if not path.exists():
        raise ValueError(f"{key}: {str(path)!r} does not exist; create the directory (on a local NVMe disk) or set "
                         f"{key} to an existing one")
    if not path.is_dir():
        raise ValueError(f"{key}: {str(path)!r} is not a directory; set {key} to a directory on a local NVMe disk")
    if not hasattr(os, "pwrite") or not hasattr(os, "preadv"):
        raise ValueError(f"{key}: this platform has no positioned file I/O (os.pwrite/os.preadv), so activations "
                         "cannot go to files; set the placement to 'host'")
    try:
        direct = _probe(path)
    except OSError as error:
        raise ValueError(f"{key}: cannot write and read back a file in {str(path)!r} ({error.strerror or error}); "
                         f"set {key} to a writable directory on a local disk, or set the placement to 'host'") from None
    if min_free_bytes is None:
        min_free_bytes = MIN_FREE_DISK_BYTES
    free = shutil.disk_usage(path).free
    if free < min_free_bytes:
        raise ValueError(f"{key}: {str(path)!r} has {free / 2**30:.2f} GiB free, less than the "
                         f"{min_free_bytes / 2**30:.2f} GiB minimum; free space there or set {key} to a larger disk")
    return path.resolve(), direct


def _probe(path: Path) -> bool:
    """Write, read back and remove one page; return whether direct I/O worked (else buffered I/O did)."""
    import mmap

    name = path / f".lightning-dos-probe-{uuid.uuid4().hex}"
    page = mmap.mmap(-1, PROBE_BYTES)  # page-aligned, as O_DIRECT needs
    page.write(os.urandom(PROBE_BYTES))
    try:
        for direct in (True, False):
            flags = os.O_CREAT | os.O_RDWR | (getattr(os, "O_DIRECT", 0) if direct else 0)
            if direct and not getattr(os, "O_DIRECT", 0):
                continue
            try:
                fd = os.open(name, flags, 0o600)
            except OSError as error:
                if direct and error.errno == errno.EINVAL:
                    continue  # the filesystem refuses O_DIRECT (tmpfs): buffered I/O next
                raise
            try:
                os.pwrite(fd, page, 0)
                back = mmap.mmap(-1, PROBE_BYTES)
                read = os.preadv(fd, [back], 0)
            except OSError as error:
                if direct and error.errno == errno.EINVAL:
                    continue
                raise
            finally:
                os.close(fd)
            if read != PROBE_BYTES or back[:] != page[:]:
                raise OSError(errno.EIO, "the probe file read back differently")
            return direct
        raise OSError(errno.EIO, "no I/O mode worked")
    finally:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
