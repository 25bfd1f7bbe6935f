"""Train the tiny LM with two CPU ranks (gloo) under one strategy; each rank saves its losses and fp32 masters, and
together they save a sharded checkpoint.

Usage: python tests/scripts/two_ranks.py PLAN OUT_DIR   (PLAN "vanilla" for ZeRO-3 offload, else a DOS plan)
Lightning re-runs this script for rank 1, as it does for any multi-process CPU run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parity import LossRecorder, TinyLM, make_strategy, token_loader  # noqa: E402


def main() -> None:
    plan_arg, out = sys.argv[1], Path(sys.argv[2])
    plan = None if plan_arg == "vanilla" else (float(plan_arg) if plan_arg[0].isdigit() else plan_arg)
    rec = LossRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy(plan),
        precision="32-true",
        max_steps=4,
        gradient_clip_val=0.05,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rec],
    )
    trainer.fit(TinyLM(), train_dataloaders=token_loader(8))
    rank = trainer.global_rank
    trainer.save_checkpoint(out / "step=4.ckpt")  # a collective: each rank writes its shard, rank 0 publishes
    opt = trainer.strategy.model.optimizer
    partition = torch.cat([t.detach().float().clone() for t in opt.fp32_partitioned_groups_flat])
    # whole fp32 masters, gathered from both ranks (a collective): raw partitions end in uninitialised padding
    from deepspeed.utils import safe_get_full_fp32_param

    full = torch.cat([safe_get_full_fp32_param(p).detach().float().flatten().cpu()
                      for p in trainer.strategy.model.module.parameters()])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"full": full, "partition_numel": partition.numel()}, out / f"masters_rank{rank}.pt")
    manager = getattr(trainer.strategy, "manager", None)
    info = {
        "losses": rec.losses,
        "world_size": trainer.world_size,
        "ranks_per_host": manager.cost.ranks_per_host if manager else None,
        "subgroups": len(manager.sizes) if manager else None,
        "device_subgroups": len(manager.records[-1].plan.device_subgroups()) if manager else None,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()  # an exception here exits non-zero as usual
    # Both ranks have written their results; the barrier keeps rank 0 (whose exit ends the test's wait) from
    # leaving before rank 1 has written its own. Then skip interpreter finalization: the process groups outlive it
    # (DeepSpeed's engine and parameters keep them alive, so destroy_process_group() does not stop their threads),
    # and a gloo worker thread still releasing the last all-gather needs the GIL to drop its tensors; during
    # finalization that kills the thread inside a noexcept destructor: std::terminate, SIGABRT ("terminate called
    # without an active exception").
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
