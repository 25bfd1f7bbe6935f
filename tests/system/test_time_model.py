"""``scripts/time_model.py`` on the CPU: a tiny preset in both block styles, timed without any strategy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.parity import subprocess_env

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "time_model.py"


def test_time_model_reports_both_styles_on_cpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "debug", "--n-layer", "1", "--vocab-size", "256", "--seq-len", "16",
         "--micro-batch", "2", "--dtype", "float32", "--steps", "2", "--warmup", "1", "--device", "cpu",
         "--style", "llama", "--style", "gpt2"],
        env=subprocess_env(), cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [row["style"] for row in rows] == ["llama", "gpt2"]
    for row in rows:
        assert row["fwd_ms"] > 0 and row["bwd_ms"] > 0 and row["steps"] == 2 and row["peak_gib"] is None
        assert row["activation_checkpointing"] and row["device"] == "cpu"
        assert 4.0 < row["loss"] < 7.0  # near ln(256) = 5.55 for an untrained model
    assert rows[0]["params"] != rows[1]["params"]  # the styles build different networks
    assert "style" in proc.stdout.splitlines()[-3]
