"""Owns every touch of DeepSpeed ZeRO-3 private internals (written against deepspeed 0.19.x).

``InterleavedZeroOptimizer`` is a thin subclass of ``DeepSpeedZeroOptimizer_Stage3``:

- it keeps the fp32 master partitions and both Adam moments in host memory page-locked in place (no
  rounding up by the pinned allocator), the moments created up front *in DeepSpeed's own optimizer state
  dict*, so both lanes read and write one copy and DeepSpeed's checkpoint code saves all of it (vanilla
  creates the moments lazily, pageable);
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


class InterleavedZeroOptimizer(_VanillaStage3):
    """ZeRO-3 optimizer whose update phase is delegated to an attached runner (see module docstring)."""

    update_phase: UpdatePhase | None = None
    #: subgroups whose gradients stay on the device through the next backward (set by the manager)
    device_grad_subgroups: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ pinned, single-home state
    def _create_fp32_partitions(self) -> None:
        super()._create_fp32_partitions()
        if not self._dos_supported():
            return
        registry = self._pinned_registry()
        for master in self.fp32_partitioned_groups_flat:  # one home: DeepSpeed's own tensor, locked in place
            exp_avg = torch.zeros(master.numel(), dtype=torch.float32)
            exp_avg_sq = torch.zeros(master.numel(), dtype=torch.float32)
            self.optimizer.state[master] = {"step": 0, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
            if registry is not None:
                for tensor in (master, exp_avg, exp_avg_sq):
                    registry.pin(tensor)

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

    # ------------------------------------------------------------------ gradients during backward
    def _device_grads(self) -> dict[int, torch.Tensor]:
        if "_dos_device_grads" not in self.__dict__:
            self._dos_device_grads: dict[int, torch.Tensor] = {}
        return self._dos_device_grads

    def partition_grads(self, params_to_release: list, grad_partitions: list) -> Any:
        """At an update boundary without accumulation, move each gradient partition once, asynchronously.

        Vanilla (0.19.8) copies every partition device->host in the accumulation dtype, back host->device, then
        device->host again in fp32. Here a partition becomes fp32 on the device once: a host-lane subgroup's goes
        straight to its pinned fp32 buffer (non-blocking), a device-lane subgroup's stays on the device. Same
        values, same per-parameter norms. With gradient accumulation vanilla's path runs unchanged.
        """
        if not (self._dos_supported() and self.is_gradient_accumulation_boundary() and self.micro_step_id == 0):
            return super().partition_grads(params_to_release, grad_partitions)
        device_grads = self._device_grads()
        for param, grad_partition in zip(params_to_release, grad_partitions):
            if not param.partition_numel() * self._get_param_partition_rank(param) < param.ds_numel:
                param.grad = None  # this rank's partition of the param is empty
                continue
            self._offload_boundary_param_ids.add(param.ds_id)
            param_id = self.get_param_id(param)
            i, offset, _ = self.grad_position[param_id]
            grad = grad_partition.to(self.gradient_accumulation_dtype)
            self.norm_for_param_grads[param_id] = self._constant_buffered_norm2(grad)
            grad32 = grad.to(self.master_weights_and_grads_dtype)
            if i in self.device_grad_subgroups:
                if i not in device_grads:
                    device_grads[i] = torch.empty(
                        self.fp16_partitioned_groups_flat_numel[i], dtype=self.master_weights_and_grads_dtype,
                        device=grad.device,
                    )
                device_grads[i].narrow(0, offset, grad32.numel()).copy_(grad32)
            else:
                host = self.fp32_partitioned_groups_flat[i].grad.narrow(0, offset, grad32.numel())
                host.copy_(grad32, non_blocking=True)
            if not get_accelerator().is_synchronized_device() and param.grad is not None:
                param.grad.record_stream(get_accelerator().current_stream())
            param.grad = None
        return None

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
        return [
            (self.optimizer.state[m]["exp_avg"], self.optimizer.state[m]["exp_avg_sq"])
            for m in self.fp32_partitioned_groups_flat
        ]

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


@contextlib.contextmanager
def interleaved_zero3_optimizer() -> Iterator[None]:
    """Within this context, ``deepspeed.initialize`` builds :class:`InterleavedZeroOptimizer` for ZeRO-3."""
    _stage3.DeepSpeedZeroOptimizer_Stage3 = InterleavedZeroOptimizer
    try:
        yield
    finally:
        _stage3.DeepSpeedZeroOptimizer_Stage3 = _VanillaStage3
