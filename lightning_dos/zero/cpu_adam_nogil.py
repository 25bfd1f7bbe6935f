"""Owns the host lane's CPU Adam op: DeepSpeed's kernel, bound so that it releases the GIL and applies the step's
gradient factor as it reads the gradient.

- deepspeed 0.19.8 binds ``adam_update`` without releasing the GIL: a thread running CPU Adam freezes every other
  Python thread for the whole call, so an update phase on a worker thread (``overlap``) would stop the next forward's
  host thread. This op compiles DeepSpeed's own ``csrc/adam/cpu_adam_impl.cpp`` (the same kernel, bit for bit) with a
  binding of its own (``csrc/dos_cpu_adam.cpp``) that releases the GIL during the update.
- Vanilla ZeRO-3 first multiplies the whole host gradient by the step's factor (``unscale_and_clip_grads``: the
  loss scale and the clipping), a pass of its own over host memory, then runs CPU Adam. The op scales each tile of
  the gradient into a per-thread buffer as CPU Adam reads it: one pass, the same values bit for bit (one fp32
  multiply either way). The host gradient is left unscaled.

It keeps its own registry of C++ optimizer instances, so one :class:`HostAdam` must serve every host-lane update of
an optimizer from its first step: the instance's running ``beta^t`` then follows the sequence DeepSpeed's instance
would have followed. ``scripts/build_ops.py`` builds it once per run, like DeepSpeed's own ops (same
``TORCH_EXTENSIONS_DIR``).
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

import torch

from lightning_dos.update.subgroup import AdamHyper

#: The op's name: its folder under ``TORCH_EXTENSIONS_DIR``.
OP_NAME = "dos_cpu_adam_nogil"
_SOURCE = Path(__file__).resolve().parent / "csrc" / "dos_cpu_adam.cpp"
_ids = itertools.count()
#: The name each host-lane CPU Adam call carries in torch profiler traces and tables.
PROFILE_NAME = "dos/host_adam"


def _builder() -> Any:
    """A DeepSpeed op builder for this op: the accelerator's CPU Adam builder with this binding as its front end."""
    from deepspeed.accelerator import get_accelerator

    base = get_accelerator().get_op_builder("CPUAdamBuilder")

    class NoGilCPUAdamBuilder(base):  # type: ignore[misc, valid-type]
        NAME = OP_NAME

        def absolute_name(self) -> str:
            return f"lightning_dos.zero.{OP_NAME}_op"

        def sources(self) -> list[str]:
            return [str(_SOURCE)]  # it includes the kernel, DeepSpeed's own csrc/adam/cpu_adam_impl.cpp

        def include_paths(self) -> list[str]:
            return [*super().include_paths(), "csrc/adam"]

    return NoGilCPUAdamBuilder()


def load_op(verbose: bool = False) -> Any:
    """The compiled op (built on first use into ``TORCH_EXTENSIONS_DIR``, loaded from there afterwards)."""
    return _builder().load(verbose=verbose)


def worker_threads() -> int:
    """OpenMP threads for CPU Adam on a thread other than the main one: every core of this process but one, which
    is left to the training loop's host thread."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class HostAdam:
    """One C++ CPU Adam instance of the GIL-free op, created as ``DeepSpeedCPUAdam`` creates its own.

    Args:
        defaults: the CPU Adam optimizer's ``defaults`` (lr, betas, eps, weight_decay).
        adamw: decoupled weight decay (the optimizer's ``adam_w_mode``).
    """

    def __init__(self, defaults: dict[str, Any], adamw: bool) -> None:
        self.op = load_op()
        self.opt_id = next(_ids)
        beta1, beta2 = defaults["betas"]
        self.op.create_adam(self.opt_id, float(defaults["lr"]), float(beta1), float(beta2), float(defaults["eps"]),
                            float(defaults["weight_decay"]), bool(adamw))
        self._limited: set[int] = set()

    def step(self, state: dict[str, Any], master: torch.Tensor, grad: torch.Tensor, hyper: AdamHyper,
             bias_correction: bool = True, grad_scale: float = 1.0) -> None:
        """``DeepSpeedCPUAdam.step`` for one tensor, with hyperparameters read when the update was issued.

        ``state`` holds the integer ``step`` and the moments; ``grad`` is the gradient as the backward left it (fp32,
        or bf16/fp16, widened exactly as it is read), which the kernel multiplies by ``grad_scale`` (an fp32 value:
        vanilla's ``1 / combined_scale``) as it reads it, leaving ``grad`` as it was.
        """
        self._limit_threads()
        state["step"] += 1
        with torch.profiler.record_function(PROFILE_NAME):  # the op is no torch operator: name it in profiles
            self.op.adam_step(self.opt_id, state["step"], hyper.lr, hyper.beta1, hyper.beta2, hyper.eps,
                              hyper.weight_decay, bias_correction, master.data, grad,
                              state["exp_avg"], state["exp_avg_sq"], grad_scale)

    def _limit_threads(self) -> None:
        """On a worker thread, leave one core to the main thread (set once per thread; OpenMP's setting is the
        calling thread's own). The result does not depend on it: the kernel is elementwise."""
        thread = threading.current_thread()
        if thread is threading.main_thread() or thread.ident in self._limited:
            return
        self.op.set_omp_threads(worker_threads())
        self._limited.add(thread.ident)

    def close(self) -> None:
        """Free the C++ instance (once)."""
        op, self.op = getattr(self, "op", None), None
        if op is not None:
            op.destroy_adam(self.opt_id)

    def __del__(self) -> None:
        self.close()
