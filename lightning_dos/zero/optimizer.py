"""Owns every touch of DeepSpeed ZeRO-3 private internals (written against deepspeed 0.19.x).

``InterleavedZeroOptimizer`` is a thin subclass of ``DeepSpeedZeroOptimizer_Stage3``:

- it keeps the fp32 master partitions and both Adam moments in host memory page-locked in place (no
  rounding up by the pinned allocator), the moments *in DeepSpeed's own optimizer state dict*, created at the
  first update phase as vanilla's CPU Adam creates its own (pageable, there), so both lanes read and write one
  copy and DeepSpeed's checkpoint code saves all of it;
- its ``step`` is vanilla's preamble (overflow check, global grad norm, loss scale) followed by one call
  to the attached update phase instead of the sequential per-subgroup loop;
- ``subgroups()`` exposes each subgroup as a plain :class:`~lightning_dos.subgroup.Subgroup`.

Everything below this module (executor, manager, planner) sees only plain objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero import stage3 as _stage3

from lightning_dos.host_memory import PinnedRegistry
from lightning_dos.subgroup import AdamHyper, Subgroup

_VanillaStage3 = _stage3.DeepSpeedZeroOptimizer_Stage3

#: Called with (optimizer, host_step, inv_scale) to run one update phase of every subgroup.
UpdatePhase = Callable[["InterleavedZeroOptimizer", Callable[[int], None], torch.Tensor], None]
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


class InterleavedZeroOptimizer(_VanillaStage3):
    """ZeRO-3 optimizer whose update phase is delegated to an attached runner (see module docstring)."""

    update_phase: UpdatePhase | None = None
    #: subgroups whose gradients stay on the device through the next backward (set by the manager)
    device_grad_subgroups: frozenset[int] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._dos_supported():  # host-lane gradient copies ride the reduce stream: let backward run ahead of them
            self.max_param_reduce_events = max(self.max_param_reduce_events, REDUCE_EVENTS)

    # ------------------------------------------------------------------ pinned, single-home state
    def _create_fp32_partitions(self) -> None:
        super()._create_fp32_partitions()
        if not self._dos_supported():
            return
        registry = self._pinned_registry()
        if registry is not None:
            for master in self.fp32_partitioned_groups_flat:  # one home: DeepSpeed's own tensor, locked in place
                registry.pin(master)

    def _ensure_state_homes(self) -> None:
        """Give every subgroup its exp_avg / exp_avg_sq home (page-locked in place when pinning) before it is updated.

        The moments are created at the first update phase, where vanilla's CPU Adam creates its own, and not with
        the master weights at start-up, where they would coexist with the engine's start-up transients and raise
        the process's peak host memory. Moments that exist but are not page-locked by this optimizer (loaded from
        a checkpoint before the first step, or created by vanilla's step) are copied into fresh homes, so every
        subgroup's state is locked exactly once and lives in exactly one place.
        """
        registry = self._pinned_registry()
        for master in self.fp32_partitioned_groups_flat:
            state = self.optimizer.state.setdefault(master, {})
            for key in ("exp_avg", "exp_avg_sq"):
                current = state.get(key)
                if _is_home(current, registry):
                    continue
                home = torch.zeros(master.numel(), dtype=torch.float32)
                if current is not None:
                    home.copy_(current.reshape(-1))
                if registry is not None:
                    registry.pin(home)
                state[key] = home
            state.setdefault("step", 0)

    def state_homes_ready(self) -> bool:
        """Whether every subgroup's moments are in their homes (then ``subgroups()`` names the tensors the next
        update phase will use, and its first prefetches may be issued before it)."""
        registry = self._pinned_registry()
        return all(_is_home(self.optimizer.state.get(master, {}).get(key), registry)
                   for master in self.fp32_partitioned_groups_flat for key in ("exp_avg", "exp_avg_sq"))

    def _pinned_registry(self) -> PinnedRegistry | None:
        """Where the state is page-locked in place (None when not pinning, or with no CUDA device)."""
        if not (self.offload_optimizer_pin_memory and torch.cuda.is_available()):
            return None
        if "_dos_pinned" not in self.__dict__:
            self._dos_pinned = PinnedRegistry()
        return self._dos_pinned

    def _dos_supported(self) -> bool:
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
        adamw = bool(getattr(self.optimizer, "adam_w_mode", True))
        out = []
        for i, master in enumerate(self.fp32_partitioned_groups_flat):
            group = self.optimizer.param_groups[self.sub_group_to_group_id[i]]
            if not group.get("bias_correction", True):
                raise ValueError(
                    "bias_correction: the device lane implements Adam with bias correction only; "
                    "set bias_correction=True or plan='host'"
                )
            state = self.optimizer.state[master]
            beta1, beta2 = group["betas"]
            device_grad = self._device_grads().get(i)
            out.append(
                Subgroup(
                    index=i,
                    numel=master.numel(),
                    master=master,
                    exp_avg=state["exp_avg"],
                    exp_avg_sq=state["exp_avg_sq"],
                    state=state,
                    grad=master.grad if device_grad is None else device_grad,
                    grad_on_device=device_grad is not None,
                    param16=self.fp16_partitioned_groups_flat[i],
                    hyper=AdamHyper(
                        lr=float(group["lr"]),
                        beta1=float(beta1),
                        beta2=float(beta2),
                        eps=float(group["eps"]),
                        weight_decay=float(group["weight_decay"]),
                        adamw=adamw,
                    ),
                )
            )
        return out

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
        if not (self._dos_supported() and self.is_gradient_accumulation_boundary() and self.micro_step_id == 0):
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
        """Host-lane partitions: fp32 into a device staging tensor in destination order, one async copy per run."""
        if not kept:
            return
        fp32 = self.master_weights_and_grads_dtype
        for batch in _batches(sorted(kept, key=lambda g: (g[1], g[2])), _HOST_STAGING_NUMEL):
            staging = torch.empty(sum(g[3].numel() for g in batch), dtype=fp32, device=batch[0][3].device)
            views, pos = [], 0
            for *_, grad in batch:
                views.append(staging.narrow(0, pos, grad.numel()))
                pos += grad.numel()
            torch._foreach_copy_(views, [grad for *_, grad in batch])
            pos = 0
            for i, offset, numel in _runs(batch):
                host = self.fp32_partitioned_groups_flat[i].grad.narrow(0, offset, numel)
                host.copy_(staging.narrow(0, pos, numel), non_blocking=True)  # pinned: the host does not wait
                pos += numel

    def _grad_to_host(self, sub_group_id: int) -> None:
        """A subgroup planned for the device lane was demoted: bring its device gradient to the host buffer."""
        device_grad = self._device_grads().pop(sub_group_id, None)
        if device_grad is not None:
            self.fp32_partitioned_groups_flat[sub_group_id].grad.copy_(device_grad)

    # ------------------------------------------------------------------ the step
    def step(self, closure: Any = None) -> None:
        if self.update_phase is None or not self._dos_supported():
            return super().step(closure)
        try:
            self._interleaved_step()
        finally:
            self._device_grads().clear()  # device gradients live from backward to the end of the update only

    def _interleaved_step(self) -> None:
        # --- vanilla's preamble (deepspeed 0.19.8 stage3.step), unchanged
        self._pre_step()
        self._partition_all_parameters()
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
        # x * 1.0 == x exactly: skip a full read-modify-write pass over the host gradients when nothing scales
        unit_scale = float(inv_scale) == 1.0

        def host_step(sub_group_id: int) -> None:
            # vanilla's own per-subgroup code: unscale/clip, then DeepSpeedCPUAdam on the host
            self._grad_to_host(sub_group_id)
            if not unit_scale:
                self.unscale_and_clip_grads(sub_group_id, scaled_global_grad_norm)
            self._optimizer_step(sub_group_id)

        self._ensure_state_homes()
        self.update_phase(self, host_step, inv_scale)
        for sub_group_id in range(len(self.fp16_groups)):
            self._unflatten_partitioned_parameters(sub_group_id)

        self.timers(_stage3.OPTIMIZER_STEP_TIMER).stop()
        self._post_step(timer_names)

    def _inverse_combined_scale(self, total_norm: Any) -> torch.Tensor:
        """The factor ``unscale_and_clip_grads`` multiplies every gradient by (same arithmetic, one place)."""
        combined_scale = self.loss_scale
        if self.clip_grad > 0.0:
            clip = ((total_norm / self.loss_scale) + 1e-6) / self.clip_grad
            clip = torch.clamp(clip, min=1.0)
            combined_scale = clip * self.loss_scale
        inv = 1.0 / combined_scale
        return inv if torch.is_tensor(inv) else torch.tensor(inv, dtype=torch.float32)

    # ------------------------------------------------------------------ checkpoints
    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        homes = self._state_homes()
        out = super().load_state_dict(*args, **kwargs)
        self._restore_homes(homes)
        return out

    def _state_homes(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (exp_avg, exp_avg_sq) tensors each subgroup's state lives in now (before a load replaces them)."""
        if not self._dos_supported():
            return []
        states = [self.optimizer.state.get(m, {}) for m in self.fp32_partitioned_groups_flat]
        if not all("exp_avg" in s and "exp_avg_sq" in s for s in states):
            return []  # no homes yet (before the first step): the first update phase makes them from what is loaded
        return [(s["exp_avg"], s["exp_avg_sq"]) for s in states]

    def _restore_homes(self, homes: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """After a load: copy the loaded moments into their homes, so each subgroup keeps one (pinned) copy.

        torch's ``Optimizer.load_state_dict`` puts the checkpoint's tensors into the state; DeepSpeed copies the
        master weights in place. Copying the moments back keeps master, exp_avg and exp_avg_sq where the device
        lane's copies expect them, page-locked when asked.
        """
        if not homes:
            return
        for master, (exp_avg, exp_avg_sq) in zip(self.fp32_partitioned_groups_flat, homes):
            state = self.optimizer.state.get(master)
            if state is None or "exp_avg" not in state or "exp_avg_sq" not in state:
                raise RuntimeError("optimizer state lost its exp_avg/exp_avg_sq after loading a checkpoint")
            for key, home in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                if state[key] is not home:
                    home.copy_(state[key].reshape(home.shape))
                    state[key] = home


def _is_home(moment: torch.Tensor | None, registry: PinnedRegistry | None) -> bool:
    """Whether ``moment`` exists and is a home of this optimizer (page-locked by it, when it pins)."""
    return moment is not None and (registry is None or registry.holds(moment))


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
