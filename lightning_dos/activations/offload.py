"""Owns the saved-tensor hooks of activation offload: what moves, deduplication by storage, ordering and prefetch.

:class:`ActivationOffload` installs autograd's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``)
around a step's forward pass. Each tensor saved for backward is either kept on the device or moved out:

- kept: parameters and anything that is a view or a cast of one; odd tensors (not strided, a tensor subclass, on
  another device, conjugate/negative views); storages smaller than ``min_tensor_bytes``; everything saved in the last
  ``keep_last_layers`` blocks and after the last block (the "tail": head and loss, which backward needs first);
- moved: the whole storage of any other tensor, copied on the offload lane into a pooled host buffer (``"host"``),
  and from there written to a file (``"nvme"``). A second save of the same storage (a tensor saved by two
  operations, two views of one output) moves nothing more: it shares the first save's entry.

In backward, the first unpack of a tensor of layer ``L`` issues the restores of every moved tensor of layers
``L - prefetch_layers`` to ``L`` not yet issued, highest layer first and, within a layer, last saved first; unpacking
an entry that is not restored yet issues it at once (counted as a late restore). Every transfer waits for the one
it depends on by an event: the offload for the save-time event of the producing stream, a file write for the
offload, a read for its write (same I/O thread), a restore for the offload or the read, and the consumer's stream
for the restore. A moved tensor is rebuilt over the restored bytes with its dtype, size, stride and storage offset,
so it is bit-identical, views included.

Autograd checks that a saved tensor was not modified in place only without hooks; the hooks check it instead, for
kept tensors always and for moved ones while the saved tensor still exists.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any, Optional, Union

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from lightning_dos.activations.layers import LayerTracker, as_layers
from lightning_dos.activations.options import (
    DEFAULT_KEEP_LAST_LAYERS,
    DEFAULT_KEYS,
    DEFAULT_MIN_TENSOR_BYTES,
    DEFAULT_PREFETCH_LAYERS,
    MIN_FREE_DISK_BYTES,
    OptionKeys,
    validate_options,
)
from lightning_dos.activations.pool import HostBuffer, HostBufferPool
from lightning_dos.activations.stats import Decision, StepStats
from lightning_dos.activations.store import DEFAULT_IO_THREADS, NVMeStore
from lightning_dos.activations.streams import CopyLanes, Event
from lightning_dos.blocks import BlockTypes, block_override_problems, no_blocks_message

__all__ = ["ActivationOffload"]

#: Host memory the NVMe placement may hold in buffers waiting for their write; the forward pass waits beyond it.
DEFAULT_MAX_INFLIGHT_WRITE_BYTES = 2 << 30

# autograd nodes that alias or cast their single input: a tensor reached through them from a parameter is that
# parameter (a transposed weight saved by a matmul, a weight cast by autocast)
_ALIAS_NODES = ("TBackward", "TransposeBackward", "PermuteBackward", "ViewBackward", "UnsafeViewBackward",
                "ReshapeAliasBackward", "ExpandBackward", "AliasBackward", "SliceBackward", "SelectBackward",
                "SqueezeBackward", "UnsqueezeBackward", "AsStridedBackward", "ToCopyBackward", "UnbindBackward",
                "SplitBackward", "ChunkBackward", "NarrowBackward", "DetachBackward")


class _Entry:
    """One storage saved for backward this step (shared by every save of it)."""

    __slots__ = ("key", "pass_id", "layer", "nbytes", "kept", "storage_ref", "storage_ptr", "version", "refs",
                 "host", "offloaded", "restore", "device")

    def __init__(self, key: int, pass_id: int, layer: int, nbytes: int, kept: bool, storage: Any,
                 version: int) -> None:
        self.key = key
        self.pass_id = pass_id
        self.layer = layer
        self.nbytes = nbytes
        self.kept = kept
        self.storage_ref = StorageWeakRef(storage)
        self.storage_ptr = storage.data_ptr()
        self.version = version
        self.refs = 0
        self.host: Optional[HostBuffer] = None  # "host": the buffer holding the bytes until released
        self.offloaded: Optional[Event] = None  # the device->host copy
        self.restore: Union[Event, cf.Future, None] = None  # the host->device copy (NVMe: a future of it)
        self.device: Optional[torch.Tensor] = None  # the restored bytes


class _Saved:
    """What autograd holds for one saved tensor: the tensor itself (kept) or how to rebuild it over its entry."""

    __slots__ = ("owner", "entry", "alias", "version", "tensor_ref", "dtype", "size", "stride", "offset",
                 "pass_id", "layer")

    def __init__(self, owner: ActivationOffload, entry: Optional[_Entry], alias: Optional[torch.Tensor],
                 tensor: torch.Tensor, pass_id: int, layer: int) -> None:
        self.owner = owner
        self.entry = entry
        self.alias = alias  # kept: a detached alias (no grad_fn, so no reference cycle through the graph)
        self.version = tensor._version
        self.pass_id, self.layer = pass_id, layer
        if alias is None:
            self.tensor_ref = weakref.ref(tensor)
            self.dtype, self.size, self.stride = tensor.dtype, tensor.size(), tensor.stride()
            self.offset = tensor.storage_offset()
        if entry is not None:
            entry.refs += 1

    def __del__(self) -> None:
        if self.entry is not None:
            try:
                self.owner._drop(self.entry)
            except Exception:  # noqa: BLE001  (interpreter shutdown: nothing left to release into)
                pass


class ActivationOffload:
    """Moves the activations autograd saves for backward off the device, and brings them back in time.

    Use one instance for a whole run: ``with offload:`` around each step's forward and backward (or
    :meth:`begin_step`/:meth:`end_step`), :meth:`metrics` after it, :meth:`close` at the end::

        offload = ActivationOffload("host", layers=model)          # finds the GPT blocks in model
        for x, y in batches:
            with offload:
                loss = loss_fn(model(x), y)
                loss.backward()
            log(offload.metrics())
        offload.close()

    Args:
        placement: ``"host"`` (pinned host memory), ``"nvme"`` (files under ``nvme_path``) or ``"keep"`` (nothing
            moves; the hooks only measure, for comparisons).
        nvme_path: an existing, writable directory on a local disk, for ``"nvme"`` only.
        min_tensor_bytes: storages smaller than this stay on the device.
        keep_last_layers: the last this-many blocks keep their activations on the device (what is saved after the
            last block always stays).
        prefetch_layers: blocks restored ahead of the one backward is in.
        layers: the model (its blocks are found: :mod:`lightning_dos.blocks`), or the blocks in forward order (a
            list, a ``ModuleList``, a ``Sequential`` or a ``ModuleDict``); may be given later with :meth:`attach`.
        layer_types: block classes (or class names) to find in ``layers``; default: the children of the model's largest
            ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` of one block class.
        device: the device activations are moved off; default: the current CUDA device, else the CPU (the host then
            stands in for the device: same buffers, copies and ordering, on worker threads).
        io_threads: NVMe I/O threads.
        max_inflight_write_bytes: host bytes of NVMe writes in flight before the forward pass waits for them.
        record_decisions: keep a :class:`~lightning_dos.activations.stats.Decision` per save of the last step in
            :attr:`decisions` (for tests and debugging).
    """

    def __init__(
        self,
        placement: str = "host",
        nvme_path: Optional[Union[str, os.PathLike]] = None,
        min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES,
        keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS,
        *,
        prefetch_layers: int = DEFAULT_PREFETCH_LAYERS,
        layers: Optional[Union[nn.Module, Iterable[nn.Module]]] = None,
        layer_types: BlockTypes = None,
        device: Optional[Union[str, torch.device]] = None,
        io_threads: int = DEFAULT_IO_THREADS,
        max_inflight_write_bytes: int = DEFAULT_MAX_INFLIGHT_WRITE_BYTES,
        record_decisions: bool = False,
        keys: OptionKeys = DEFAULT_KEYS,
        min_free_disk_bytes: Optional[int] = None,
    ) -> None:
        self.nvme_dir, self._direct = validate_options(
            placement, nvme_path, min_tensor_bytes, keep_last_layers, prefetch_layers, keys=keys,
            min_free_bytes=min_free_disk_bytes)
        self.placement = placement
        self.min_tensor_bytes = int(min_tensor_bytes)
        self.keep_last_layers = int(keep_last_layers)
        self.prefetch_layers = int(prefetch_layers)
        problems = block_override_problems(None, layer_types)
        if problems:
            raise ValueError("activation offload: " + "; ".join(problems))
        self.layer_types = tuple(layer_types) if layer_types else None
        self.device = _resolve_device(device)
        self.io_threads = io_threads
        self.max_inflight_write_bytes = max_inflight_write_bytes
        self.record_decisions = record_decisions
        self._keys = keys
        self._reserve = MIN_FREE_DISK_BYTES if min_free_disk_bytes is None else min_free_disk_bytes
        self._tracker: Optional[LayerTracker] = None
        self._lanes: Optional[CopyLanes] = None
        self._pool: Optional[HostBufferPool] = None
        self.store: Optional[NVMeStore] = None
        self._lock = threading.RLock()
        self._hooks: Any = None
        self._by_storage: dict[int, _Entry] = {}
        self._pending: dict[int, dict[int, list[_Entry]]] = {}  # pass -> layer -> moved entries not yet restored
        self._next_key = 0
        self._live = 0
        self._resident = 0
        self._param_ptrs: set[int] = set()
        self._params_of: list[nn.Module] = []  # whose parameters and buffers never move
        self._step = StepStats()
        self._last: Optional[StepStats] = None
        self.total = StepStats()
        """Counters summed over every step so far."""
        self.steps = 0
        self.decisions: list[Decision] = []
        if layers is not None:
            self.attach(layers)

    # ------------------------------------------------------------------ lifetime
    def attach(self, layers: Union[nn.Module, Iterable[nn.Module]], root: Optional[nn.Module] = None
               ) -> ActivationOffload:
        """Take the model (its blocks are found) or its blocks; the block hooks go on at the next step. ``root``: the
        model the given blocks belong to (its parameters, like the blocks', never move)."""
        found = as_layers(layers, self.layer_types)
        if not found:
            raise ValueError(no_blocks_message(layers, self.layer_types))
        if self._tracker is not None:
            self._tracker.remove()
        self._tracker = LayerTracker(found)
        self._params_of = [root] if root is not None else [layers] if isinstance(layers, nn.Module) else list(found)
        return self

    @property
    def n_layers(self) -> int:
        return 0 if self._tracker is None else self._tracker.n_layers

    def open(self) -> ActivationOffload:
        """Start the copy lanes, the host pool and (``"nvme"``) the file store; idempotent."""
        if self._lanes is not None:
            return self
        self._lanes = CopyLanes(self.device)
        self._pool = HostBufferPool(pin=self.device.type == "cuda")
        if self.placement == "nvme":
            assert self.nvme_dir is not None
            self.store = NVMeStore(self.nvme_dir, direct=self._direct, threads=self.io_threads,
                                   reserve_bytes=self._reserve, key=self._keys.nvme_path)
        return self

    def close(self) -> None:
        """Wait for every transfer, remove the activation files and their directory, and free the host pool."""
        if self._hooks is not None:
            self._pop_hooks()
        if self._tracker is not None:
            self._tracker.remove()
        lanes, self._lanes = self._lanes, None
        if lanes is None:
            return
        if self.store is not None:
            self.store.close()
        lanes.synchronize()
        lanes.close()
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> ActivationOffload:
        self.begin_step()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end_step()

    def begin_step(self) -> None:
        """Start a step: the saved-tensor hooks go on (until :meth:`end_step`), counters start from zero."""
        if self._hooks is not None:
            raise RuntimeError("activation offload: begin_step() twice without end_step(); one step at a time")
        if self._tracker is None:
            raise ValueError("activation offload: no layers; pass layers=model (its GPT blocks are found) or "
                             "layers=[blocks in forward order], or call attach() before the first step")
        self.open()
        self._tracker.install()
        self._tracker.new_pass()
        self._param_ptrs = _storage_ptrs(self._params_of)
        self._step = StepStats(device_peak_bytes=self._resident)
        if self.record_decisions:
            self.decisions = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def end_step(self) -> None:
        """End the step (after its backward): the hooks come off and the step's counters become :meth:`metrics`."""
        if self._hooks is None:
            return  # no step open (closed already)
        self._pop_hooks()
        with self._lock:
            # drop the empty per-pass and per-layer lists (what a retained graph still needs stays)
            self._pending = {p: kept for p, layers in self._pending.items()
                             if (kept := {layer: es for layer, es in layers.items() if es})}
            step = self._step
            self._last = step
            self.total.add(step)
            self.steps += 1

    def _pop_hooks(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    # ------------------------------------------------------------------ telemetry
    def metrics(self) -> dict[str, float]:
        """The last finished step's counters as ``act/<name>`` (see :class:`StepStats`), plus the host pool's and
        the disk's footprint: ``act/host_pool_bytes`` (host memory held), ``act/host_peak_bytes`` (most of it in use
        at once), ``act/nvme_peak_bytes`` (most activation bytes on disk at once)."""
        if self._last is None:
            return {}
        out = self._last.as_metrics()
        pool = self._pool
        out["act/host_pool_bytes"] = float(pool.capacity_bytes if pool else 0)
        out["act/host_peak_bytes"] = float(pool.peak_in_use_bytes if pool else 0)
        out["act/nvme_peak_bytes"] = float(self.store.peak_bytes_on_disk if self.store else 0)
        return out

    @property
    def live_entries(self) -> int:
        """Storages saved for a backward that has not released them yet (0 after a finished step)."""
        return self._live

    # ------------------------------------------------------------------ pack
    def _pack(self, tensor: torch.Tensor) -> _Saved:
        with self._lock:
            assert self._tracker is not None
            pass_id, layer = self._tracker.position()
            step = self._step
            step.saved_tensors += 1
            reason = self._fixed_keep_reason(tensor)
            if reason is not None:
                step.kept_tensors += 1
                setattr(step, f"kept_{reason}", getattr(step, f"kept_{reason}") + 1)
                self._record(pass_id, layer, _nbytes(tensor), "keep", reason, tensor)
                return _Saved(self, None, tensor.detach(), tensor, pass_id, layer)
            storage = tensor.untyped_storage()
            nbytes = storage.nbytes()
            entry = self._by_storage.get(storage.data_ptr())
            if entry is not None and _same_storage(entry, storage, tensor):
                step.dedup_hits += 1
                self._record(pass_id, layer, nbytes, "dedup", "", tensor)
                if not entry.kept and (pass_id, layer) > (entry.pass_id, entry.layer):
                    self._move_pending(entry, pass_id, layer)  # restored for the later (first needed) save
            else:
                entry = self._new_entry(tensor, storage, nbytes, pass_id, layer)
            alias = tensor.detach() if entry.kept else None
            return _Saved(self, entry, alias, tensor, pass_id, layer)

    def _fixed_keep_reason(self, tensor: torch.Tensor) -> Optional[str]:
        """Why ``tensor`` stays whatever its size and layer: it is a parameter, or not a plain dense tensor here."""
        if isinstance(tensor, nn.Parameter):
            return "parameter"
        if (type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.device != self.device
                or tensor.is_conj() or tensor.is_neg() or tensor.is_quantized or tensor.is_nested):
            return "not_dense"  # a byte copy of its storage could not rebuild it (or it is not on the device)
        if _is_parameter(tensor, self._param_ptrs):
            return "parameter"
        return None

    def _new_entry(self, tensor: torch.Tensor, storage: Any, nbytes: int, pass_id: int, layer: int) -> _Entry:
        step = self._step
        assert self._tracker is not None
        n = self._tracker.n_layers
        reason = None
        if nbytes == 0 or nbytes < self.min_tensor_bytes:
            reason = "small"
        elif self.placement == "keep":
            reason = "placement"
        elif layer >= n:
            reason = "tail"
        elif layer >= n - self.keep_last_layers:
            reason = "last_layers"
        entry = _Entry(self._next_key, pass_id, layer, nbytes, reason is not None, storage, tensor._version)
        self._next_key += 1
        self._live += 1
        if nbytes:
            self._by_storage[entry.storage_ptr] = entry
        if reason is not None:
            step.kept_tensors += 1
            step.kept_bytes += nbytes
            setattr(step, f"kept_{reason}", getattr(step, f"kept_{reason}") + 1)
            self._record(pass_id, layer, nbytes, "keep", reason, tensor)
            self._hold(nbytes)
            return entry
        step.offloaded_tensors += 1
        step.offloaded_bytes += nbytes
        self._record(pass_id, layer, nbytes, "offload", "", tensor)
        self._offload(entry, storage)
        self._pending.setdefault(pass_id, {}).setdefault(layer, []).append(entry)
        return entry

    def _offload(self, entry: _Entry, storage: Any) -> None:
        assert self._lanes is not None and self._pool is not None
        src = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
        buffer = self._pool.acquire(entry.nbytes)
        entry.offloaded = self._lanes.offload(src, buffer.view(entry.nbytes))
        if self.store is None:
            entry.host = buffer
            return
        self._throttle_writes()
        pool = self._pool
        self.store.write(entry.key, buffer, entry.nbytes, after=entry.offloaded, then=lambda: pool.release(buffer))
        self._step.nvme_written_bytes += entry.nbytes

    def _throttle_writes(self) -> None:
        """Wait for the oldest NVMe writes while more than ``max_inflight_write_bytes`` of them hold host buffers."""
        assert self.store is not None
        start = time.perf_counter()
        while self.store.pending_write_bytes > self.max_inflight_write_bytes:
            oldest = self.store.oldest_write()
            if oldest is None:
                break
            oldest.result()
        self._step.write_wait_s += time.perf_counter() - start

    def _move_pending(self, entry: _Entry, pass_id: int, layer: int) -> None:
        pending = self._pending.get(entry.pass_id, {}).get(entry.layer)
        if entry.restore is None and pending is not None and entry in pending:
            pending.remove(entry)
            self._pending.setdefault(pass_id, {}).setdefault(layer, []).append(entry)
        entry.pass_id, entry.layer = pass_id, layer

    def _record(self, pass_id: int, layer: int, nbytes: int, action: str, reason: str, tensor: torch.Tensor) -> None:
        if self.record_decisions:
            try:
                ptr = tensor.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
                ptr = 0
            self.decisions.append(Decision(pass_id, layer, nbytes, action, reason, ptr))

    def _hold(self, nbytes: int) -> None:
        self._resident += nbytes
        self._step.device_peak_bytes = max(self._step.device_peak_bytes, self._resident)

    # ------------------------------------------------------------------ unpack
    def _unpack(self, saved: _Saved) -> torch.Tensor:
        with self._lock:
            if self._tracker is not None:
                self._tracker.backward_started()
            self._prefetch(saved.pass_id, saved.layer)
        if saved.alias is not None:
            _check_version(saved.alias._version, saved.version)
            return saved.alias
        tensor = saved.tensor_ref()
        if tensor is not None:
            _check_version(tensor._version, saved.version)
        entry = saved.entry
        assert entry is not None
        data = self._restored(entry)
        return torch.empty(0, dtype=saved.dtype, device=self.device).set_(
            data.untyped_storage(), saved.offset, saved.size, saved.stride)

    def _prefetch(self, pass_id: int, layer: int) -> None:
        """Issue the restores of layers ``layer - prefetch_layers`` to ``layer`` of this pass: highest layer first,
        last saved first."""
        pending = self._pending.get(pass_id)
        if not pending:
            return
        floor = layer - self.prefetch_layers
        for index in sorted((i for i in pending if i >= floor), reverse=True):
            for entry in reversed(pending.pop(index)):
                if entry.restore is None:
                    self._issue_restore(entry)

    def _issue_restore(self, entry: _Entry) -> None:
        lanes, pool = self._lanes, self._pool
        assert lanes is not None and pool is not None
        device = lanes.allocate(entry.nbytes)
        if self.store is None:
            assert entry.host is not None and entry.offloaded is not None
            entry.restore = lanes.restore(entry.host.view(entry.nbytes), device, after=[entry.offloaded])
        else:
            buffer = pool.acquire(entry.nbytes)
            nbytes = entry.nbytes

            def then() -> Event:  # on the I/O thread, once the bytes are in the buffer
                event = lanes.restore(buffer.view(nbytes), device)
                pool.release(buffer, after=event)
                return event

            entry.restore = self.store.read(entry.key, buffer, nbytes, then)
            self._step.nvme_read_bytes += nbytes
        entry.device = device
        self._step.restored_tensors += 1
        self._step.restored_bytes += entry.nbytes
        self._hold(entry.nbytes)

    def _restored(self, entry: _Entry) -> torch.Tensor:
        """The restored bytes of ``entry``, once the current stream may read them."""
        with self._lock:
            if entry.restore is None:
                self._step.late_restores += 1
                self._issue_restore(entry)
            restore, device = entry.restore, entry.device
        assert self._lanes is not None and device is not None
        start = time.perf_counter()
        event = restore.result() if isinstance(restore, cf.Future) else restore
        self._lanes.consume(event, device)
        with self._lock:
            self._step.restore_wait_s += time.perf_counter() - start
        return device

    # ------------------------------------------------------------------ release
    def _drop(self, entry: _Entry) -> None:
        """One save of ``entry`` was released by autograd; the last one releases the entry."""
        with self._lock:
            entry.refs -= 1
            if entry.refs > 0:
                return
            self._live -= 1
            if self._by_storage.get(entry.storage_ptr) is entry:
                del self._by_storage[entry.storage_ptr]
            if entry.kept:
                self._resident -= entry.nbytes
                return
            if entry.restore is None:
                pending = self._pending.get(entry.pass_id, {}).get(entry.layer)
                if pending is not None and entry in pending:
                    pending.remove(entry)
            if entry.device is not None:
                self._resident -= entry.nbytes
                entry.device = None
            if self.store is not None:
                self.store.remove(entry.key)  # after its read, on the same I/O thread
            elif entry.host is not None and self._pool is not None:
                after = entry.restore if entry.restore is not None else entry.offloaded
                self._pool.release(entry.host, after=after)
                entry.host = None


def _resolve_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _nbytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return tensor.numel() * tensor.element_size()


def _storage_ptrs(modules: Iterable[nn.Module]) -> set[int]:
    """Storage addresses of the parameters and buffers of ``modules`` (empty ZeRO-3 partitions left out)."""
    ptrs = set()
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.layout == torch.strided:
                ptr = tensor.untyped_storage().data_ptr()
                if ptr:
                    ptrs.add(ptr)
    return ptrs


def _is_parameter(tensor: torch.Tensor, param_ptrs: set[int]) -> bool:
    """Whether dense ``tensor`` is a view of a parameter, shares a parameter's (or buffer's) storage, or is an alias
    or cast of one (a parameter itself was caught before)."""
    if isinstance(tensor._base, nn.Parameter) or tensor.untyped_storage().data_ptr() in param_ptrs:
        return True
    node = tensor.grad_fn
    for _ in range(4):
        if node is None:
            return False
        name = type(node).__name__
        if name == "AccumulateGrad":
            return isinstance(node.variable, nn.Parameter)
        if not name.startswith(_ALIAS_NODES):
            return False
        inputs = [next_node for next_node, _ in node.next_functions if next_node is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def _same_storage(entry: _Entry, storage: Any, tensor: torch.Tensor) -> bool:
    """Whether a save of ``storage`` is a save of ``entry``'s storage, unchanged since (not a new storage at a freed
    one's address, not written in place in between)."""
    return (not entry.storage_ref.expired() and entry.nbytes == storage.nbytes()
            and entry.version == tensor._version)


def _check_version(now: int, saved: int) -> None:
    if now != saved:
        raise RuntimeError(
            "activation offload: a tensor saved for backward was modified in place after it was saved (version "
            f"{saved} when saved, {now} now), so backward would compute with the wrong values; autograd's own "
            "check is off under saved-tensor hooks and this one stands in for it. Make that operation out of place "
            "(x = x + y rather than x += y), or clone the tensor before modifying it.")
