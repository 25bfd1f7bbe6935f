"""The plan sweep's parts (pure code): the callback that switches the plan every iteration (a stand-in manager), the
budgets, each plan's and ``auto``'s figures and the project's four targets on them (``scripts/targets.py``, outside
the package) with exact numbers, a process stopped by its time limit that still reports the plans it finished, and
the chart of a committed sweep."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.runner import Runner
from lightning_dos.bench.sweep.config import (
    AUTO_MIN_EXCLUDED,
    PROGRESS_FILE,
    SweepSettings,
    resolve_budget,
    sweep_schedule,
)
from lightning_dos.bench.sweep.results import summarize_auto, summarize_budget
from lightning_dos.bench.sweep.study import render, run_sweep
from lightning_dos.bench.sweep.worker import PlanSweep, slowest_rank
from lightning_dos.planning.auto import PROBE_STEPS
from lightning_dos.planning.plan import resolve_plan
from lightning_dos.update.timings import LaneTimings
from tests.support.bench import PNG_SIGNATURE, TINY
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
AUTO_VS_BEST, AUTO_VS_STRIDES, NO_OOM, PREDICTION = (TARGETS.AUTO_VS_BEST, TARGETS.AUTO_VS_STRIDES, TARGETS.NO_OOM,
                                                     TARGETS.PREDICTION)
overall_targets = TARGETS.overall_targets


class _Manager:
    """Stands in for the optimizer-state manager: records set_plan calls, makes one record per update."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.buffers = None
        self.active = True
        self.plans = SimpleNamespace(in_force=None)
        self.records: list[Any] = []
        self.set_calls = 0
        self.auto_started_at: list[int] = []
        self.state = "fixed"  # which planning state is in force: "fixed", or auto's ("auto", its update phases)
        self.restored: list[Any] = []

    def set_plan(self, plan: Any) -> None:
        self.set_calls += 1
        self.plans.in_force = plan

    def swap_planning(self, state: Any) -> Any:
        previous = (self.state, self.plans.in_force)
        if state is None:  # auto from a cold start
            self.auto_started_at.append(len(self.records))
            self.state = ("auto", 0)
            self.plans.in_force = resolve_plan("host", self.sizes)  # the probe's first step
        else:
            self.restored.append(state[0])
            self.state, self.plans.in_force = state
        return previous

    def update(self, ms: float) -> None:
        if self.state != "fixed":  # auto: after its first update phase it runs the stride:2 lanes, say
            self.state = ("auto", self.state[1] + 1)
            self._record(ms)
            self.plans.in_force = resolve_plan("stride:2", self.sizes)
            return
        self._record(ms)

    def _record(self, ms: float) -> None:
        timings = LaneTimings(total_s=ms / 1e3)
        self.records.append(SimpleNamespace(plan=self.plans.in_force, timings=timings, device_fraction=0.25, demoted=(),
                                            free_bytes=None, predicted_s=ms / 2e3, replanned=False))


def test_plan_sweep_sets_each_plan_before_its_iterations(tmp_path: Path) -> None:
    sizes = [10, 10, 10, 10]
    manager = _Manager(sizes)
    trainer = SimpleNamespace(strategy=SimpleNamespace(manager=manager))
    sweep = PlanSweep(["host", "device", "stride:2"], 2, progress_path=tmp_path / "progress.json")
    assert sweep.total_steps == 6 and sweep.current_plan is None
    for i in range(6):
        sweep.on_train_batch_start(trainer, None, None, i)
        manager.update(10.0 + i)
        if i == 3:  # an iteration with two update phases keeps both under its plan
            manager.update(99.0)
        sweep.on_train_batch_end(trainer, None, None, None, i)
    assert manager.set_calls == 6
    letters = {"host": "HHHH", "device": "DDDD", "stride:2": "HDHD"}
    raw = sweep.raw()
    # rounds: one iteration of each plan, in the order given
    assert [it["plan"] for it in raw["iterations"]] == ["host", "device", "stride:2", "host", "device", "stride:2"]
    assert [it["step_in_plan"] for it in raw["iterations"]] == [0, 0, 0, 1, 1, 1]
    for it in raw["iterations"]:
        assert {r["lanes"] for r in it["records"]} == {letters[it["plan"]]}
        assert it["lanes"] == letters[it["plan"]]
    assert [len(it["records"]) for it in raw["iterations"]] == [1, 1, 1, 2, 1, 1]
    assert [r["update_ms"] for r in raw["iterations"][3]["records"]] == pytest.approx([13.0, 99.0])
    assert raw["resolved"][2] == {"plan": "stride:2", "lanes": "HDHD", "buffers": 2, "source": "stride:2"}
    assert json.loads((tmp_path / "progress.json").read_text()) == raw
    assert manager.plans.in_force == resolve_plan("stride:2", sizes)
    assert sweep.current_plan == "stride:2"


