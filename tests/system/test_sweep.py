"""``lightning-dos bench sweep`` with real worker processes on the CPU: three fixed plans of a tiny GPT, then ``auto``
started cold, interleaved in one process; every iteration ran the plan the sweep set for it, and the figures in
sweep.json, the report and the chart follow. Then the same on two gloo ranks, each iteration the slower rank's.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from lightning_dos.bench import main
from lightning_dos.bench.sweep.config import PROGRESS_FILE
from lightning_dos.planning.auto import PROBE_STEPS
from tests.support.bench import PNG_SIGNATURE, TINY, WINDOWS
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
AUTO_VS_BEST, AUTO_VS_STRIDES, NO_OOM, PREDICTION = (TARGETS.AUTO_VS_BEST, TARGETS.AUTO_VS_STRIDES, TARGETS.NO_OOM,
                                                     TARGETS.PREDICTION)


def test_sweep_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sweep"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # changes what a run measures
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    code = main(["sweep", "--set", *TINY, *WINDOWS, "--plans", "host", "0.5", "stride:2", "--steps-per-plan", "2",
                 "--budgets", "unlimited", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[1/1] unlimited: ok  fixed plans 3/3, best " in printed and ", auto ms " in printed
    assert "1/1 runs completed" in printed

    doc = json.loads((out / "sweep.json").read_text())
    assert {"hardware", "versions", "config", "sweep", "model", "budgets", "date"} <= set(doc)
    assert "targets" not in doc  # the report states ratios; the project's targets are not in it
    assert doc["environment"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "- Environment: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`" in (out / "sweep.md").read_text()
    assert doc["hardware"]["bench_device"]["type"] == "cpu"
    assert doc["sweep"]["plans"] == ["host", "0.5", "stride:2"] and doc["sweep"]["steps_per_plan"] == 2
    assert doc["config"]["plans"] == ["host", "0.5", "stride:2"] and doc["config"]["out"] == str(out)
    (budget,) = doc["budgets"]
    assert budget["budget"] == {"name": "unlimited", "gib": None, "label": "unlimited"}
    assert budget["fixed"]["status"] == "ok" and budget["fixed"]["plans_completed"] == 3

    # every iteration ran the plan the sweep set for it, from its first update on
    raw = json.loads((out / "runs" / "unlimited" / "result.json").read_text())
    dos = raw["dos"]
    sizes_n = dos["subgroups"]
    assert sizes_n >= 3
    # the memory plans the run printed, kept: no device to measure here, so every subgroup's home is the host
    (at_start, *_) = dos["memory_plans"]
    assert [(t["home"], t["subgroups"]) for t in at_start["tiers"]][-1] == ("host", sizes_n) and at_start["fits"]
    lanes = {entry["plan"]: entry["lanes"] for entry in raw["sweep"]["resolved"]}
    assert lanes["host"] == "H" * sizes_n and "D" in lanes["0.5"] and "H" in lanes["0.5"]
    assert lanes["stride:2"] == "".join("D" if (i + 1) % 2 == 0 else "H" for i in range(sizes_n))
    every = raw["sweep"]["iterations"]
    # rounds of the fixed plans; auto's 4 iterations spread over the second round, its probe first
    assert [it["plan"] for it in every] == ["host", "0.5", "stride:2", "auto", "auto", "host", "auto", "0.5", "auto",
                                            "stride:2"]
    iterations = [it for it in every if it["plan"] != "auto"]
    auto_its = [it for it in every if it["plan"] == "auto"]
    for it in iterations:
        (record,) = it["records"]
        assert record["lanes"] == lanes[it["plan"]], it
        assert record["demoted_subgroups"] == 0 and record["update_ms"] > 0 and record["predicted_ms"] > 0
    assert [s["lanes"] for s in dos["steps"]] == [it["records"][0]["lanes"] for it in every]
    # from the second update phase on, a plan with a device lane had its first prefetches issued at dispatch
    assert [it["records"][0]["prefetched_ahead"] > 0 for it in every] == [
        k > 0 and "D" in it["records"][0]["lanes"] for k, it in enumerate(every)]
    assert (out / "runs" / "unlimited" / PROGRESS_FILE).is_file()

    plans = {p["plan"]: p for p in budget["plans"]}
    assert list(plans) == ["host", "0.5", "stride:2"]
    for name, p in plans.items():
        assert p["status"] == "ok" and p["iterations"] == 2 and p["measured_steps"] == 1, name
        # the first iteration of each plan (the first round) is warm-up: the figure is the second one's
        second = [it for it in iterations if it["plan"] == name][1]["records"][0]
        assert p["update_ms"] == pytest.approx(second["update_ms"])
        assert p["predicted_ms"] == pytest.approx(second["predicted_ms"])
        assert p["median_rel_error"] == pytest.approx(abs(second["predicted_ms"] - second["update_ms"])
                                                      / second["update_ms"])
    assert plans["host"]["device_fraction"] == 0.0 and 0.0 < plans["0.5"]["device_fraction"] < 1.0
    assert plans["stride:2"]["kind"] == "stride" and plans["0.5"]["kind"] == "fraction"
    assert budget["best"]["plan"] in plans

    auto = budget["auto"]
    assert auto["status"] == "ok" and auto["probe_step"] == PROBE_STEPS
    # 4 steps: the two probe steps and the first of the chosen plan left out
    assert auto["excluded_steps"] == 3 and auto["measured_steps"] == 1
    probe = [it["records"][0] for it in auto_its[:2]]
    # started cold after the first round: the host lane alone, then half the subgroups on the device
    assert [r["lanes"].count("D") for r in probe] == [0, sizes_n // 2]
    assert [r["replanned"] for r in probe] == [False, True]
    # the fixed plans between auto's iterations did not disturb it: it runs the plan it chose, then either that plan
    # again or (its first trial may start at once) a candidate the model ranks within 5% of it
    assert auto["chosen"]["lanes"] == auto_its[2]["records"][0]["lanes"]
    fourth = auto_its[3]["records"][0]
    assert fourth["source"] == "trial" or (fourth["source"], fourth["lanes"]) == ("auto", auto["chosen"]["lanes"])
    assert auto["update_ms"] == pytest.approx(auto_its[3]["records"][0]["update_ms"]) and auto["update_ms"] > 0
    assert auto["iteration_ms"] == pytest.approx(raw["iterations"]["iteration_ms"][8])
    assert None not in raw["iterations"]["iteration_ms"] and raw["e2e_steps"] == 0  # all synchronised

    assert budget["auto_vs_best"] == pytest.approx(auto["update_ms"] / budget["best"]["update_ms"])
    assert budget["fastest_stride"]["plan"] == "stride:2"
    assert budget["auto_vs_fastest_stride"] == pytest.approx(auto["update_ms"] / plans["stride:2"]["update_ms"])
    targets = {t["target"]: t for t in TARGETS.budget_targets(budget)}
    assert list(targets) == [AUTO_VS_BEST, PREDICTION, NO_OOM, AUTO_VS_STRIDES]
    assert targets[NO_OOM]["status"] == "met"
    for t in targets.values():
        assert t["status"] in ("met", "missed") and t["value"] is not None, t
    assert [t["target"] for t in TARGETS.overall_targets(doc["budgets"])] == list(targets)

    report = (out / "sweep.md").read_text()
    for text in ("# lightning-dos bench sweep: gpt-2.7b", "## auto against the swept plans", "| auto / best |",
                 "## Budget unlimited", "| auto | ok |", "](sweep.png)"):
        assert text in report, text
    for name in plans:
        assert f"| {name} | ok |" in report, name
    png = out / "sweep.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400


def test_sweep_on_two_gloo_ranks_counts_each_iterations_slowest_rank(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--devices 2``: one process of two ranks per budget, each sweeping its own partition with the plan the sweep
    set, each iteration's figure the slower rank's update phase, every rank's records kept."""
    out = tmp_path / "sweep2"
    code = main(["sweep", "--set", *TINY, *WINDOWS, "--devices", "2", "--plans", "host", "device",
                 "--steps-per-plan", "2", "--budgets", "unlimited", "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    raw = json.loads((out / "runs" / "unlimited" / "result.json").read_text())
    assert raw["devices"] == 2 and len(raw["sweep_per_rank"]) == 2
    ranks_ = raw["sweep_per_rank"]
    for merged, *each in zip(raw["sweep"]["iterations"], *(r["iterations"] for r in ranks_)):
        assert {it["plan"] for it in each} == {merged["plan"]}  # both ranks ran the plan of the iteration
        took = [sum(record["update_ms"] for record in it["records"]) for it in each]
        assert merged["rank"] == took.index(max(took)) and merged["records"] == each[merged["rank"]]["records"]
        if merged["plan"] in ("host", "device"):
            assert all(it["records"][0]["lanes"] == ("H" if merged["plan"] == "host" else "D") * len(
                it["records"][0]["lanes"]) for it in each)
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["config"]["devices"] == [2] and doc["budgets"][0]["fixed"]["plans_completed"] == 2
