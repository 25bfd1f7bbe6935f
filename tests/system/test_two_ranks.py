"""Data parallelism: two gloo ranks on the host, each planning its own partition, match vanilla at world size 2, and
save one sharded checkpoint together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from lightning_dos.strategies.checkpoint import describe, partial_path
from tests.support.parity import rel, subprocess_env
from tests.support.ranks import SCRIPT
from tests.system.conftest import RESIDENT_GIB


def test_two_ranks_match_vanilla(two_ranks: Callable[..., tuple[Path, list[dict]]]) -> None:
    vanilla_dir, vanilla = two_ranks("vanilla")
    dos_dir, dos = two_ranks("0.5")
    for rank in range(2):
        assert dos[rank]["world_size"] == 2
        assert dos[rank]["ranks_per_host"] == 2  # the cost model knows the host is shared
        assert 0 < dos[rank]["device_subgroups"] < dos[rank]["subgroups"]
        # each rank got its own block of the host's cores (bind_cores), and torch's threads follow it
        assert dos[rank]["threads"] == len(dos[rank]["cores"])
        assert len(dos[rank]["losses"]) == len(vanilla[rank]["losses"]) == 4
        for a, b in zip(dos[rank]["losses"], vanilla[rank]["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)
        m_dos = torch.load(dos_dir / f"masters_rank{rank}.pt")
        m_van = torch.load(vanilla_dir / f"masters_rank{rank}.pt")
        assert m_dos["full"].shape == m_van["full"].shape and rel(m_dos["full"], m_van["full"]) <= 1e-5
    if len(os.sched_getaffinity(0)) >= 2:  # CI has 2 cores: one each (a 1-core machine leaves them unbound, warned)
        assert not set(dos[0]["cores"]) & set(dos[1]["cores"])
        assert sorted(dos[0]["cores"] + dos[1]["cores"]) == sorted(os.sched_getaffinity(0))
    # the checkpoint both ranks saved was published once both shards were written
    for folder in (vanilla_dir, dos_dir):
        checkpoint = folder / "step=4.ckpt"
        assert describe(checkpoint) == "complete" and not partial_path(checkpoint).exists()
        shards = sorted(p.name for p in (checkpoint / "checkpoint").iterdir() if p.name.endswith("optim_states.pt"))
        assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]
    # each rank updated only its own partition (about half of the parameters), yet both see the whole model
    a = torch.load(dos_dir / "masters_rank0.pt")
    b = torch.load(dos_dir / "masters_rank1.pt")
    assert torch.equal(a["full"], b["full"])
    assert a["partition_numel"] < a["full"].numel() and b["partition_numel"] < b["full"].numel()

    # resident_gib: each rank keeps some of its own subgroups' state on the device, in neither lane; the run still
    # matches vanilla, and what the ranks gather and save (the homes, written from the device copies) is the run's
    resident_dir, resident = two_ranks("0.5", RESIDENT_GIB=RESIDENT_GIB)
    for rank in range(2):
        assert 0 < len(resident[rank]["resident"]) < resident[rank]["subgroups"]
        for a, b in zip(resident[rank]["losses"], vanilla[rank]["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)
        m_res = torch.load(resident_dir / f"masters_rank{rank}.pt")
        m_van = torch.load(vanilla_dir / f"masters_rank{rank}.pt")
        assert rel(m_res["full"], m_van["full"]) <= 1e-5 and rel(m_res["exp_avg"], m_van["exp_avg"]) <= 1e-5
    assert describe(resident_dir / "step=4.ckpt") == "complete"


def test_two_ranks_overlapped_with_a_random_plan_every_step_are_serial_bit_for_bit_and_track_vanilla(
        two_ranks: Callable[..., tuple[Path, list[dict]]]) -> None:
    """Overlap on two ranks: each rank's update phase runs beside its next forward while the collectives (the
    persistent parameters' gather, the gradients' reduce-scatter) stay on the training thread. The same random plans
    serially and overlapped give the same losses, gathered fp32 masters and moments bit for bit, and track vanilla."""
    vanilla_dir, vanilla = two_ranks("vanilla")
    serial_dir, serial = two_ranks("host", RANDOM_PLAN="11")
    overlapped_dir, overlapped = two_ranks("host", RANDOM_PLAN="11", OVERLAP="1")
    for rank in range(2):
        assert overlapped[rank]["overlapped"] and not serial[rank]["overlapped"]
        assert overlapped[rank]["plans"] == serial[rank]["plans"]
        plans = "".join(serial[rank]["plans"])
        assert "H" in plans and "D" in plans  # both lanes ran
        assert overlapped[rank]["losses"] == serial[rank]["losses"]
        for a, b in zip(overlapped[rank]["losses"], vanilla[rank]["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)
        got = torch.load(overlapped_dir / f"masters_rank{rank}.pt")
        ref = torch.load(serial_dir / f"masters_rank{rank}.pt")
        van = torch.load(vanilla_dir / f"masters_rank{rank}.pt")
        for key in ("full", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got[key], ref[key]), key
            assert rel(got[key], van[key]) <= 1e-5, key


def test_two_ranks_with_every_parameter_persistent_gather_per_subgroup_bit_for_bit(
        two_ranks: Callable[..., tuple[Path, list[dict]]]) -> None:
    """Every 16-bit parameter persisting on two ranks (and so the blocks hooked as leaves): the parameters stay whole
    through the step and each subgroup's new partitions are gathered at once (the seam's flat gather), serially and
    overlapped with a random plan every step, giving what DeepSpeed's release and per-parameter gather give, bit for
    bit, and tracking vanilla."""
    _, vanilla = two_ranks("vanilla")
    folders, runs = {}, {}
    for name, env in (("deepspeed", {"FLAT_GATHER": "0"}), ("flat", {"FLAT_GATHER": "1"}),
                      ("flat-overlapped", {"OVERLAP": "1", "FLAT_GATHER": "1"})):
        folders[name], runs[name] = two_ranks("host", RANDOM_PLAN="3", PERSIST="1", **env)
    for rank in range(2):
        info = runs["flat"][rank]
        assert info["persistent"] == info["params"] > 0 and info["leaf_blocks"] == 0  # TinyLM has no repeated blocks
        assert info["refreshed"] == info["params"] and runs["flat-overlapped"][rank]["refreshed"] == info["params"]
        assert runs["deepspeed"][rank]["refreshed"] == 0
        assert runs["flat-overlapped"][rank]["overlapped"]
        masters = {name: torch.load(folders[name] / f"masters_rank{rank}.pt") for name in runs}
        for name in ("flat", "flat-overlapped"):
            assert runs[name][rank]["losses"] == runs["deepspeed"][rank]["losses"], name
            for key in ("full", "exp_avg", "exp_avg_sq"):
                assert torch.equal(masters[name][key], masters["deepspeed"][key]), (name, key)
        for a, b in zip(runs["flat"][rank]["losses"], vanilla[rank]["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_two_nodes(runs: dict[str, Path]) -> dict[str, list[dict]]:
    """Two processes, one rank per "node", with the variables a cluster launcher (SLURM, torchrun) sets; the runs
    ``plan -> out`` one after the other in them. Each run's ranks' records."""
    port = str(_free_port())
    spec = next(iter(runs.values())).parent / "runs.json"
    spec.write_text(json.dumps([{"plan": plan, "out": str(out)} for plan, out in runs.items()]))
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "--runs", str(spec)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=subprocess_env(TWO_NODES="1", NODE_RANK=str(node), LOCAL_RANK="0", WORLD_SIZE="2",
                                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for node in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return {plan: [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)] for plan, out in runs.items()}


def test_two_nodes_match_vanilla(tmp_path: Path) -> None:
    """The same strategy through Lightning's num_nodes: each node plans its own rank as the host's only one."""
    runs = _run_two_nodes({"vanilla": tmp_path / "vanilla", "0.5": tmp_path / "dos"})
    vanilla, dos = runs["vanilla"], runs["0.5"]
    for rank in range(2):
        assert dos[rank]["world_size"] == 2 and dos[rank]["node_rank"] == rank
        assert dos[rank]["ranks_per_host"] == 1  # one rank on each node's host
        assert len(dos[rank]["losses"]) == len(vanilla[rank]["losses"]) == 4
        for a, b in zip(dos[rank]["losses"], vanilla[rank]["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)
        m_dos = torch.load(tmp_path / "dos" / f"masters_rank{rank}.pt")
        m_van = torch.load(tmp_path / "vanilla" / f"masters_rank{rank}.pt")
        assert rel(m_dos["full"], m_van["full"]) <= 1e-5
    checkpoint = tmp_path / "dos" / "step=4.ckpt"
    assert describe(checkpoint) == "complete"  # both nodes' shards, published once (one shared folder here)


def test_a_rank_whose_host_cannot_hold_its_share_stops_every_rank_before_training(tmp_path: Path) -> None:
    """Rank 1 reads a host too small for its share of the state: both ranks stop with the plan's error, naming rank
    1, when the engine is built (one rank stopping alone would leave the other waiting in its next collective)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "0.5", str(tmp_path)], env=subprocess_env(
        HOST_GIB_RANK1="4", RESIDENT_GIB="0"), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert proc.stderr.count("does not fit: rank 1: the host needs") >= 2  # raised on both ranks
    assert not list(tmp_path.glob("rank*.json"))  # neither trained