def test_plan_sweep_starts_auto_once_after_the_fixed_plans(tmp_path: Path) -> None:
    sizes = [10, 10, 10, 10]
    manager = _Manager(sizes)
    trainer = SimpleNamespace(strategy=SimpleNamespace(manager=manager))
    sweep = PlanSweep(["device", "0.5"], 3, progress_path=tmp_path / "progress.json", auto_steps=3)
    assert sweep.total_steps == 9
    for i in range(9):
        sweep.on_train_batch_start(trainer, None, None, i)
        manager.update(10.0 + i)
        sweep.on_train_batch_end(trainer, None, None, None, i)
    raw = sweep.raw()
    assert raw["auto_steps"] == 3
    # the first round alone, then auto's iterations spread over the later rounds
    assert [(it["plan"], it["plan_index"], it["step_in_plan"]) for it in raw["iterations"]] == [
        ("device", 0, 0), ("0.5", 1, 0), ("auto", None, 0), ("device", 0, 1), ("auto", None, 1), ("0.5", 1, 1),
        ("auto", None, 2), ("device", 0, 2), ("0.5", 1, 2)]
    # auto is started cold once; afterwards each of its iterations gets its own state back, and each fixed plan's
    # iteration the fixed plans' state, then its plan
    assert manager.auto_started_at == [2] and manager.set_calls == 6
    assert manager.restored == ["fixed", ("auto", 1), "fixed", ("auto", 2), "fixed"]
    assert [it["records"][0]["lanes"] for it in raw["iterations"] if it["plan"] == "auto"] == ["HHHH", "HDHD",
                                                                                                 "HDHD"]
    assert {it["records"][0]["lanes"] for it in raw["iterations"] if it["plan"] == "device"} == {"DDDD"}
    assert sweep.current_plan == "0.5" and manager.state == "fixed"
    with pytest.raises(ValueError, match="auto_steps"):
        PlanSweep(["0.5"], 2, auto_steps=-1)


def test_plan_sweep_refuses_auto_and_a_run_without_a_manager() -> None:
    with pytest.raises(ValueError, match="auto"):
        PlanSweep(["0.5", "auto"], 2)
    with pytest.raises(ValueError, match="steps_per_plan"):
        PlanSweep(["0.5"], 0)
    sweep = PlanSweep(["0.5"], 2)
    with pytest.raises(RuntimeError, match="deep_optimizer_states"):
        sweep.on_train_batch_start(SimpleNamespace(strategy=SimpleNamespace()), None, None, 0)
    inactive = _Manager([10, 10])
    inactive.active = False
    with pytest.raises(RuntimeError, match="not active"):
        sweep.on_train_batch_start(SimpleNamespace(strategy=SimpleNamespace(manager=inactive)), None, None, 0)


def test_budgets_resolve_for_the_model() -> None:
    quarter = resolve_budget("quarter", 2_795_276_800)
    assert quarter.gib == pytest.approx(0.25 * 12 * 2_795_276_800 / 1024**3)
    assert quarter.label == f"quarter ({quarter.gib:.2f} GiB)" and quarter.label == "quarter (7.81 GiB)"
    assert resolve_budget("unlimited", 10).gib is None and resolve_budget(" Unlimited ", 10).label == "unlimited"
    # per rank, as memory_budget_gib is: a quarter of one rank's share of the state
    assert resolve_budget("quarter", 2_795_276_800, 4).gib == pytest.approx(quarter.gib / 4)
    assert resolve_budget("12", 10, 4).gib == 12.0
    twelve = resolve_budget("12.0", 10)
    assert twelve.gib == 12.0 and twelve.name == "12" and twelve.label == "12 GiB"
    for bad in ("half", "-1", "nan"):
        with pytest.raises(ValueError, match="budgets"):
            resolve_budget(bad, 10)
    assert AUTO_MIN_EXCLUDED == PROBE_STEPS + 1
    assert sweep_schedule(["a", "b"], 3, 3) == ["a", "b", "auto", "a", "auto", "b", "auto", "a", "b"]


