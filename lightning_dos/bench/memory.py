"""Owns peak-memory measurement inside a worker: host RSS (sampled + the kernel's high-water mark) and GPU peaks.

Host: a daemon thread samples this process's resident set size with psutil every ``interval_s``; the kernel's
own high-water mark (``resource.getrusage(...).ru_maxrss``) catches peaks between samples. The reported peak
is the larger of the two. Memory page-locked in place (``cudaHostRegister``: DOS's optimizer state) is resident
and counts; buffers the CUDA driver allocates page-locked (``cudaHostAlloc``, torch's ``pin_memory()``: DeepSpeed's
pinned gradient buffers, in every offload strategy) are not in the resident set and do not. GPU: the caching
allocator's peaks, ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``, over the whole process.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from types import TracebackType

import psutil
import torch

GIB = 1024**3


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


def gpu_peaks(device: torch.device) -> dict[str, float | None]:
    """Peak allocated and reserved GPU memory in GiB, or None for both off a GPU."""
    if device.type != "cuda":
        return {"peak_gpu_gib": None, "peak_gpu_reserved_gib": None}
    return {
        "peak_gpu_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "peak_gpu_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
    }
