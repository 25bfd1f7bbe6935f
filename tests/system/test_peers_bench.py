"""A bench on the CPU gives every peer a row (each configuration a worker process): with its status and, for those
that cannot run here, the reason (the peers as strategies: tests/integration/test_peers.py)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from lightning_dos.bench import main as bench_main
from lightning_dos.strategies.peers import PEERS_EXTRA
from tests.support.bench import TINY, WINDOWS  # a CPU's rows (trainer.accelerator=cpu), on a GPU host too


def test_bench_on_a_cpu_gives_every_peer_a_row(tmp_path: Path) -> None:
    """plain and ZenFlow (overlapped, its optimizer process spawned from the worker) run; torchao_offload and
    SuperOffload get a failed row that says why, the first line of their strategy's error, never a gap."""
    out = tmp_path / "bench"
    code = bench_main(["--set", *TINY, *WINDOWS, "--only", "plain", "torchao_offload", "superoffload", "zenflow",
                       "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in doc["results"]}
    assert list(rows) == ["plain", "torchao_offload", "superoffload", "zenflow"]  # configs/bench/compare.yaml's order
    for label in ("plain", "zenflow"):
        row = rows[label]
        assert row["status"] == "ok", (label, row["reason"])
        assert row["strategy"] == label and row["plan"] is None
        assert len(row["losses"]) == 4 and all(math.isfinite(v) for v in row["losses"])
        assert row["iteration_ms"] > 0

    torchao = rows["torchao_offload"]
    assert torchao["status"] == "failed" and torchao["iteration_ms"] is None
    if importlib.util.find_spec("torchao") is None:  # CI: the extra is not installed
        assert torchao["reason"].startswith("ImportError: torchao_offload needs torchao, which is not installed")
        assert PEERS_EXTRA in torchao["reason"]
        assert "it also needs a CUDA GPU, and got device cpu" in torchao["reason"]
    else:
        assert "needs a CUDA GPU" in torchao["reason"] and "got device cpu" in torchao["reason"]
    superoffload = rows["superoffload"]
    assert superoffload["status"] == "failed"
    assert superoffload["reason"].startswith(
        "MisconfigurationException: accelerator: superoffload runs on NVIDIA CUDA GPUs only")
    report = (out / "report.md").read_text()
    assert torchao["reason"][:60] in report and superoffload["reason"][:60] in report