def test_slowest_rank_takes_each_iterations_longest_update_phase() -> None:
    def sweep(*update_ms: float) -> dict[str, Any]:
        return {"plans": ["host"], "iterations": [{"iteration": i, "plan": "host", "records": [{"update_ms": ms}]}
                                                  for i, ms in enumerate(update_ms)]}
    one = sweep(1.0, 2.0)
    assert slowest_rank([one]) is one
    merged = slowest_rank([sweep(5.0, 1.0, 2.0), sweep(3.0, 4.0, 2.0)])
    assert [(it["rank"], it["records"][0]["update_ms"]) for it in merged["iterations"]] == [(0, 5.0), (1, 4.0),
                                                                                            (0, 2.0)]
    assert merged["plans"] == ["host"]


def _record(update: float, predicted: float, lanes: str = "HDHD", fraction: float = 0.5, demoted: int = 0,
            replanned: bool = False, source: str = "fixed") -> dict[str, Any]:
    return {"lanes": lanes, "source": source, "update_ms": update, "predicted_ms": predicted,
            "device_fraction": fraction, "demoted_subgroups": demoted, "replanned": replanned}


def _process(plans: dict[str, list[tuple[float, float]]], auto: Sequence[float] = (), status: str = "ok",
             failed_plan: str | None = None, demoted: int = 0, auto_steps: int | None = None) -> dict[str, Any]:
    """A sweep process's raw result, its iterations in the sweep's order (rounds of the fixed plans, ``auto``
    interleaved): per fixed plan, (measured, predicted) of each of its iterations; ``auto``'s measured update times
    (the probe: host-only, then mixed, after which it chooses; then the chosen plan), each predicted 10% high. The
    process stops where the schedule (of ``auto_steps`` auto iterations; all of ``auto`` by default) asks for more
    than was given."""
    rounds = max(len(steps) for steps in plans.values())
    schedule = sweep_schedule(list(plans), rounds, len(auto) if auto_steps is None else auto_steps)
    left = {plan: list(steps) for plan, steps in plans.items()}
    autos = list(auto)
    iterations: list[dict[str, Any]] = []
    for name in schedule:
        if name == "auto":
            if not autos:
                break
            k = len(auto) - len(autos)
            lanes, fraction = ("HHHH", 0.0) if k == 0 else ("DHDH", 0.5)
            update = autos.pop(0)
            record = _record(update, update * 1.1, lanes=lanes, fraction=fraction, replanned=(k == 1),
                             source="probe" if k < 2 else "auto")
            iterations.append({"iteration": len(iterations), "plan": "auto", "plan_index": None, "step_in_plan": k,
                               "lanes": lanes, "device_fraction": fraction, "records": [record]})
            continue
        if not left[name]:
            break
        k = len(plans[name]) - len(left[name])
        update, predicted = left[name].pop(0)
        iterations.append({"iteration": len(iterations), "plan": name, "plan_index": list(plans).index(name),
                           "step_in_plan": k, "lanes": "HDHD", "device_fraction": 0.5,
                           "records": [_record(update, predicted, demoted=demoted)]})
    resolved = [{"plan": plan, "lanes": "HDHD", "buffers": 2, "source": plan} for plan in plans]
    reason = {"ok": None, "oom": "OutOfMemoryError: CUDA out of memory"}.get(status, f"{status}: stopped")
    return {"status": status, "reason": reason, "failed_plan": failed_plan,
            "iterations": {"iteration_ms": [1000.0 + i for i in range(len(iterations))]},
            "sweep": {"plans": list(plans), "steps_per_plan": rounds, "auto_steps": len(auto), "resolved": resolved,
                      "iterations": iterations}}


def _sweep(plans: list[str]) -> SweepSettings:
    return SweepSettings(plans=plans, steps_per_plan=3, budgets=["unlimited"], auto_steps=6, warmup=3)


def _targets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The project's targets for one budget of sweep.json, as ``scripts/targets.py`` checks them."""
    return {t["target"]: t for t in TARGETS.budget_targets(summary)}


