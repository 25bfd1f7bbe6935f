"""What the bench's tests share: a tiny workload over the default recipe (``--set`` pairs: a 2-layer GPT, fp32 on the
CPU, subgroups small enough for several), a row table written for a test, a raw worker result made by hand, and a
callback that makes a worker fail as a GPU host's would, for a model from a given width up: the worker kills itself as
the kernel's out-of-memory killer would (``kill``; ``kill-after-training``: once its steps have run, in Lightning's
teardown), raises there (``raise-after-training``), reports CUDA running out of memory (``cuda-oom``), or refuses the
run with a clear error before allocating (``refuse``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

HOW = ("kill", "kill-after-training", "raise-after-training", "cuda-oom", "refuse")
#: ``--set`` pairs making recipes/gpt-2.7b.yaml a tiny CPU run: 2 blocks of width 64, 4 subgroups, 512 tokens
TINY = ["trainer.accelerator=cpu", "trainer.precision=32-true", "model.n_layer=2", "model.n_embd=64", "model.n_head=2",
        "data.vocab_size=512", "data.seq_len=32", "data.batch_size=2", "model.learning_rate=0.01",
        "model.warmup_steps=0", "trainer.strategy.init_args.sub_group_size=40000"]
#: ... and the bench's iteration windows for it: 4 iterations, the first warm-up, the second end to end
WINDOWS = ["--steps", "4", "--warmup", "1"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rows_file(path: Path, rows: dict[str, Any]) -> Path:
    """A row table at ``path``."""
    import yaml

    path.write_text(yaml.safe_dump(rows, sort_keys=False))
    return path


def raw(label: str, strategy: str, iteration: list[float], losses: list[float], repeat: int = 0,
        end_s: list[float] | None = None, **rest: Any) -> dict[str, Any]:
    """A worker's raw result: every phase per iteration (step = iteration - 3 ms), end times if given, losses."""
    result = {"status": "ok", "reason": None, "label": label, "strategy": strategy, "plan": None, "repeat": repeat,
              "iterations": {"fwd_ms": [1.0] * len(iteration), "bwd_ms": [2.0] * len(iteration),
                             "step_ms": [x - 3.0 for x in iteration], "iteration_ms": iteration, "loss": losses},
              "peak_gpu_gib": None, "peak_host_gib": 1.0 + repeat, "dos": None, "device": {"type": "cpu"}, **rest}
    if end_s is not None:
        result["iterations"]["end_s"] = end_s
    return result


def fault(n_embd: int, how: str) -> dict[str, Any]:
    """The ``trainer.callbacks+`` value of a row that fails ``how`` from width ``n_embd`` up."""
    return {"class_path": f"{__name__}.FailFrom", "init_args": {"n_embd": n_embd, "how": how}}


class FailFrom(pl.Callback):
    def __init__(self, n_embd: int, how: str) -> None:
        if how not in HOW:
            raise ValueError(f"how: {how!r}; one of {HOW}")
        self.n_embd, self.how = n_embd, how

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if pl_module.config.n_embd < self.n_embd or self.how.endswith("after-training"):
            return
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "cuda-oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total)")
        raise ValueError(f"memory plan: n_embd {pl_module.config.n_embd} does not fit this host; lower the model size")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if pl_module.config.n_embd < self.n_embd or not self.how.endswith("after-training"):
            return
        if self.how == "kill-after-training":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("teardown: the module could not be moved to the host")
