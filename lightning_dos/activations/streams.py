"""Owns the copy lanes of activation offload: device->host and host->device copies, each ordered by events.

On CUDA each lane is a stream of its own: an offload waits for an event recorded on the producing stream at save
time (the saved tensor may still be being written), and the source storage is marked used by the copy stream
(``record_stream``), so the caching allocator cannot hand it out again before the copy has read it. A restore is
written into memory allocated on the restore stream; the consumer's stream waits for the restore's event before the
tensor is read and marks it used, so it is not freed under the consumer either.

With the host standing in for the device (no accelerator), each lane is a worker thread that runs its copies in
order: the copies really are asynchronous, and every reader really has to wait for the event (a future) of the copy
it reads. :func:`_copy` is the one place a copy happens, so a test can slow it down and check that nothing is read
before it has landed.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Sequence
from typing import Any, Protocol

import torch

__all__ = ["CopyLanes", "CudaEvent", "Event", "FutureEvent"]


class Event(Protocol):
    """Completion of one piece of asynchronous work (a copy, a file read or write)."""

    def done(self) -> bool:
        """Whether the work has completed (never blocks)."""

    def wait_host(self) -> None:
        """Block the calling thread until the work has completed; re-raise its error."""

    def wait_stream(self, stream: Any) -> None:
        """Make ``stream`` (a CUDA stream, or None on the host) wait for the work before anything issued after."""


class FutureEvent:
    """Work running on a thread: done when its future is."""

    def __init__(self, future: cf.Future) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def wait_host(self) -> None:
        self.future.result()

    def wait_stream(self, stream: Any) -> None:
        # a stream cannot wait for a thread: the issuing thread waits before it issues anything after
        self.future.result()


class CudaEvent:
    """Work on a CUDA stream."""

    def __init__(self, stream: Any) -> None:
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def done(self) -> bool:
        return bool(self.event.query())

    def wait_host(self) -> None:
        self.event.synchronize()

    def wait_stream(self, stream: Any) -> None:
        stream.wait_event(self.event)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Every offload and restore byte copy goes through here (tests slow it down to check the ordering)."""
    dst.copy_(src, non_blocking=True)


class CopyLanes:
    """The device->host (offload) and host->device (restore) lanes of one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda:
            self.d2h = torch.cuda.Stream(self.device)
            self.h2d = torch.cuda.Stream(self.device)
            self._threads: list[cf.ThreadPoolExecutor] = []
        else:
            # one thread per lane: copies of a lane complete in the order they were issued, like a stream's
            self._d2h_thread = cf.ThreadPoolExecutor(1, thread_name_prefix="act-d2h")
            self._h2d_thread = cf.ThreadPoolExecutor(1, thread_name_prefix="act-h2d")
            self._threads = [self._d2h_thread, self._h2d_thread]

    def offload(self, src: torch.Tensor, dst: torch.Tensor) -> Event:
        """Copy ``src`` (on the device, being produced on the current stream) into host ``dst``; return its event."""
        if not self.is_cuda:
            # the job holds ``src`` until it has run: there is no allocator to tell that the copy still reads it
            return FutureEvent(self._d2h_thread.submit(_copy, dst, src))
        produced = torch.cuda.current_stream(self.device).record_event()
        self.d2h.wait_event(produced)
        with torch.cuda.stream(self.d2h):
            _copy(dst, src)
            src.record_stream(self.d2h)
            return CudaEvent(self.d2h)

    def allocate(self, nbytes: int) -> torch.Tensor:
        """Device bytes for a restore, owned by the restore lane until :meth:`consume` hands them over."""
        if not self.is_cuda:
            return _allocate(nbytes, self.device)
        with torch.cuda.stream(self.h2d):
            return _allocate(nbytes, self.device)

    def restore(self, src: torch.Tensor, dst: torch.Tensor, after: Sequence[Event] = ()) -> Event:
        """Copy host ``src`` into device ``dst`` once every event in ``after`` has completed; return its event.

        May be called from any thread (the NVMe reader issues restores from its own).
        """
        if not self.is_cuda:
            return FutureEvent(self._h2d_thread.submit(_after_then_copy, list(after), dst, src))
        with torch.cuda.device(self.device), torch.cuda.stream(self.h2d):
            for event in after:
                event.wait_stream(self.h2d)
            _copy(dst, src)
            return CudaEvent(self.h2d)

    def consume(self, event: Event, tensor: torch.Tensor) -> None:
        """Order the current stream after ``event`` before it reads ``tensor`` (on the host: wait for it)."""
        if not self.is_cuda:
            event.wait_host()
            return
        current = torch.cuda.current_stream(self.device)
        event.wait_stream(current)
        tensor.record_stream(current)  # freed later by the restore lane's allocator: not before the consumer is done

    def synchronize(self) -> None:
        """Wait until every copy issued so far has completed."""
        if self.is_cuda:
            self.d2h.synchronize()
            self.h2d.synchronize()
            return
        for thread in self._threads:
            thread.submit(lambda: None).result()

    def close(self) -> None:
        for thread in self._threads:
            thread.shutdown(wait=True)


def _allocate(nbytes: int, device: torch.device) -> torch.Tensor:
    """Uninitialised device bytes (tests poison them, so a read before the restore lands shows)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _after_then_copy(after: list[Event], dst: torch.Tensor, src: torch.Tensor) -> None:
    for event in after:
        event.wait_host()
    _copy(dst, src)