def test_figures_leave_out_warm_up_and_the_targets_are_met() -> None:
    sweep = _sweep(["0.0", "0.5", "stride:2"])
    # first iteration of each plan (999) is warm-up; predictions 5% low, 10% high, 2% low; then auto's probe, the
    # first step of its plan and warm-up (left out), and three measured update phases
    result = _process({"0.0": [(999, 1), (200, 190), (220, 209)],
                       "0.5": [(999, 1), (100, 110), (104, 114.4)],
                       "stride:2": [(999, 1), (150, 147), (160, 156.8)]}, auto=[500, 300, 900, 103, 105, 104])
    summary = summarize_budget(resolve_budget("unlimited", 1), result, sweep)
    plans = {p["plan"]: p for p in summary["plans"]}
    assert plans["0.0"]["update_ms"] == 210 and plans["0.0"]["predicted_ms"] == pytest.approx(199.5)
    assert plans["0.0"]["median_rel_error"] == pytest.approx(0.05)
    assert plans["0.5"]["update_ms"] == 102 and plans["0.5"]["median_rel_error"] == pytest.approx(0.10)
    assert plans["stride:2"]["median_rel_error"] == pytest.approx(0.02)
    assert all(p["measured_steps"] == 2 and p["status"] == "ok" for p in plans.values())
    # auto (A) between rounds 2 and 3: 0.0 0.5 stride:2 | A 0.0 A 0.5 A stride:2 A 0.0 A 0.5 A stride:2
    assert plans["0.5"]["iteration_ms"] == 1009  # its iterations 6 and 12 of the process
    assert summary["best"] == {"plan": "0.5", "update_ms": 102}
    a = summary["auto"]
    assert (a["excluded_steps"], a["measured_steps"], a["update_ms"], a["probe_step"]) == (3, 3, 104, 2)
    assert a["chosen"]["lanes"] == "DHDH" and a["median_rel_error"] == pytest.approx(0.10)
    assert a["iteration_ms"] == 1011  # auto's measured iterations are the process's 9, 11 and 13
    assert a["status"] == "ok" and a["final_plan"] == "auto: DHDH"
    # errors pooled over the six measured update phases of the fixed plans: 0.02 0.02 0.05 0.05 0.10 0.10 -> 0.05
    assert summary["prediction_error_median"] == pytest.approx(0.05) and summary["prediction_steps"] == 6
    t = _targets(summary)
    assert t[AUTO_VS_BEST]["status"] == "met" and t[AUTO_VS_BEST]["value"] == pytest.approx(104 / 102 - 1)
    assert t[PREDICTION]["status"] == "met" and t[PREDICTION]["value"] == pytest.approx(0.05)
    assert t[NO_OOM]["status"] == "met" and t[NO_OOM]["value"] == 0
    assert t[AUTO_VS_STRIDES]["status"] == "met" and t[AUTO_VS_STRIDES]["value"] == pytest.approx(104 / 155)
    assert "auto 104.0 ms vs best swept 0.5 102.0 ms (+2.0%)" in t[AUTO_VS_BEST]["detail"]


def test_targets_are_missed_with_their_figures() -> None:
    sweep = _sweep(["0.3", "stride:4", "0.9"])
    result = _process({"0.3": [(999, 1), (100, 88), (100, 88)],     # 12% off
                       "stride:4": [(999, 1), (104, 91.52), (106, 93.28)],
                       "0.9": [(999, 1), (300, 300), (300, 300)]}, auto=[500, 300, 900, 106, 106, 106], demoted=1)
    summary = summarize_budget(resolve_budget("unlimited", 1), result, sweep)
    plans = {p["plan"]: p for p in summary["plans"]}
    assert [p["status"] for p in summary["plans"]] == ["ok", "ok", "ok"] and plans["0.9"]["demoted_max"] == 1
    t = _targets(summary)
    assert t[AUTO_VS_BEST]["status"] == "missed" and t[AUTO_VS_BEST]["value"] == pytest.approx(0.06)
    # pooled errors: 0.12 0.12 0.12 0.12 0 0 -> 0.12
    assert t[PREDICTION]["status"] == "missed" and t[PREDICTION]["value"] == pytest.approx(0.12)
    assert t[NO_OOM]["status"] == "met" and "at most 1 subgroups demoted" in t[NO_OOM]["detail"]
    assert t[AUTO_VS_STRIDES]["status"] == "missed" and t[AUTO_VS_STRIDES]["value"] == pytest.approx(106 / 105)


