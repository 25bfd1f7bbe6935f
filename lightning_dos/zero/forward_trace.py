"""ZeRO-3's module trace, completed under Lightning: one ``reset_step`` per training forward, not two.

ZeRO-3 records the order in which modules run in one forward and backward (its *trace*) and, once the trace is
complete, uses it to skip releasing persistent parameters, to prefetch the next modules' parameters and to release
each parameter after its last use. Its step counter is reset by a forward pre-hook on the engine's module
(``DeepSpeedZeRoOffload.setup_zero_stage3_hooks``), i.e. on *every* call of that module.

Lightning calls the engine, which calls the LightningModule, whose ``forward`` Lightning has redirected to
``training_step``; a ``training_step`` that calls ``self(x)`` calls the LightningModule a second time (deepspeed
0.19.8, lightning 2.6). The second call resets the step counter after one module has been recorded: the one-module
trace is taken as complete, the next module does not match it and the trace is invalidated, in every iteration. ZeRO-3
then never holds a complete trace: it releases every parameter after each module, persistent ones included (on one
rank: storage freed and rebuilt per module, ``record_stream`` on each), and never prefetches.

:func:`reset_once_per_forward` replaces that pre-hook with one that resets only when the module is entered from
outside itself (a depth count, kept by a forward hook that also runs when the forward raises). The nested call is
then recorded as one more module, the same in every iteration, and the trace is complete from the second iteration on.
"""

from __future__ import annotations

from typing import Any

import torch

#: The attribute of DeepSpeed's parameter offload that keeps the forward hook counting the depth (its pre-hook stays
#: in ``fwd_pre_hook``, where DeepSpeed's own ``destroy`` removes it).
_EXIT_HOOK = "_dos_forward_exit_hook"


def reset_once_per_forward(optimizer: Any) -> bool:
    """Make the ZeRO-3 optimizer ``optimizer`` reset its coordinator's step once per outermost forward of its module;
    return False where there is nothing to replace (not ZeRO-3, already done, or a DeepSpeed without the hook)."""
    offload = getattr(optimizer, "parameter_offload", None)
    old = getattr(offload, "fwd_pre_hook", None)
    if old is None or getattr(offload, _EXIT_HOOK, None) is not None:
        return False
    module: torch.nn.Module = offload.module
    depth = [0]

    def enter(_module: torch.nn.Module, _args: Any) -> None:
        if depth[0] == 0:
            offload.get_param_coordinator().reset_step()
        depth[0] += 1

    def leave(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        depth[0] = max(0, depth[0] - 1)

    old.remove()
    # first, as DeepSpeed's was: the step is reset before the module's own fetch hook records it
    offload.fwd_pre_hook = module.register_forward_pre_hook(enter, prepend=True)
    setattr(offload, _EXIT_HOOK, module.register_forward_hook(leave, always_call=True))
    return True


def trace_complete(optimizer: Any) -> bool | None:
    """Whether the ZeRO-3 optimizer ``optimizer`` holds a complete module trace (None: not ZeRO-3)."""
    offload = getattr(optimizer, "parameter_offload", None)
    return None if offload is None else bool(offload.get_param_coordinator().is_complete_trace())
