"""Build the DeepSpeed JIT ops the CPU tests load, once, into ``TORCH_EXTENSIONS_DIR`` (a no-op when built).

``scripts/test.sh`` runs this before pytest, so the one-time build (about 3 minutes on 2 cores: CPU Adam, its
GIL-free build that ``overlap=True`` runs the host lane with, and, on a CPU-only host, the shared-memory
collectives) is not charged to whichever test first needs an op; the tests and their subprocesses load the same
builds from the same folder.
"""

from __future__ import annotations

import os
import sys
import time

OPS = ("CPUAdamBuilder", "ShareMemCommBuilder")
#: This project's own op (DeepSpeed's CPU Adam kernel with a binding that releases the GIL).
NOGIL_OP = "GIL-free CPU Adam"


def main() -> int:
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        print("build_ops: set TORCH_EXTENSIONS_DIR to the folder the tests use (scripts/test.sh does)", file=sys.stderr)
        return 2
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    for name in OPS:
        builder = accelerator.create_op_builder(name)
        if builder is None:  # e.g. the shared-memory collectives exist for the CPU accelerator only
            continue
        started = time.perf_counter()
        try:
            builder.load(verbose=False)
        except Exception as error:  # noqa: BLE001 - any failure here would fail every test that needs the op
            print(f"build_ops: building DeepSpeed's {name} failed: {error}", file=sys.stderr)
            return 1
        print(f"build_ops: {name} ready in {os.environ['TORCH_EXTENSIONS_DIR']} "
              f"({time.perf_counter() - started:.0f} s)")
    from lightning_dos.zero.cpu_adam_nogil import load_op

    started = time.perf_counter()
    try:
        load_op(verbose=False)
    except Exception as error:  # noqa: BLE001 - as above, for every overlap test
        print(f"build_ops: building the {NOGIL_OP} op failed: {error}", file=sys.stderr)
        return 1
    print(f"build_ops: {NOGIL_OP} ready in {os.environ['TORCH_EXTENSIONS_DIR']} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
