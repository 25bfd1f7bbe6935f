"""Train the tiny LM with two CPU ranks (gloo) under one strategy; each rank saves its losses and fp32 masters, and
together they save a sharded checkpoint.

Usage: python tests/support/scripts/two_ranks.py PLAN OUT_DIR [CKPT] (PLAN "vanilla" for ZeRO-3 offload, else a DOS
plan; CKPT: a checkpoint to resume from; in the environment, RESIDENT_GIB=G: the DOS run keeps G GiB of each rank's
subgroups on the device, ``resident_gib``; OVERLAP=1: each update phase overlaps the next forward; RANDOM_PLAN=S: a
random plan every step, drawn from seed S, the same on both ranks; PERSIST=1: every 16-bit parameter persists
(``param_persistence=True``, and so leaf blocks); FLAT_GATHER=1/0: the seam's gather per subgroup of the persistent
parameters after the step, or DeepSpeed's own release and per-parameter gather (``flat_persistent_gather``);
ACCELERATOR=cuda: two GPUs; HOST_GIB_RANK1=G: rank 1 reads a host of G GiB with nothing available)
Lightning re-runs this script for rank 1, as it does for any multi-process CPU run. With TWO_NODES=1 and NODE_RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as a cluster launcher sets them, it is one of two
single-rank nodes.

Or: python tests/support/scripts/two_ranks.py --runs RUNS.json, a list of {"plan", "out", "env"} (``env``: the switches
above for that run): the runs one after the other in the same two processes, which start, import and join their
process group once (their fits share it; each run gets its trainer, strategy and model).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.support
from tests.support.parity import LossRecorder, RandomPlanEveryStep, TinyLM, make_strategy, token_loader  # noqa: E402


def main() -> None:
    if sys.argv[1] == "--runs":
        runs = json.loads(Path(sys.argv[2]).read_text())
        for run in runs:
            train(run["plan"], Path(run["out"]), run.get("env", {}))
            torch.distributed.barrier()  # both ranks have written this run's results before the next starts
    else:
        train(sys.argv[1], Path(sys.argv[2]), os.environ, sys.argv[3] if len(sys.argv) > 3 else None)


#: the seam's default, restored for a run that does not set FLAT_GATHER after one that did
FLAT_GATHER_DEFAULT = None


def train(plan_arg: str, out: Path, env: dict[str, str], ckpt_path: str | None = None) -> None:
    """One run: ``plan_arg`` with the switches in ``env`` (module docstring), results under ``out``."""
    global FLAT_GATHER_DEFAULT
    plan = None if plan_arg == "vanilla" else (float(plan_arg) if plan_arg[0].isdigit() else plan_arg)
    # TWO_NODES=1: launched once per "node", with the variables a cluster launcher sets: two nodes of one rank each
    # (not NODE_RANK itself: Lightning sets it for the rank it starts on one node too)
    nodes = 2 if os.environ.get("TWO_NODES") == "1" else 1
    rec = LossRecorder()
    resident = env.get("RESIDENT_GIB")
    options: dict = {} if resident is None else {"resident_gib": resident if resident == "auto" else float(resident)}
    if env.get("OVERLAP") == "1":
        options["overlap"] = True
    if env.get("PERSIST") == "1":
        options["param_persistence"] = True
    from lightning_dos.zero.optimizer import InterleavedZeroOptimizer

    if FLAT_GATHER_DEFAULT is None:
        FLAT_GATHER_DEFAULT = InterleavedZeroOptimizer.flat_persistent_gather
    InterleavedZeroOptimizer.flat_persistent_gather = (env["FLAT_GATHER"] == "1" if "FLAT_GATHER" in env
                                                       else FLAT_GATHER_DEFAULT)
    if "HOST_GIB_RANK1" in env:
        from lightning_dos.planning.placement import HostMemory
        from lightning_dos.update.manager import OptimizerStateManager

        small = int(float(env["HOST_GIB_RANK1"]) * 2**30)
        real = OptimizerStateManager.host_memory
        OptimizerStateManager.host_memory = lambda self: (  # type: ignore[method-assign]
            HostMemory(total=small, available=0, ranks=2) if torch.distributed.get_rank() == 1 else real(self))
    callbacks: list[pl.Callback] = [rec]
    if "RANDOM_PLAN" in env:
        callbacks.append(RandomPlanEveryStep(seed=int(env["RANDOM_PLAN"])))
    trainer = pl.Trainer(
        accelerator=os.environ.get("ACCELERATOR", "cpu"),
        devices=2 // nodes,
        num_nodes=nodes,
        strategy=make_strategy(plan, **options),
        precision="32-true",
        max_steps=4,
        gradient_clip_val=0.05,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(TinyLM(), train_dataloaders=token_loader(8), ckpt_path=ckpt_path)
    rank = trainer.global_rank
    trainer.save_checkpoint(out / "step=4.ckpt")  # a collective: each rank writes its shard, rank 0 publishes
    opt = trainer.strategy.model.optimizer
    partition = torch.cat([t.detach().float().clone() for t in opt.fp32_partitioned_groups_flat])
    # whole fp32 masters, gathered from both ranks (a collective): raw partitions end in uninitialised padding
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    params = list(trainer.strategy.model.module.parameters())
    full = torch.cat([safe_get_full_fp32_param(p).detach().float().flatten().cpu() for p in params])
    exp_avg = torch.cat([safe_get_full_optimizer_state(p, "exp_avg").detach().float().flatten().cpu() for p in params])
    exp_avg_sq = torch.cat([safe_get_full_optimizer_state(p, "exp_avg_sq").detach().float().flatten().cpu()
                            for p in params])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"full": full, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "partition_numel": partition.numel()},
               out / f"masters_rank{rank}.pt")
    manager = getattr(trainer.strategy, "manager", None)
    info = {
        "losses": rec.losses,
        "world_size": trainer.world_size,
        "ranks_per_host": manager.cost.ranks_per_host if manager else None,
        "subgroups": len(manager.sizes) if manager else None,
        "resident": list(manager.resident) if manager else None,
        "device_subgroups": len(manager.records[-1].plan.device_subgroups()) if manager and manager.records else None,
        "overlapped": bool(getattr(trainer.strategy, "overlapped", False)),
        "leaf_blocks": len(getattr(trainer.strategy, "leaf_block_names", [])),
        "persistent": len(getattr(opt, "persistent_parameters", [])),
        "refreshed": getattr(opt, "refreshed_params", 0),
        "params": len(params),
        "plans": [record.plan.lane_letters() for record in manager.records] if manager else None,
        "node_rank": trainer.node_rank,
        "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": torch.get_num_threads(),
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
