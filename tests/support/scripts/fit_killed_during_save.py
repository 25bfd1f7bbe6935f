"""``lightning-dos fit ARGS...`` that SIGKILLs itself halfway through writing its checkpoint number ``KILL_AT_SAVE``.

A crash while a checkpoint is written, made deterministic: DeepSpeed writes each shard with ``torch.save``; the
process kills itself right after the first file of that checkpoint is on disk (the model states), before the
optimizer states, DeepSpeed's ``latest`` file and the publication.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

KILL_AT = int(os.environ["KILL_AT_SAVE"])
_real_save = torch.save
_checkpoints: list[str] = []


def _save(obj, f, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    result = _real_save(obj, f, *args, **kwargs)
    path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else ""
    if ".partial" in path:
        checkpoint = path.split(".partial")[0]
        if checkpoint not in _checkpoints:
            _checkpoints.append(checkpoint)
            if len(_checkpoints) == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
    return result


torch.save = _save

from lightning_dos.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
