"""Owns every touch of DeepSpeed ZeRO-3 private internals (written against deepspeed 0.19.x).

``InterleavedZeroOptimizer`` is a thin subclass of ``DeepSpeedZeroOptimizer_Stage3``:

- each subgroup's fp32 master, both Adam moments and the gradient its update reads live in one home, the device
  (resident) or page-locked host memory, in DeepSpeed's own lists and optimizer state dict, allocated only once the
  home is chosen (:mod:`lightning_dos.zero.homes`), so both lanes read and write one copy and DeepSpeed's checkpoint
  code saves all of it; DeepSpeed's whole-partition host gradient buffers are made only under gradient accumulation,
  which reads them;
- its ``step`` is vanilla's preamble (overflow check, global grad norm, loss scale) followed by one call
  to the update phase of the runner given to ``attach`` (the manager; ``UpdateRunner`` says what the seam reads of it)
  instead of the sequential per-subgroup loop; in the preamble the subgroups' norms
  are reduced together, and persistent parameters that are their own partition (one rank) are not released;
- ``subgroups()`` exposes each subgroup as a plain :class:`~lightning_dos.update.subgroup.Subgroup`;
- with a runner that overlaps (``overlap=True``) its ``step`` returns once the update phase is issued to a worker
  thread (:mod:`lightning_dos.update.in_flight`), and it gates every reader of what the phase writes: ZeRO-3's parameter
  coordinator waits, per module, for the subgroups holding the module's params before it fetches them (forward,
  backward, recompute, prefetches), the backward's copies into the host gradients wait until the update is done
  with them, and everything else that reads optimizer state (checkpoints, ``safe_get_*``) joins the phase first.
  The host lane then runs CPU Adam through the GIL-free op (:mod:`lightning_dos.zero.cpu_adam_nogil`) with the
  hyperparameters read when the step was issued: Lightning steps the LR scheduler before the next forward;
- every reader and writer of the optimizer state (checkpoints, ``safe_get_*``/``safe_set_*``) first joins the phase
  in flight and has the homes placed, so it reads and writes the state where it lives.

Everything below this module (executor, manager, planner) sees only plain objects.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.comm import pg_utils
from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace
from deepspeed.runtime.zero import stage3 as _stage3
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
from deepspeed.utils import z3_leaf_module

from lightning_dos.planning.placement import Home
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.update.subgroup import AdamHyper, Subgroup
from lightning_dos.zero.homes import StateHomes

_VanillaStage3 = _stage3.DeepSpeedZeroOptimizer_Stage3



class UpdateRunner(Protocol):
    """What the seam asks of the owner of the update phase (the optimizer-state manager), attached by one call,
    ``InterleavedZeroOptimizer.attach``; the seam reads these, and never writes them."""

    #: the update phase may run beside the next forward (the seam then gates the forward's reads)
    overlap: bool
    #: subgroups whose gradients stay on the device through the next backward
    device_grad_subgroups: frozenset[int]

    def choose_homes(self, measured: bool = True) -> Sequence[Home]:
        """Each subgroup's home, decided now if it is not yet (the seam places the state there); ``measured``: a
        backward has run, so the device's peak shows the training's own memory."""

    @property
    def phase_in_flight(self) -> InFlightUpdate | None:
        """The update phase issued and not yet joined (overlap), or None."""

    def run_update_phase(self, optimizer: InterleavedZeroOptimizer, host_step: Callable[[int], None],
                         inv_scale: torch.Tensor) -> None:
        """Run one update phase of every subgroup (with overlap: issue it; ``phase_in_flight`` then holds it)."""

    def join(self) -> None:
        """Wait for the phase in flight, if any, and record it."""

#: The coordinator's name-mangled gather of a module's params (prefetches go through it too).
_GATHER = "_PartitionedParameterCoordinator__all_gather_params"
_ALLGATHER_STREAM = "_PartitionedParameterCoordinator__allgather_stream"
#: The coordinator's name-mangled gathers in flight and its release of one param (``release_and_reset_all``'s parts).
_INFLIGHT = "_PartitionedParameterCoordinator__inflight_param_registry"
_RELEASE = "_PartitionedParameterCoordinator__release_param"
#: Vanilla's name-mangled map of each parameter to its view of the whole-partition gradient buffer.
_GRAD_PARTITIONS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"
#: One gradient partition of a reduce bucket: (param id, subgroup, offset in the subgroup, 1-D gradient).
_GradPartition = tuple[int, int, int, torch.Tensor]
#: Vanilla's ``_constant_buffered_norm2`` sums larger partitions chunk by chunk; those keep its code.
_NORM_CHUNK = 250_000_000
#: Elements of one fp32 staging tensor for host-lane gradients (256 MB on the device).
_HOST_STAGING_NUMEL = 1 << 26
#: Reduce buckets the backward may queue before the host waits for the oldest (DeepSpeed's ``max_param_reduce_events``,
#: 2 in vanilla). Host-lane gradients are copied to the host on the reduce stream; with 2 buckets queued the host
#: thread, which launches the backward's kernels, waited for those copies. Measured on a GPU host (gpt-2.7b, plan
#: 0.5, docs/optimizer-state-manager.md): backward 500-852 ms with 2, 499-515 ms with 64. A deeper queue holds more
#: not-yet-reduced 16-bit gradients on the device during backward, never more than the model's gradients.
REDUCE_EVENTS = 64
#: ``torch._foreach_norm`` with ``dtype=`` and without the wrong-norm bug of torch 2.5 (pytorch#140066).
_FUSED_NORM = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 6)


class InterleavedZeroOptimizer(StateHomes, _VanillaStage3):
    """ZeRO-3 optimizer whose update phase is delegated to an attached runner (see module docstring)."""

    #: the owner of the update phase (``attach``); without one, the step is DeepSpeed's own
    runner: UpdateRunner | None = None
    #: persistent parameters partitioned over several ranks stay whole through the step and are refreshed by one
    #: gather per subgroup (``_refresh_whole_params``) instead of DeepSpeed's release and per-parameter gathers
    flat_persistent_gather: bool = True
    #: parameters the last step refreshed so (telemetry and tests)
    refreshed_params: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.interleaved_supported():  # host-lane gradient copies ride the reduce stream: backward runs ahead
            self.max_param_reduce_events = max(self.max_param_reduce_events, REDUCE_EVENTS)
        config = kwargs.get("ds_config")
        zero = config.get("zero_optimization", {}) if isinstance(config, dict) else {}
        self._dos_allgather_sequential = bool(zero.get("stage3_allgather_sequential",
                                                       zero.get("allgather_sequential", False)))
        self._dos_host_adam: Any = None
        self._dos_first_reads: dict[int, None] = {}  # subgroups in the order the first forward reads them (overlap)
        self._dos_first_reads_done = False

    # ------------------------------------------------------------------ the runner
    def attach(self, runner: UpdateRunner) -> None:
        """Hand every update phase to ``runner`` (and, with its ``overlap``, gate the forward's reads of what a phase
        in flight writes). Call once, before the first step."""
        self.runner = runner
        if runner.overlap:
            self._enable_overlap()

    @property
    def device_grad_subgroups(self) -> frozenset[int]:
        """Subgroups whose gradients stay on the device through the next backward (the runner's choice)."""
        return self.runner.device_grad_subgroups if self.runner is not None else frozenset()

    @property
    def in_flight(self) -> InFlightUpdate | None:
        """The update phase in flight (overlap), or None."""
        return self.runner.phase_in_flight if self.runner is not None else None

    # ------------------------------------------------------------------ homes: nothing before placement
    def _setup_for_real_optimizer(self) -> None:
        """Vanilla's set-up without its host state: the fp32 partitions are placeholders until placed
        (:mod:`lightning_dos.zero.homes`), no per-subgroup host gradient is made before then, and the whole-partition
        gradient buffer only under gradient accumulation (at a boundary without it, ``partition_grads`` sends each
        gradient partition once, straight to where its update reads it)."""
        if not self.interleaved_supported():
            return super()._setup_for_real_optimizer()
        self._create_placeholders()
        dist.barrier()
        if self.contiguous_gradients:
            for dtype, bucket in self.ipg_buckets.items():
                bucket.buffer = torch.empty(self.reduce_bucket_size, dtype=dtype,
                                            device=get_accelerator().current_device_name())
        params = list(itertools.chain.from_iterable(self.fp16_groups))
        numel = sum(p.partition_numel() for p in params) if self.gradient_accumulation_steps > 1 else 0
        flat = torch.zeros(numel, dtype=self.gradient_accumulation_dtype, device=self.device)
        registry = self._pinned_registry()
        if registry is not None and flat.device.type == "cpu":
            registry.pin(flat)
        self.grad_partitions_flat_buffer = flat
        views, offset = {}, 0
        if numel:
            for param in params:
                views[param.ds_id] = flat.narrow(0, offset, param.partition_numel())
                offset += param.partition_numel()
        setattr(self, _GRAD_PARTITIONS, views)

    def ensure_placed(self) -> None:
        """Place every subgroup's state in its home, if that is not done yet: where the runner says (it decides now
        if it has not), or on the host without one."""
        if not self.interleaved_supported() or self.placed:
            return
        measured = bool(self.__dict__.get("_dos_backward_seen"))
        homes = (self.runner.choose_homes(measured) if self.runner is not None
                 else (Home.HOST,) * len(self.fp16_groups))
        self.place(homes)

    def host_gradient_bytes(self) -> int:
        """Host bytes of DeepSpeed's whole-partition gradient buffer (made only under gradient accumulation)."""
        flat = getattr(self, "grad_partitions_flat_buffer", None)
        return flat.numel() * flat.element_size() if flat is not None and flat.device.type == "cpu" else 0

    def interleaved_supported(self) -> bool:
        """Whether this configuration is one the interleaved update handles (else vanilla runs)."""
        return (
            self.offload_optimizer
            and not self.swap_optimizer
            and not getattr(self, "use_muon", False)
            and not getattr(self, "zenflow", False)
            and getattr(self, "torch_autocast_gradscaler", None) is None
            and self.partial_offload == 1.0
            and type(self.optimizer).__name__ == "DeepSpeedCPUAdam"
        )

    # ------------------------------------------------------------------ plain view for the layers below
    def subgroups(self) -> list[Subgroup]:
        """Every subgroup of this rank's partition, with the current hyperparameters of its param group."""
        out = []
        for i, master in enumerate(self.fp32_partitioned_groups_flat):
            group = self.optimizer.param_groups[self.sub_group_to_group_id[i]]
            if not group.get("bias_correction", True):
                raise ValueError(
                    "bias_correction: the device lane implements Adam with bias correction only; "
                    "set bias_correction=True or plan='host'"
                )
            state = self.optimizer.state[master]
            device_grad = self._device_grads().get(i)
            out.append(
                Subgroup(
                    index=i,
                    numel=master.numel(),
                    master=master,
                    exp_avg=state["exp_avg"],
                    exp_avg_sq=state["exp_avg_sq"],
                    state=state,
                    grad=self.update_grad(i) if device_grad is None else device_grad,
                    grad_on_device=device_grad is not None,
                    param16=self.fp16_partitioned_groups_flat[i],
                    hyper=self._hyper(group),
                )
            )
        return out

    def _hyper(self, group: dict[str, Any]) -> AdamHyper:
        """The current hyperparameters of a param group."""
        beta1, beta2 = group["betas"]
        return AdamHyper(
            lr=float(group["lr"]),
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            adamw=bool(getattr(self.optimizer, "adam_w_mode", True)),
        )

    def subgroup_sizes(self) -> list[int]:
        return [int(n) for n in self.fp16_partitioned_groups_flat_numel]

    def device_grad_bytes_per_param(self) -> int:
        """Bytes per parameter of a gradient kept on the device through backward: the partitions' own dtype
        (DeepSpeed's gradient accumulation dtype, the model's 16-bit dtype unless ``data_types.grad_accum_dtype``
        says otherwise); the device lane widens it to fp32 in its buffer slot when the update phase reads it."""
        return self.gradient_accumulation_dtype.itemsize

    # ------------------------------------------------------------------ gradients during backward
    def _device_grads(self) -> dict[int, torch.Tensor]:
        if "_dos_device_grads" not in self.__dict__:
            self._dos_device_grads: dict[int, torch.Tensor] = {}
        return self._dos_device_grads

    def partition_grads(self, params_to_release: list, grad_partitions: list) -> Any:
        """At an update boundary without accumulation, move each gradient partition once, asynchronously.

        Vanilla (0.19.8) copies every partition device->host in the accumulation dtype, back host->device, then
        device->host again in fp32, and takes each partition's norm with four kernels and an fp64 copy. Here, per
        reduce bucket: one fused fp64 norm over all its partitions; device-lane partitions are converted to fp32
        straight into their subgroup's device buffer; host-lane partitions are converted into one device staging
        tensor laid out in host-buffer order and sent with one non-blocking copy per run of adjacent destinations.
        Same gradient values; the same per-parameter norms up to fp64 summation order. With gradient accumulation
        vanilla's path runs unchanged.
        """
        self._dos_backward_seen = True
        if not (self.interleaved_supported() and self.is_gradient_accumulation_boundary() and self.micro_step_id == 0):
            return super().partition_grads(params_to_release, grad_partitions)
        # the params of one bucket share a partition group (DeepSpeed asserts it): one rank lookup per bucket
        rank = self._get_param_partition_rank(params_to_release[0]) if params_to_release else 0
        kept: list[_GradPartition] = []
        for param, grad_partition in zip(params_to_release, grad_partitions):
            if not param.partition_numel() * rank < param.ds_numel:
                continue  # this rank's partition of the param is empty
            self._offload_boundary_param_ids.add(param.ds_id)
            param_id = self.get_param_id(param)
            i, offset, _ = self.grad_position[param_id]
            grad = grad_partition.to(self.gradient_accumulation_dtype).reshape(-1)
            kept.append((param_id, i, offset, grad))
        if kept:
            self._record_grad_norms(kept)
            self._place_device_grads([g for g in kept if g[1] in self.device_grad_subgroups])
            self._send_host_grads([g for g in kept if g[1] not in self.device_grad_subgroups])
        stream = None if get_accelerator().is_synchronized_device() else get_accelerator().current_stream()
        for param in params_to_release:
            if stream is not None and param.grad is not None:
                param.grad.record_stream(stream)
            param.grad = None
        return None

    def _record_grad_norms(self, kept: list[_GradPartition]) -> None:
        """Each partition's L2 norm in fp64 (vanilla's ``_constant_buffered_norm2``), one fused reduction per bucket."""
        grads = [grad for *_, grad in kept]
        if _FUSED_NORM and len({g.device for g in grads}) == 1 and all(0 < g.numel() <= _NORM_CHUNK for g in grads):
            norms = torch._foreach_norm(grads, 2.0, dtype=_stage3.get_norm_dtype())
        else:  # torch < 2.6, or a partition vanilla would norm in chunks: vanilla's own per-tensor code
            norms = [self._constant_buffered_norm2(g) for g in grads]
        for (param_id, *_), norm in zip(kept, norms):
            self.norm_for_param_grads[param_id] = norm

    def _place_device_grads(self, kept: list[_GradPartition]) -> None:
        """Device-lane partitions: copied in their own dtype (16-bit unless gradients accumulate in fp32) into the
        subgroup's device gradient, half the memory of an fp32 copy; the values are the ones vanilla widens to
        fp32 on its way to the host, and the device lane widens them exactly so."""
        if not kept:
            return
        device_grads = self._device_grads()
        dsts = []
        for _, i, offset, grad in kept:
            if i not in device_grads:
                device_grads[i] = torch.empty(
                    self.fp16_partitioned_groups_flat_numel[i], dtype=grad.dtype, device=grad.device,
                )
            dsts.append(device_grads[i].narrow(0, offset, grad.numel()))
        torch._foreach_copy_(dsts, [grad for *_, grad in kept])

    def _send_host_grads(self, kept: list[_GradPartition]) -> None:
        """Host-lane partitions: into a device staging tensor in destination order (in the host gradient's dtype: the
        backward's own, 16 bits in bf16 or fp16 training), one async copy per run."""
        if not kept:
            return
        self._wait_grads({i for _, i, _, _ in kept})
        dtype = self.host_grad_dtype()
        for batch in _batches(sorted(kept, key=lambda g: (g[1], g[2])), _HOST_STAGING_NUMEL):
            staging = torch.empty(sum(g[3].numel() for g in batch), dtype=dtype, device=batch[0][3].device)
            views, pos = [], 0
            for *_, grad in batch:
                views.append(staging.narrow(0, pos, grad.numel()))
                pos += grad.numel()
            torch._foreach_copy_(views, [grad for *_, grad in batch])
            pos = 0
            for i, offset, numel in _runs(batch):
                host = self.update_grad(i).narrow(0, offset, numel)
                host.copy_(staging.narrow(0, pos, numel), non_blocking=True)  # pinned: the host does not wait
                pos += numel

    def _offload_grad_partition_at_boundary(self, param: Any, *args: Any, **kwargs: Any) -> Any:
        """Vanilla's boundary copy into the fp32 gradient (gradient accumulation), once the update is done with it. The
        homes must exist by then: the first boundary places them (its forwards and backwards have shown the peak)."""
        self.ensure_placed()
        self._wait_grads((self.grad_position[self.get_param_id(param)][0],))
        return super()._offload_grad_partition_at_boundary(param, *args, **kwargs)

    def _wait_grads(self, ids: Any) -> None:
        """Before the backward writes the host gradients of subgroups ``ids``: wait until the phase in flight, if
        any, no longer reads them (on the current stream: the reduce stream, where the copies go)."""
        phase = self.in_flight
        if phase is not None:
            phase.wait_grads(sorted(ids), stream=self._current_stream())

    def grads_to_host(self, sub_group_ids: Any) -> None:
        """Bring the device-kept gradients of ``sub_group_ids`` (host lane, demoted) to the host buffers now, on the
        calling thread (the worker of an overlapped phase must make no blocking copy). Each is widened on the device
        and sent with a non-blocking copy; the host waits once per ``_HOST_STAGING_NUMEL`` elements in flight."""
        in_flight: list[torch.Tensor] = []
        numel = 0
        for i in sub_group_ids:
            staging = self._grad_to_host(i, wait=False)
            if staging is None:
                continue
            in_flight.append(staging)
            numel += staging.numel()
            if numel >= _HOST_STAGING_NUMEL:
                get_accelerator().current_stream().synchronize()
                in_flight.clear()
                numel = 0
        if in_flight:
            get_accelerator().current_stream().synchronize()

    def _grad_to_host(self, sub_group_id: int, wait: bool = True) -> torch.Tensor | None:
        """A subgroup planned for the device lane was demoted: bring its device gradient to the host buffer.

        The gradient is converted to the host gradient's dtype on the device first, if they differ (fp32 under
        gradient accumulation: widening is exact); a copy across devices and dtypes at once would convert on the
        host, one slow pass over the whole gradient. With ``wait=False`` and a page-locked host buffer the copy is
        left in flight on the current stream and the source tensor returned: keep it until the stream is
        synchronised."""
        device_grad = self._device_grads().pop(sub_group_id, None)
        if device_grad is None:
            return None
        host = self.update_grad(sub_group_id)
        if device_grad.device == host.device:
            host.copy_(device_grad)
            return None
        widened = device_grad.to(host.dtype)
        asynchronous = not wait and host.is_pinned()
        host.copy_(widened, non_blocking=asynchronous)
        return widened if asynchronous else None

    # ------------------------------------------------------------------ the step's preamble
    def _release_for_step(self) -> None:
        """Release the parameters before the update, except those whose data *is* their partition.

        Vanilla's step releases every parameter (``_partition_all_parameters``) and ``_post_step`` gathers the
        persistent ones again. A persistent parameter partitioned over one rank, with its partition on the device, is
        a view of that partition (the gather at world size 1 makes a view, no copy): the update writes it in place,
        so releasing it frees nothing and gathering it back restores the same view. Vanilla still pays both for every
        such parameter at every step (a ``record_stream`` and an allocation per release; a wait for the current
        stream in the gather). Those parameters stay whole here, and ``_post_step``'s gather, which only gathers
        released ones, skips them. Every other parameter is released as vanilla releases it. Checkpoint saves and
        loads keep vanilla's release of every parameter (``checkpoint_event_prologue``).
        """
        module = self.parameter_offload.module
        sizes: dict[int, int] = {}
        whole = {p.ds_id for p in self.persistent_parameters if self._is_own_partition(p, sizes)}
        self._dos_refresh = self._refreshable_params()
        whole |= {p.ds_id for params in self._dos_refresh.values() for p in params}
        if not whole:
            return self._partition_all_parameters()
        coordinator = self._get_param_coordinator()
        inflight = getattr(coordinator, _INFLIGHT)
        release = getattr(coordinator, _RELEASE)
        for param in iter_params(module, recurse=True):
            if param in inflight:
                inflight.pop(param).wait()
            param.ds_active_sub_modules.clear()
            if param.ds_id not in whole:
                release(param)
        for param in iter_params(module, recurse=True):
            if param.ds_id not in whole and param.ds_status != ZeroParamStatus.NOT_AVAILABLE:
                raise RuntimeError(f"{param.ds_summary()} expected to be released")

    def _is_own_partition(self, param: Any, world_sizes: dict[int, int]) -> bool:
        """Whether ``param`` is available as a view of its own partition (world size 1, partition on the device).
        ``world_sizes`` caches each partition group's size by the group's id."""
        part = param.ds_tensor
        if param.ds_status != ZeroParamStatus.AVAILABLE or part is None:
            return False
        group = self._get_param_partition_group(param)
        if id(group) not in world_sizes:
            world_sizes[id(group)] = dist.get_world_size(group=group)
        data = param.data
        return (world_sizes[id(group)] == 1 and data.device == part.device and data.numel() == param.ds_numel
                and data.data_ptr() == part.data_ptr())

    def _refreshable_params(self) -> dict[int, list[Any]]:
        """Persistent parameters partitioned over several ranks that stay whole through the step, by subgroup id: each
        available at its whole size on the device of its subgroup's 16-bit partition, in one partition group with
        every other (so one gather per subgroup serves them all). Empty without ``flat_persistent_gather``, at world
        size 1 (own partitions stay whole already), with parameter offload, or with several partition groups."""
        if not (self.flat_persistent_gather and getattr(self, "partition_count", 1) > 1 and self.persistent_parameters
                and not getattr(self, "offload_param", False)):
            return {}
        groups = {id(self._get_param_partition_group(p)) for group in self.fp16_groups for p in group}
        if len(groups) != 1:
            return {}
        persistent = {p.ds_id for p in self.persistent_parameters}
        out: dict[int, list[Any]] = {}
        for i, group in enumerate(self.fp16_groups):
            flat = self.fp16_partitioned_groups_flat[i]
            for param in group:
                if (param.ds_id in persistent and param.ds_status == ZeroParamStatus.AVAILABLE
                        and param.data.numel() == param.ds_numel and param.data.device == flat.device
                        and param.data.dtype == flat.dtype and param.data.is_contiguous()):
                    out.setdefault(i, []).append(param)
        return out

    @torch.no_grad()
    def _refresh_whole_params(self, phase: InFlightUpdate | None) -> None:
        """After the update: the whole persistent parameters kept through the step (``_release_for_step``) get their
        subgroup's new 16-bit partitions from every rank, one all-gather of the subgroup's flat partition each, then
        one or two strided copies per parameter, all on the current stream (no host synchronisation). DeepSpeed's
        ``_post_step`` would gather each parameter on its own (389 at gpt-2.7b) and then synchronise the device.
        With the update in flight, each subgroup's gather waits, on the stream, for that subgroup's update. The same
        values bit for bit: rank ``r``'s partition of a parameter is its elements ``[r * part, (r + 1) * part)``."""
        refresh = self.__dict__.get("_dos_refresh") or {}
        self.refreshed_params = sum(len(params) for params in refresh.values())
        if not refresh:
            return
        first = next(iter(refresh.values()))[0]
        group = self._get_param_partition_group(first)
        world = dist.get_world_size(group=group)
        reads = self._read_streams(current_only=True)
        largest = max(self.fp16_partitioned_groups_flat[i].numel() for i in refresh)
        flat0 = self.fp16_partitioned_groups_flat[next(iter(refresh))]
        buffer = torch.empty(world * largest, dtype=flat0.dtype, device=flat0.device)
        for i in sorted(refresh):
            flat = self.fp16_partitioned_groups_flat[i]
            if phase is not None:
                phase.wait_params([i], reads)
            n = flat.numel()
            gathered = buffer.narrow(0, 0, world * n)
            dist.all_gather_into_tensor(gathered, flat, group=group)
            rows = gathered.view(world, n)
            for param in refresh[i]:
                part = param.ds_tensor.ds_numel
                offset = (param.ds_tensor.data_ptr() - flat.data_ptr()) // flat.element_size()
                dst = param.data.view(-1)
                full = param.ds_numel // part
                if full:
                    dst.narrow(0, 0, full * part).view(full, part).copy_(rows[:full, offset:offset + part])
                rest = param.ds_numel - full * part
                if rest:
                    dst.narrow(0, full * part, rest).copy_(rows[full, offset:offset + rest])
        self._dos_refresh = {}

    def _get_norm_groups(self) -> list[torch.Tensor]:
        """Each subgroup's gradient norm, as vanilla's ``complete_grad_norm_calculation_for_cpu_offload`` computes
        it, with one reduction for all subgroups.

        Vanilla, per subgroup: a square and an add per parameter, a wait for the device (``float``), an upload, an
        all-reduce, a root, a mask and a copy to the host (a second wait): at gpt-2.7b 27 all-reduces, 54 waits and
        over 800 small kernels on a GPU host, before any update starts. Here: the per-parameter norms (fp64) squared in
        one kernel, summed per subgroup, rounded to fp32 as vanilla's ``float`` -> ``FloatTensor`` rounds them,
        all-reduced together over the one partition group (a sum, as vanilla's, element by element), rooted and
        masked together, one copy to the host. The same values up to the fp64 summation order within a subgroup.
        Configurations where vanilla's reduction differs per subgroup (model parallel, AutoEP experts, several
        partition groups) or a norm is not on the device keep vanilla's code.
        """
        if not self.interleaved_supported():
            return super()._get_norm_groups()
        groups = self.fp16_groups
        process_group = self._get_param_partition_group(groups[0][0]) if groups and groups[0] else None
        if (process_group is None or pg_utils.is_parallel(self.model_parallel_group)
                or any(not params or self._autoep_expert_parallel_group(params) is not None
                       or any(self._get_param_partition_group(p) is not process_group for p in params)
                       for params in groups)):
            return super()._get_norm_groups()
        norms: list[torch.Tensor] = []
        counts: list[int] = []
        for params in groups:
            found = [self.norm_for_param_grads.get(self.get_param_id(p)) for p in params]
            found = [n for n in found if n is not None]
            norms.extend(found)
            counts.append(len(found))
        device = torch.device(get_accelerator().current_device_name())
        if any(not torch.is_tensor(n) or n.dim() != 0 or n.device != device for n in norms) \
                or len({n.dtype for n in norms}) > 1:
            return super()._get_norm_groups()
        if norms:
            squares = torch.stack(norms) ** 2  # an empty split sums to 0, vanilla's value for a group without grads
            total = torch.stack([part.sum() for part in torch.split(squares, counts)]).to(torch.float32)
        else:
            total = torch.zeros(len(groups), dtype=torch.float32, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
        total = total ** (1.0 / 2.0)
        mask_nan_or_inf_with_val_inplace(total, device=total.device)
        return list(total.cpu().unbind())

    # ------------------------------------------------------------------ the step
    def step(self, closure: Any = None) -> None:
        if self.runner is None or not self.interleaved_supported():
            return super().step(closure)
        try:
            self._interleaved_step()
        finally:
            self._device_grads().clear()  # device gradients live from backward to the end of the update only

    def _interleaved_step(self) -> None:
        self.wait_for_update()  # a phase still in flight (no dispatch joined it): done before its state is read
        # --- vanilla's preamble (deepspeed 0.19.8 stage3.step), with the release and the norms above
        self._pre_step()
        self._release_for_step()
        self._overflow_check_and_loss_scale_update(update_scale=False)
        scaled_global_grad_norm = None
        if not self.overflow:
            norm_groups = self._get_norm_groups()
            scaled_global_grad_norm = _stage3.combine_grad_norm_groups(norm_groups)
            if _stage3.is_invalid_grad_norm(scaled_global_grad_norm):
                self.overflow = True
        if self._loss_scale_update_and_overflow_cleanup():
            return
        self._global_grad_norm = scaled_global_grad_norm / self.loss_scale

        timer_names = {_stage3.OPTIMIZER_STEP_TIMER}
        self.timers(_stage3.OPTIMIZER_STEP_TIMER).start()

        inv_scale = self._inverse_combined_scale(scaled_global_grad_norm)
        self.ensure_placed()
        host_step = self._host_lane_step(float(inv_scale), bring_grads=not self.runner.overlap)
        self.runner.run_update_phase(self, host_step, inv_scale)
        # a user's LR scheduler wraps the client optimizer's step to note that it ran (torch warns at the scheduler's
        # first step otherwise); the update phase steps no client optimizer, so note it as that wrapper would
        self.optimizer._opt_called = True
        for sub_group_id in range(len(self.fp16_groups)):
            self._unflatten_partitioned_parameters(sub_group_id)  # views only: nothing is read
        phase = self.in_flight
        refreshed = set(self.__dict__.get("_dos_refresh") or ())
        self._refresh_whole_params(phase)
        if phase is not None and self._persistent_gather_reads():  # what DeepSpeed's gather still reads
            waits = [i for i in self._persistent_subgroups() if i not in refreshed]
            if waits:
                phase.wait_params(waits, self._read_streams(current_only=True))

        self.timers(_stage3.OPTIMIZER_STEP_TIMER).stop()
        self._post_step(timer_names)

    def _host_lane_step(self, grad_scale: float, bring_grads: bool) -> Callable[[int], None]:
        """The host lane's step for one subgroup: vanilla's unscale/clip and ``DeepSpeedCPUAdam`` in one pass (the
        host-lane op multiplies the gradient by ``grad_scale``, vanilla's ``1 / combined_scale``, as it reads it:
        the same values as vanilla's ``unscale_and_clip_grads`` followed by CPU Adam, bit for bit).

        Each param group's hyperparameters and state are read now, on this thread: with ``overlap`` the step runs on
        a worker while the scheduler changes the lr before the next forward. ``bring_grads``: a demoted subgroup's
        gradient is brought to the host first (without overlap; with it the manager has brought them already, since
        the worker must make no blocking copy)."""
        groups = self.optimizer.param_groups
        hypers = [self._hyper(group) for group in groups]
        bias_correction = [bool(group.get("bias_correction", True)) for group in groups]
        states = [self.optimizer.state[master] for master in self.fp32_partitioned_groups_flat]
        adam = self._host_adam()

        def host_step(sub_group_id: int) -> None:
            if bring_grads:
                self._grad_to_host(sub_group_id)
            gid = self.sub_group_to_group_id[sub_group_id]
            adam.step(states[sub_group_id], self.fp32_partitioned_groups_flat[sub_group_id],
                      self.update_grad(sub_group_id), hypers[gid], bias_correction[gid], grad_scale=grad_scale)

        return host_step

    def _host_adam(self) -> Any:
        """The host lane's CPU Adam (one instance for the whole run: see ``cpu_adam_nogil``), made on first use."""
        if self._dos_host_adam is None:
            from lightning_dos.zero.cpu_adam_nogil import HostAdam

            self._dos_host_adam = HostAdam(self.optimizer.defaults,
                                           bool(getattr(self.optimizer, "adam_w_mode", True)))
        return self._dos_host_adam

    # ------------------------------------------------------------------ overlap: gates and joins
    def _enable_overlap(self) -> None:
        """Let ``step`` return with its update phase in flight: gate every reader of what it writes (see the module
        docstring)."""
        self._host_adam()
        self._dos_subgroup_of = {p.ds_id: i for i, group in enumerate(self.fp16_groups) for p in group}
        coordinator = self._get_param_coordinator()
        fetch = coordinator.fetch_sub_module
        gather = getattr(coordinator, _GATHER)
        allgather_stream = getattr(coordinator, _ALLGATHER_STREAM, None)

        def gated_fetch(module: torch.nn.Module, forward: bool) -> Any:
            phase = self.in_flight
            noting = forward and not self._dos_first_reads_done
            if not forward:
                self._dos_first_reads_done = True  # the first backward: the forward's order is known
            if phase is not None or noting:  # the module's kernels and any gather of its params read its subgroups
                ids = self._subgroups_of(iter_params(module, recurse=z3_leaf_module(module)))
                if noting:
                    self._dos_first_reads.update(dict.fromkeys(ids))  # a dict keeps each id's first insertion
                if phase is not None:
                    phase.wait_params(ids, self._read_streams(allgather_stream))
            return fetch(module, forward=forward)

        def gated_gather(params: Any, forward: bool) -> Any:
            phase = self.in_flight
            if phase is not None:  # prefetches read later modules' partitions before those modules' fetch
                phase.wait_params(self._subgroups_of(params), self._read_streams(allgather_stream))
            return gather(params, forward)

        coordinator.fetch_sub_module = gated_fetch
        setattr(coordinator, _GATHER, gated_gather)

    def forward_order(self) -> tuple[int, ...]:
        """Subgroup ids in the order the forward first reads them (recorded by the gates during the first forward,
        with ``overlap``; empty before it, or without overlap)."""
        return tuple(self._dos_first_reads)

    def wait_for_update(self) -> None:
        """Join the update phase in flight, if any (its writes are then complete, its timings recorded)."""
        if self.in_flight is not None:
            self.runner.join()

    def _subgroups_of(self, params: Any) -> list[int]:
        """The subgroups holding ``params`` (frozen params are in none: nothing updates them)."""
        owner = self._dos_subgroup_of
        return sorted({owner[p.ds_id] for p in params if p.ds_id in owner})

    def _persistent_subgroups(self) -> list[int]:
        return self._subgroups_of(self.persistent_parameters)

    def _persistent_gather_reads(self) -> bool:
        """Whether ``_post_step``'s gather of the persistent params reads their partitions. At world size 1 the
        coalesced gather only makes each param a view of its partition; the sequential one (a single persistent
        param, or ``stage3_allgather_sequential``) copies, as does any real gather across ranks."""
        params = self.persistent_parameters
        if not params:
            return False
        return self._dos_allgather_sequential or len(params) == 1 or getattr(self, "partition_count", 1) > 1

    def _current_stream(self) -> Any:
        return None if get_accelerator().is_synchronized_device() else get_accelerator().current_stream()

    def _read_streams(self, allgather_stream: Any = None, current_only: bool = False) -> tuple[Any, ...]:
        """The streams that read the 16-bit params next: the current one (kernels), and the coordinator's gathers."""
        if get_accelerator().is_synchronized_device():
            return ()
        current = get_accelerator().current_stream()
        if current_only or allgather_stream is None or allgather_stream is current:
            return (current,)
        return (current, allgather_stream)

    def _inverse_combined_scale(self, total_norm: Any) -> torch.Tensor:
        """The factor ``unscale_and_clip_grads`` multiplies every gradient by (same arithmetic, one place)."""
        combined_scale = self.loss_scale
        if self.clip_grad > 0.0:
            clip = ((total_norm / self.loss_scale) + 1e-6) / self.clip_grad
            clip = torch.clamp(clip, min=1.0)
            combined_scale = clip * self.loss_scale
        inv = 1.0 / combined_scale
        return inv if torch.is_tensor(inv) else torch.tensor(inv, dtype=torch.float32)

    # ------------------------------------------------------------------ checkpoints and other readers and writers
    def settle(self) -> None:
        """Before anything reads or writes the optimizer state: the phase in flight joined, every subgroup placed (its
        state then exists where it lives, in DeepSpeed's own tensors, which its readers read)."""
        self.wait_for_update()
        self.ensure_placed()

    def state_dict(self) -> Any:
        self.settle()
        return super().state_dict()

    def get_lean_optimizer_state(self) -> Any:
        self.settle()
        return super().get_lean_optimizer_state()

    def _get_fp32_opt_state_partition(self, *args: Any, **kwargs: Any) -> Any:
        self.settle()
        return super()._get_fp32_opt_state_partition(*args, **kwargs)

    def _get_fp32_grad_state_partition(self, param: Any, release_swap_buffers: bool) -> Any:
        self.settle()
        i, offset, numel = self.grad_position[self.get_param_id(param)]
        grad = self.update_grad(i)
        if grad is not None and grad.dtype != self.master_weights_and_grads_dtype:  # a 16-bit host gradient: widened
            return grad.narrow(0, offset, numel).to(self.master_weights_and_grads_dtype), i
        return super()._get_fp32_grad_state_partition(param, release_swap_buffers)

    def get_fp32_grad_partitions(self) -> Any:
        self.settle()
        if not self.__dict__.get("_dos_host_grads"):  # no 16-bit host gradient (a dict of subgroup ids: 0 is one)
            return super().get_fp32_grad_partitions()
        out: dict[int, dict[int, torch.Tensor]] = collections.defaultdict(dict)
        for group in self.fp16_groups:  # vanilla's dictionary, a 16-bit host gradient widened
            for param_idx, param in enumerate(group):
                grad, i = self._get_fp32_grad_state_partition(param, release_swap_buffers=False)
                out[i][param_idx] = grad
        return out

    def offload_states(self, *args: Any, **kwargs: Any) -> Any:
        self.settle()
        return super().offload_states(*args, **kwargs)

    def reload_states(self, *args: Any, **kwargs: Any) -> Any:
        self.settle()
        return super().reload_states(*args, **kwargs)

    def refresh_fp32_params(self) -> None:
        self.settle()
        super().refresh_fp32_params()

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.wait_for_update()
        return super().load_state_dict(*args, **kwargs)

    def _rigid_load_state_dict(self, state_dict: Any, load_optimizer_states: bool = True) -> Any:
        """A checkpoint of this world size: unplaced subgroups keep the loaded tensors until placement (their
        placeholders take the loaded masters: ``StateHomes._adopt_loaded_masters``); placed ones get the loaded
        values copied into their homes."""
        if not self.interleaved_supported():
            return super()._rigid_load_state_dict(state_dict, load_optimizer_states)
        self._adopt_loaded_masters(state_dict[_stage3.FP32_FLAT_GROUPS])
        homes = self._moment_homes()
        out = super()._rigid_load_state_dict(state_dict, load_optimizer_states)
        self._restore_moment_homes(homes)
        return out

    def load_hp_checkpoint_state_from_checkpoint_dir_stage3(self, *args: Any, **kwargs: Any) -> Any:
        """A universal checkpoint (any world size): DeepSpeed reads it into the state of placed subgroups, so the
        homes are placed first (before the first step, as the runner decides without a measured peak)."""
        self.settle()
        homes = self._moment_homes()
        out = super().load_hp_checkpoint_state_from_checkpoint_dir_stage3(*args, **kwargs)
        self._restore_moment_homes(homes)
        return out

    def load_module_checkpoint_state_from_checkpoint_dir_stage3(self, *args: Any, **kwargs: Any) -> Any:
        self.settle()
        return super().load_module_checkpoint_state_from_checkpoint_dir_stage3(*args, **kwargs)


def _batches(kept: list[_GradPartition], limit: int) -> Iterator[list[_GradPartition]]:
    """Consecutive groups of partitions of at most ``limit`` elements (a larger partition alone)."""
    batch: list[_GradPartition] = []
    size = 0
    for item in kept:
        if batch and size + item[3].numel() > limit:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item[3].numel()
    if batch:
        yield batch


def _runs(batch: list[_GradPartition]) -> list[tuple[int, int, int]]:
    """(subgroup, offset, numel) of each run of partitions whose destinations are adjacent, in batch order."""
    runs: list[list[int]] = []
    for _, i, offset, grad in batch:
        if runs and runs[-1][0] == i and runs[-1][1] + runs[-1][2] == offset:
            runs[-1][2] += grad.numel()
        else:
            runs.append([i, offset, grad.numel()])
    return [(i, offset, numel) for i, offset, numel in runs]


@contextlib.contextmanager
def interleaved_zero3_optimizer() -> Iterator[None]:
    """Within this context, ``deepspeed.initialize`` builds :class:`InterleavedZeroOptimizer` for ZeRO-3."""
    _stage3.DeepSpeedZeroOptimizer_Stage3 = InterleavedZeroOptimizer
    try:
        yield
    finally:
        _stage3.DeepSpeedZeroOptimizer_Stage3 = _VanillaStage3