def test_a_process_that_runs_out_of_memory_misses_no_oom_and_says_where() -> None:
    sweep = _sweep(["0.3", "0.9"])
    during_plan = _process({"0.3": [(999, 1), (100, 100), (100, 100)], "0.9": [(999, 1)]}, status="oom",
                           failed_plan="0.9")
    summary = summarize_budget(resolve_budget("12", 1), during_plan, sweep)
    assert [p["status"] for p in summary["plans"]] == ["ok", "oom"]
    assert summary["fixed"]["failed_plan"] == "0.9" and summary["fixed"]["plans_completed"] == 1
    assert summary["auto"]["status"] == "not run" and summary["auto"]["update_ms"] is None
    t = _targets(summary)
    assert t[NO_OOM]["status"] == "missed" and t[NO_OOM]["detail"] == "sweep process: oom (during plan 0.9)"
    assert t[AUTO_VS_BEST]["status"] == "not measured"

    # out of memory during auto: every fixed plan completed; auto's update phases so far are not its figure
    during_auto = _process({"0.3": [(999, 1), (100, 100), (100, 100)], "0.9": [(999, 1), (90, 90), (90, 90)]},
                           auto=[500, 300, 900, 95], status="oom", failed_plan="auto")
    summary = summarize_budget(resolve_budget("12", 1), during_auto, sweep)
    assert [p["status"] for p in summary["plans"]] == ["ok", "ok"] and summary["fixed"]["failed_plan"] == "auto"
    assert summary["auto"]["status"] == "oom" and summary["auto"]["measured_steps"] == 1
    t = _targets(summary)
    assert t[NO_OOM]["status"] == "missed" and t[NO_OOM]["detail"] == "sweep process: oom (during auto)"
    assert t[AUTO_VS_BEST]["status"] == "not measured"


def test_targets_not_measured_and_their_combination_over_budgets() -> None:
    sweep = _sweep(["0.5"])
    fixed_only = {"0.5": [(999, 1), (100, 100), (100, 100)]}
    # interrupted after the fixed plans (progress.json has no auto iteration): auto is reached but not measured
    interrupted = _process(fixed_only, status="skipped")
    summary = summarize_budget(resolve_budget("12", 1), interrupted, sweep)
    assert summary["auto"]["status"] == "skipped" and summary["auto"]["measured_steps"] == 0
    t = _targets(summary)
    assert t[AUTO_VS_BEST]["status"] == "not measured" and t[AUTO_VS_BEST]["value"] is None
    assert t[PREDICTION]["status"] == "met" and t[PREDICTION]["value"] == 0
    assert t[NO_OOM]["status"] == "not measured" and t[NO_OOM]["detail"] == "sweep process: skipped"
    assert t[AUTO_VS_STRIDES]["status"] == "not measured"  # no stride plan swept
    failed = summarize_budget(resolve_budget("12", 1), _process(fixed_only, auto=[9, 9], status="failed"), sweep)
    assert failed["fixed"]["failed_plan"] == "auto" and _targets(failed)[NO_OOM]["status"] == "missed"
    good = summarize_budget(resolve_budget("unlimited", 1), _process(fixed_only, auto=[9, 9, 9, 101, 101]), sweep)
    assert _targets(good)[AUTO_VS_BEST]["status"] == "met"
    overall = {t["target"]: t for t in overall_targets([good, summary])}
    assert overall[AUTO_VS_BEST]["status"] == "not measured"
    assert overall[AUTO_VS_BEST]["detail"] == "unlimited: met; 12 GiB: not measured"
    overall = {t["target"]: t for t in overall_targets([good, failed, summary])}
    assert overall[NO_OOM]["status"] == "missed" and overall[NO_OOM]["value"] == 1
    assert {t["target"]: t["status"] for t in overall_targets([good])} == {
        AUTO_VS_BEST: "met", PREDICTION: "met", NO_OOM: "met", AUTO_VS_STRIDES: "not measured"}


def test_auto_without_a_probe_record_is_not_measured() -> None:
    summary = summarize_auto(_process({"0.5": [(999, 1), (100, 100)]}), _sweep(["0.5"]))
    assert summary["measured_steps"] == 0 and summary["update_ms"] is None and summary["chosen"] is None
    assert summary["status"] == "ok" and summary["final_plan"] is None


