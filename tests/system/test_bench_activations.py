"""``lightning-dos bench rok`` with real worker processes on the CPU: the four placements of a tiny GPT under DOS (one
fixed plan, so every run updates the same way): rok.json, the losses (bit-identical whatever the placement), the
offload's accounting (offload keeps less resident than keep), the report and the chart; then, with ``--resume`` (the
placements' runs reused), a budget between keep's and offload-host's peaks, under which offload-host fits a larger
micro-batch than keep.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import pytest

from lightning_dos.bench import main
from tests.support.bench import PNG_SIGNATURE, TINY, WINDOWS
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
# 4 blocks: with the last one kept, offload moves three; the tiny model's saved tensors are a few KiB: move them all
ROK = ["rok", "--set", *TINY, "model.n_layer=4", "trainer.strategy.init_args.plan=host", *WINDOWS,
       "--activation-min-tensor-bytes", "0"]
PLACEMENTS = ["keep", "recompute", "offload-host", "offload-nvme"]
GIB = 1024**3
PLACEMENT_KEYS = {"placement", "checkpointing", "offload", "hooks", "status", "reason", "micro_batch", "headline_ms",
                  "headline", "tokens_per_s", "e2e_iteration_ms", "fwd_ms", "bwd_ms", "step_ms", "iteration_ms",
                  "peak_activation_bytes", "peak_activation_gib", "measure", "peak_activation_bytes_per_iteration",
                  "act", "losses", "final_loss", "overhead_vs_keep", "reduction_vs_keep", "loss_vs_keep",
                  "peak_gpu_gib", "peak_host_gib"}


def test_rok_curve_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, nvme = tmp_path / "rok", tmp_path / "nvme"
    nvme.mkdir()
    code = main([*ROK, "--placements", *PLACEMENTS, "--nvme-path", str(nvme), "--disk-probe-mib", "8",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "4/4 runs completed" in printed and "[3/4] offload-host: ok" in printed

    doc = json.loads((out / "rok.json").read_text())
    assert {"hardware", "versions", "config", "rok", "model", "measurement", "disk", "placements", "budget",
            "interrupted"} <= set(doc)
    assert "claims" not in doc  # the report states what was measured; the project's claims are not in it
    assert doc["kind"] == "rok_curve" and doc["interrupted"] is False and doc["budget"] is None
    assert doc["rok"]["placements"] == PLACEMENTS and doc["rok"]["strategy"] == "deep_optimizer_states"
    assert doc["rok"]["plan"] == "host" and doc["rok"]["nvme_path"] == str(nvme)
    assert doc["config"]["micro_batch"] == 2 and doc["hardware"]["bench_device"]["type"] == "cpu"
    assert set(doc["measurement"]["memory_measures"]) == {"accounting"}  # no GPU: the hooks' accounting
    placements = {p["placement"]: p for p in doc["placements"]}
    assert list(placements) == PLACEMENTS
    for name, p in placements.items():
        assert PLACEMENT_KEYS <= set(p), name
        assert p["status"] == "ok" and p["measure"] == "accounting" and p["hooks"] is True, name
        assert p["headline"] == "end to end" and p["headline_ms"] > 0 and p["tokens_per_s"] > 0, name
        assert p["checkpointing"] == (name == "recompute"), name
        assert len(p["losses"]) == 4 and all(math.isfinite(v) for v in p["losses"]), name
    # fp32 on a CPU, one fixed plan: keeping, recomputing and offloading train bit for bit the same
    assert all(p["losses"] == placements["keep"]["losses"] for p in placements.values())
    assert all(p["loss_vs_keep"]["identical"] for p in placements.values())
    keep, host, nvme_run = placements["keep"], placements["offload-host"], placements["offload-nvme"]
    # keep's hooks only measure: nothing moved; offload moves, restores everything it moved, and keeps less resident
    assert keep["act"]["offloaded_bytes"] == 0 and keep["act"]["kept_bytes"] > 0
    assert host["act"]["offloaded_bytes"] > 0 and host["act"]["restored_bytes"] == host["act"]["offloaded_bytes"]
    assert host["peak_activation_bytes"] < keep["peak_activation_bytes"]
    assert host["reduction_vs_keep"] == pytest.approx(1 - host["peak_activation_bytes"] / keep["peak_activation_bytes"])
    assert nvme_run["act"]["nvme_written_bytes"] == nvme_run["act"]["offloaded_bytes"] > 0
    assert nvme_run["act"]["nvme_read_bytes"] == nvme_run["act"]["nvme_written_bytes"]
    assert placements["recompute"]["peak_activation_bytes"] < keep["peak_activation_bytes"]
    assert doc["disk"]["error"] is None and doc["disk"]["write_mb_s"] > 0 and doc["disk"]["read_mb_s"] > 0
    assert not list(nvme.iterdir())  # the activation files and the bandwidth file are gone
    claims = TARGETS.rok_claims(doc["placements"], doc["budget"])
    assert [c["claim"] for c in claims] == [TARGETS.ROK_HOST_VS_KEEP, TARGETS.ROK_HOST_VS_RECOMPUTE]
    assert all(c["status"] in ("met", "missed") for c in claims)

    report = (out / "rok.md").read_text()
    for text in ("## ROK curve", "| offload-host | ok |", "## NVMe directory bandwidth", "accounting: ", "](rok.png)"):
        assert text in report, text
    assert "largest micro-batch" not in report and "claim" not in report.lower()
    one_panel = matplotlib.image.imread(out / "rok.png")
    assert (out / "rok.png").read_bytes()[:8] == PNG_SIGNATURE and one_panel.shape[0] >= 400

    # what the memory buys: a budget between offload-host's peak and keep's, from what they measured
    budget = (keep["peak_activation_bytes"] + host["peak_activation_bytes"]) / 2 / GIB
    code = main([*ROK, "--placements", "keep", "offload-host", "--out", str(out), "--resume",
                 "--activation-budget-gib", f"{budget:.9f}"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[1/2] keep (reused): ok" in printed and "[2/2] offload-host (reused): ok" in printed
    doc = json.loads((out / "rok.json").read_text())
    assert all(p["reused"] for p in doc["placements"])
    section = doc["budget"]
    assert section["budget_gib"] == pytest.approx(budget) and section["start_micro_batch"] == 2
    searches = {s["placement"]: s for s in section["searches"]}
    assert searches["keep"]["status"] == searches["offload-host"]["status"] == "found"
    # keep's own run (micro-batch 2) is over the budget, offload-host's under it
    assert searches["keep"]["probes"][0] == {**searches["keep"]["probes"][0], "micro_batch": 2, "fits": False,
                                             "source": "placement run"}
    assert searches["offload-host"]["probes"][0]["fits"] is True
    assert searches["offload-host"]["largest_micro_batch"] > searches["keep"]["largest_micro_batch"] >= 1
    for search in searches.values():
        best = search["largest_micro_batch"]
        assert search["peak_bytes"] <= budget * GIB and search["tokens_per_s"] > 0
        fits = {p["micro_batch"]: p["fits"] for p in search["probes"]}
        assert fits[best] is True and fits.get(best + 1) is False  # bisection ends next to the first too big
        assert all(p["status"] == "ok" and p["peak_bytes"] for p in search["probes"])
    assert "## The largest micro-batch within" in (out / "rok.md").read_text()
    two_panels = matplotlib.image.imread(out / "rok.png")
    assert two_panels.shape[1] > one_panel.shape[1]  # the search's panel beside the curve
