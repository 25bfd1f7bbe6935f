"""Owns peak-memory measurement in a process: host RSS (sampled + the kernel's high-water mark) and GPU peaks.

A bench worker uses all of it; a training run's ``perf/peak_host_gib`` reads the high-water mark
(:func:`ru_maxrss_bytes`, :class:`~lightning_dos.telemetry.callbacks.PerfMetrics`).

Host: a daemon thread samples this process's resident set size with psutil every ``interval_s``; the kernel's
own high-water mark (``resource.getrusage(...).ru_maxrss``) catches peaks between samples. The reported peak
is the larger of the two. Memory page-locked in place (``cudaHostRegister``: DOS's optimizer state) is resident
and counts; buffers the CUDA driver allocates page-locked (``cudaHostAlloc``, torch's ``pin_memory()``: DeepSpeed's
pinned gradient buffers, in every offload strategy) are not in the resident set and do not. GPU: the caching
allocator's peaks, ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``, over the whole process; with a
:class:`GpuPeakMeter` also per phase (it resets the allocator's peaks at every phase boundary and keeps the
process's across the resets).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from types import TracebackType

import psutil
import torch

from lightning_dos.planning.placement import GIB


def ru_maxrss_bytes() -> int:
    """The kernel's peak resident set size of this process (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class HostMemorySampler:
    """Samples this process's RSS in the background; use as a context manager around the measured work.

    Args:
        interval_s: seconds between samples.
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_sampled_bytes = 0
        self._process = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss-sampler", daemon=True)

    def _sample(self) -> None:
        try:
            rss = self._process.memory_info().rss
        except psutil.Error:
            return
        self.peak_sampled_bytes = max(self.peak_sampled_bytes, int(rss))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> HostMemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.interval_s + 1.0)
        self._sample()

    def summary(self) -> dict[str, float]:
        """Peaks in GiB: ``peak_host_gib`` (the larger), ``peak_host_rss_sampled_gib`` and ``ru_maxrss_gib``."""
        maxrss = ru_maxrss_bytes()
        return {
            "peak_host_gib": max(self.peak_sampled_bytes, maxrss) / GIB,
            "peak_host_rss_sampled_gib": self.peak_sampled_bytes / GIB,
            "ru_maxrss_gib": maxrss / GIB,
        }


class GpuPeakMeter:
    """The peak allocated GPU memory between consecutive :meth:`take` calls, and the process's peaks across them.

    Each :meth:`take` reads the caching allocator's peaks since the last one and resets them, so a caller that takes
    at every phase boundary learns which phase reached which peak; :meth:`process_peaks` is then what
    :func:`gpu_peaks` would have said without the resets. Inert (``take`` gives None) until bound to a GPU.

    Args:
        read: ``read()`` gives (peak allocated, peak reserved) bytes since the last reset; ``reset()`` resets them.
            Both default to ``torch.cuda``'s for the device :meth:`bind` is given (given here: tests).
    """

    def __init__(self, read: Callable[[], tuple[int, int]] | None = None,
                 reset: Callable[[], None] | None = None) -> None:
        self._read, self._reset = read, reset
        self.allocated = 0  # the process's peaks, across every reset
        self.reserved = 0

    def bind(self, device: torch.device) -> None:
        """Measure ``device`` (a no-op off a GPU, or with ``read`` given)."""
        if self._read is None and device.type == "cuda":
            self._read = lambda: (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
            self._reset = lambda: torch.cuda.reset_peak_memory_stats(device)

    @property
    def active(self) -> bool:
        return self._read is not None

    def take(self) -> int | None:
        """Peak allocated bytes since the last ``take`` (or since the process began), then reset; None if inert."""
        if self._read is None:
            return None
        allocated, reserved = self._read()
        self.allocated, self.reserved = max(self.allocated, allocated), max(self.reserved, reserved)
        if self._reset is not None:
            self._reset()
        return int(allocated)

    def process_peaks(self) -> dict[str, float | None]:
        """``gpu_peaks``'s fields over the whole process so far (None for both if inert)."""
        if self.take() is None:
            return {"peak_gpu_gib": None, "peak_gpu_reserved_gib": None}
        return {"peak_gpu_gib": self.allocated / GIB, "peak_gpu_reserved_gib": self.reserved / GIB}


def gpu_peaks(device: torch.device) -> dict[str, float | None]:
    """Peak allocated and reserved GPU memory in GiB, or None for both off a GPU."""
    if device.type != "cuda":
        return {"peak_gpu_gib": None, "peak_gpu_reserved_gib": None}
    return {
        "peak_gpu_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "peak_gpu_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
    }
