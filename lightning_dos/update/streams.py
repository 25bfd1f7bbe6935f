"""Owns the update phase's streams and events, and copies issued on them in chunks.

On an accelerator the executor has four streams: ``h2d`` (device-lane prefetches and host-lane uploads, served in
issue order), ``adam``, ``flush`` and a high-priority ``convert`` (the uploads' 16-bit writes); every cross-stream
dependency is an event. On a machine without one the host stands in for the device: :class:`Streams` then has no
streams and its events (:class:`HostEvent`) are complete when recorded, so the same code runs in the same order.
No DeepSpeed import here.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

#: Prefetches and flushes are issued in chunks of this many fp32 elements (64 MB), so no single copy command
#: holds a copy engine for long.
COPY_CHUNK = 16 * 1024 * 1024


class HostEvent:
    """Stand-in for a device event when the host is the device: work is done when it is issued."""

    def record(self, stream: Any = None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: HostEvent) -> float:
        return (other.time - self.time) * 1e3


class Streams:
    """The executor's streams on an accelerator, or inert stand-ins on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.h2d = torch.cuda.Stream(device)  # prefetches and host-lane uploads, in issue order
            self.adam = torch.cuda.Stream(device)
            self.flush = torch.cuda.Stream(device)
            # uploads' 16-bit writes: short kernels that free a ring buffer for the link; first call on the SMs
            _, high = torch.cuda.Stream.priority_range()
            self.convert = torch.cuda.Stream(device, priority=high)
        else:
            self.h2d = self.adam = self.flush = self.convert = None

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if self.is_cuda else contextlib.nullcontext()

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing) if self.is_cuda else HostEvent()

    def record(self, stream: Any, timing: bool = False) -> Any:
        event = self.event(timing)
        if self.is_cuda:
            event.record(stream)
        else:
            event.record()
        return event

    def wait(self, stream: Any, event: Any) -> None:
        if self.is_cuda and event is not None:
            stream.wait_event(event)

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.is_cuda else None


def chunked_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src, non_blocking=True)`` in ``COPY_CHUNK``-element pieces (see ``COPY_CHUNK``)."""
    n = src.numel()
    if n <= COPY_CHUNK:
        dst.copy_(src, non_blocking=True)
        return
    for start in range(0, n, COPY_CHUNK):
        length = min(COPY_CHUNK, n - start)
        dst.narrow(0, start, length).copy_(src.narrow(0, start, length), non_blocking=True)
