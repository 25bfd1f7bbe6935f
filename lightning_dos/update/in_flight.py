"""Owns one update phase in flight (``overlap=True``): the worker that runs it and the gates its readers wait at.

The executor issues the phase from the training loop's thread and a worker thread (:class:`Worker`, one per executor,
kept between phases) runs it; meanwhile the next forward and backward run. Per subgroup ``i`` the phase keeps:

- ``issued[i]`` (a ``threading.Event``), set once the worker has issued the last write of the subgroup's 16-bit
  params, and ``written[i]``, the device event of that write (on a host standing in for the device, an event that
  is complete when recorded);
- ``grad_free[i]``, set once nothing of the update reads the subgroup's host gradient any more (CPU Adam and the
  unscale are done with it, or the device lane's prefetch of it is issued), and ``grad_read[i]``, the device event
  after which that prefetch has read it.

A reader waits on the host until the work is *issued* and then makes its stream wait on the device for its
*completion* (a stream wait on an event not yet recorded would be a silent no-op): :meth:`InFlightUpdate.wait_params`
for kernels and gathers that read the 16-bit params, :meth:`InFlightUpdate.wait_grads` for the backward's copies into
the host gradient. :meth:`InFlightUpdate.join` waits for the worker and every device event, and returns what the
executor measured.

A failure on the worker sets every event, so no reader blocks forever, and is raised, once, in the training loop's
thread: by the first gate that meets it, else by the join. No DeepSpeed import here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any


class InFlightUpdate:
    """One update phase running on a worker thread, with per-subgroup gates (see the module docstring).

    Args:
        subgroups: how many subgroups the optimizer has.
        device_wait: ``device_wait(stream, event)`` makes ``stream`` wait for ``event`` on the device (a no-op on a
            host standing in for the device, or for a ``None`` event).
    """

    def __init__(self, subgroups: int, device_wait: Callable[[Any, Any], None]) -> None:
        self.issued = [threading.Event() for _ in range(subgroups)]
        self.written: list[Any] = [None] * subgroups
        self.grad_free = [threading.Event() for _ in range(subgroups)]
        self.grad_read: list[Any] = [None] * subgroups
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.worker_end = 0.0  # time.perf_counter() when the worker had issued everything
        self._device_wait = device_wait
        self._finish: Callable[[], Any] = _nothing
        self._raised = False
        self._joined = False
        self._result: Any = None

    # ------------------------------------------------------------------ the worker's side
    def start(self, pool: Executor, work: Callable[[], None], finish: Callable[[], Any]) -> None:
        """Run ``work`` on ``pool``'s thread; ``finish`` runs in :meth:`join` once the worker is done (it waits for
        the device and returns the phase's measurements)."""
        self._finish = finish
        pool.submit(self._run, work)

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - handed to the training loop's thread, raised there
            self.fail(error)
        finally:
            self.finished.set()

    def wrote(self, i: int, event: Any) -> None:
        """The worker issued subgroup ``i``'s last 16-bit write (``event`` completes with it)."""
        self.written[i] = event
        self.issued[i].set()

    def read_grad(self, i: int, event: Any = None) -> None:
        """Nothing issued after this reads subgroup ``i``'s host gradient; what did is done once ``event`` is."""
        self.grad_read[i] = event
        self.grad_free[i].set()

    def fail(self, error: BaseException) -> None:
        """Record the worker's failure and release every reader."""
        if self.error is None:
            self.error = error
        for event in (*self.issued, *self.grad_free):
            event.set()

    # ------------------------------------------------------------------ the readers' side
    def wait_params(self, ids: Iterable[int], streams: Sequence[Any] = ()) -> None:
        """Before reading the 16-bit params of subgroups ``ids``: wait until their writes are issued, then make each
        of ``streams`` wait for the writes."""
        for i in ids:
            self.issued[i].wait()
            self._raise_failure()
            for stream in streams:
                self._device_wait(stream, self.written[i])

    def wait_grads(self, ids: Iterable[int], stream: Any = None) -> None:
        """Before writing the host gradients of subgroups ``ids`` (on ``stream``): wait until the update no longer
        reads them."""
        for i in ids:
            self.grad_free[i].wait()
            self._raise_failure()
            if stream is not None:
                self._device_wait(stream, self.grad_read[i])

    def join(self) -> Any:
        """Wait for the worker and for every device event of the phase; return what ``finish`` measured (None
        after a failure). The worker's exception is raised here unless a gate raised it already."""
        if self._joined:
            return self._result
        self.finished.wait()
        self._joined = True
        finish, self._finish = self._finish, _nothing  # drops the closure: no cycle keeps the phase's buffers alive
        if self.error is not None:
            self._raise_failure()
            return None
        self._result = finish()
        return self._result

    def _raise_failure(self) -> None:
        if self.error is not None and not self._raised:
            self._raised = True
            raise self.error


class Worker:
    """The one thread that runs issued update phases (started on first use, kept until :meth:`close`)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, phase: InFlightUpdate, work: Callable[[], None], finish: Callable[[], Any]) -> None:
        """Run ``phase``'s ``work`` on the thread (see :meth:`InFlightUpdate.start`)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dos-update")
        phase.start(self._pool, work, finish)

    def close(self) -> None:
        """Stop the thread (after the phase it runs, if any)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _nothing() -> None:
    return None
