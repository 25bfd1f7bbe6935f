"""torch's own ``linear`` where ZeRO-3's memory-efficient one buys nothing.

With ``memory_efficient_linear`` on (DeepSpeed's default), entering ``zero.Init`` or building a ZeRO-3 engine replaces
``torch.nn.functional.linear``, process-wide and for good, with ``zero3_linear_wrap``: a Python autograd Function
that keeps the weight by reference so that a partition released after the forward can be gathered again for the
backward. When every parameter persists nothing is released and the wrapper only costs time: one Python autograd
Function per call (binding its default argument through ``inspect.signature`` each time) and the bias added by a
separate kernel instead of in the matrix multiply. The strategy turns it off in that case (``param_persistence``);
since the model was already built under ``zero.Init`` with the default, :func:`restore_torch_linear` puts torch's
function back.
"""

from __future__ import annotations

import torch


def restore_torch_linear() -> bool:
    """Put back the ``torch.nn.functional.linear`` DeepSpeed replaced, if it did; return whether it had."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is None or torch.nn.functional.linear is original:
        return False
    torch.nn.functional.linear = original
    return True