def test_a_timed_out_sweep_keeps_the_plans_it_finished(tmp_path: Path) -> None:
    settings, sweep, _, _ = parse_args(["sweep", "--set", *TINY, "--steps", "5", "--warmup", "2", "--plans", "host",
                                        "0.5", "stride:2", "--steps-per-plan", "2", "--budgets", "unlimited", "quarter",
                                        "--out", str(tmp_path)])
    calls: list[tuple[str, int, Any]] = []

    def fake_launcher(wanted: dict[str, Any], run_dir: Path, timeout_s: float) -> dict[str, Any]:
        spec = wanted["run"]
        calls.append((spec["label"], spec["steps"], spec["args"]["memory_budget_gib"]))
        assert spec["extra"] == {"sweep": {"plans": ["host", "0.5", "stride:2"], "steps_per_plan": 2, "auto_steps": 5}}
        assert (spec["args"]["overlap"], spec["args"]["resident_gib"]) == (False, 0)  # serial, nothing resident
        run_dir.mkdir(parents=True, exist_ok=True)
        log = str(run_dir / "worker.log")
        if spec["label"] == "sweep[unlimited]":  # stopped by its time limit during 0.5: only progress.json is left
            done = _process({"host": [(50, 45), (40, 44)], "0.5": [(30, 27)], "stride:2": [(70, 70)]},
                            auto=[90, 80, 37, 38], auto_steps=5)["sweep"]
            (run_dir / PROGRESS_FILE).write_text(json.dumps(done))
            return {**spec, "status": "timeout", "reason": "no result within 60 s (raise --timeout)", "log": log}
        assert len(json.loads((tmp_path / "sweep.json").read_text())["budgets"]) == 1  # the first one's is written
        done = _process({"host": [(50, 45), (40, 44)], "0.5": [(30, 27), (39, 39)], "stride:2": [(60, 60), (50, 50)]},
                        auto=[90, 80, 37, 38, 36])
        return {**spec, **done, "log": log}

    runner = Runner(settings, progress=False, launcher=fake_launcher)
    with runner:
        doc = run_sweep(runner, sweep)
    quarter = doc["budgets"][1]["budget"]["gib"]
    assert quarter == pytest.approx(resolve_budget("quarter", doc["model"]["params"]).gib)
    assert calls == [("sweep[unlimited]", 11, None), ("sweep[quarter]", 11, quarter)]
    budget = doc["budgets"][0]
    # the first round, then auto x2, host, auto x2: stopped in 0.5's second iteration; stride:2 ran only its warm-up
    assert [(p["plan"], p["status"]) for p in budget["plans"]] == [("host", "ok"), ("0.5", "timeout"),
                                                                   ("stride:2", "not run")]
    assert budget["fixed"]["failed_plan"] == "0.5" and budget["fixed"]["log"] == "runs/unlimited/worker.log"
    a = budget["auto"]  # its iterations so far count, as the fixed plans' do
    assert a["status"] == "ok" and a["update_ms"] == 38 and a["reason"].startswith("4 of 5 iterations")
    t = _targets(budget)
    assert t[NO_OOM]["status"] == "missed" and "sweep process: timeout" in t[NO_OOM]["detail"]
    assert t[AUTO_VS_BEST]["status"] == "met" and t[AUTO_VS_BEST]["value"] == pytest.approx(38 / 40 - 1)
    done = doc["budgets"][1]
    assert done["auto"]["update_ms"] == 37  # warm-up 2: the probe and the first step of its plan left out
    assert {t["target"]: t["status"] for t in overall_targets(doc["budgets"])}[NO_OOM] == "missed"
    report = (tmp_path / "sweep.md").read_text()
    for text in ("## Budget unlimited", "## Budget quarter (", "| 0.5 | timeout |", "| stride:2 | not run |",
                 "| unlimited | timeout |", "| auto | ok |"):
        assert text in report, text
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("budgets", [1, 2])
def test_the_sweep_charts_title_fits_in_the_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   budgets: int) -> None:
    """A one-panel chart is narrower than the title of a GPU host's sweep: it is wrapped, not cut off at both ends."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from lightning_dos.bench.sweep import study

    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "gpt-1b_H200_2026-11-21_runQ3-sweep"
                      / "sweep.json").read_text())
    doc["budgets"] = doc["budgets"] * budgets
    figures = []
    real_save = study.save
    monkeypatch.setattr(study, "save", lambda fig, path: figures.append(fig) or real_save(fig, path))
    render(doc, tmp_path / "sweep.png")
    (fig,) = figures
    title = fig._suptitle
    assert title.get_text().replace("\n", " ") == f"plan sweep: {study.workload_title(doc)}"
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure as saved (laid out), closed since
    box, page = title.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert ("\n" in title.get_text()) == (budgets == 1)
