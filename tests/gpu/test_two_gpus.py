"""GPU tier on a host of two or more GPUs (``pytest -m gpu``): data parallelism on real NCCL collectives.

The CPU tier's two gloo ranks (tests/system/test_two_ranks.py) again on two GPUs: every 16-bit parameter persisting, a
random plan every step, the seam's gather per subgroup against DeepSpeed's per-parameter gather, serially and with the
update overlapped (the gathers wait on the stream for each subgroup's update), with the residents
``resident_gib="auto"``
chooses, against vanilla ZeRO-3 offload. The backward's reductions may sum in another order from one run to the next
on a GPU, so the runs are compared within 1e-5, as the CPU tier compares them with vanilla.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.ranks import run_two_ranks_together  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus2,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: run with -m gpu on a GPU host"),
]


def test_two_gpus_gather_per_subgroup_overlapped_with_residents_track_deepspeeds_gather(tmp_path: Path) -> None:
    assert torch.cuda.device_count() >= 2, "this test needs a host of two or more GPUs"
    env = {"RANDOM_PLAN": "3", "PERSIST": "1"}
    configs = {"deepspeed": {"FLAT_GATHER": "0"}, "flat": {"FLAT_GATHER": "1"},
               "flat-overlapped": {"OVERLAP": "1", "FLAT_GATHER": "1"},
               "flat-overlapped-resident": {"OVERLAP": "1", "FLAT_GATHER": "1", "RESIDENT_GIB": "auto"}}
    # one launch of two processes for all five runs (each a fresh launch took over 30 s on a GPU host)
    records = run_two_ranks_together([("vanilla", tmp_path / "vanilla", {})] + [
        ("host", tmp_path / name, {**env, **extra}) for name, extra in configs.items()], ACCELERATOR="cuda")
    vanilla, runs = records[0], dict(zip(configs, records[1:]))
    for rank in range(2):
        params = runs["flat"][rank]["params"]
        assert runs["flat"][rank]["refreshed"] == params and runs["deepspeed"][rank]["refreshed"] == 0
        assert runs["flat-overlapped"][rank]["overlapped"]
        assert runs["flat-overlapped-resident"][rank]["resident"]  # the tiny model fits: every subgroup
        for name in ("flat", "flat-overlapped", "flat-overlapped-resident"):
            for a, b in zip(runs[name][rank]["losses"], runs["deepspeed"][rank]["losses"]):
                assert abs(a - b) <= 1e-5 * abs(b), name
            for a, b in zip(runs[name][rank]["losses"], vanilla[rank]["losses"]):
                assert abs(a - b) <= 1e-5 * abs(b), name
