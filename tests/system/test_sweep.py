"""The plan sweep: one CPU run of ``lightning-dos bench --sweep`` with real workers, plus its parts.

The end-to-end test sweeps three fixed plans of a tiny model, then ``auto`` started cold, in one process, and
checks that every iteration ran the plan the sweep set for it, the figures in sweep.json, the report and the
chart. The other tests cover the parent alone: the callback's switching (a stand-in manager), the budgets, the
command line, the per-plan and ``auto`` figures, the ratios the report states, and the project's four targets
(``scripts/targets.py``, outside the package) with exact numbers (met, missed, not
measured), and a fixed-plan process stopped by its time limit that still reports the plans it finished.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.image
import pytest

from lightning_dos.bench import main
from lightning_dos.bench.arguments import parse_args
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import RunSpec
from lightning_dos.bench.sweep.config import (
    AUTO_MIN_EXCLUDED,
    DEFAULT_SWEEP_PLANS,
    PROGRESS_FILE,
    SweepConfig,
    resolve_budget,
    sweep_schedule,
)
from lightning_dos.bench.sweep.harness import run_sweep
from lightning_dos.bench.sweep.results import summarize_auto, summarize_budget
from lightning_dos.bench.sweep.worker import PlanSweep, slowest_rank
from lightning_dos.planning.auto import PROBE_STEPS
from lightning_dos.planning.plan import resolve_plan
from lightning_dos.update.timings import LaneTimings
from tests.support.script_loader import load_script

TARGETS = load_script("targets")  # the project's own targets, outside the package
AUTO_VS_BEST, AUTO_VS_STRIDES, NO_OOM, PREDICTION = (TARGETS.AUTO_VS_BEST, TARGETS.AUTO_VS_STRIDES, TARGETS.NO_OOM,
                                                     TARGETS.PREDICTION)
overall_targets = TARGETS.overall_targets
TINY = ["--model", "debug", "--n-layer", "2", "--n-embd", "64", "--vocab-size", "512", "--seq-len", "32",
        "--micro-batch", "2", "--steps", "4", "--warmup", "1", "--precision", "32-true", "--sub-group-size", "40000",
        "--lr", "0.01"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --- end to end ---------------------------------------------------------------------------------------------------


def test_sweep_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    code = main([*TINY, "--sweep", "--sweep-plans", "host", "0.5", "stride:2", "--steps-per-plan", "2",
                 "--budgets", "unlimited", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[1/1] unlimited: ok  3/3 fixed plans" in printed and "; auto " in printed
    assert "1/1 processes completed" in printed

    doc = json.loads((out / "sweep.json").read_text())
    assert {"hardware", "versions", "config", "sweep", "model", "budgets", "date"} <= set(doc)
    assert "targets" not in doc  # the report states ratios; the project's targets are not in it
    assert doc["hardware"]["bench_device"]["type"] == "cpu"
    assert doc["sweep"]["plans"] == ["host", "0.5", "stride:2"] and doc["sweep"]["steps_per_plan"] == 2
    assert doc["config"]["memory_budget_gib"] is None and doc["config"]["out"] == str(out)
    (budget,) = doc["budgets"]
    assert budget["budget"] == {"name": "unlimited", "gib": None, "label": "unlimited"}
    assert budget["fixed"]["status"] == "ok" and budget["fixed"]["plans_completed"] == 3

    # every iteration ran the plan the sweep set for it, from its first update on
    raw = json.loads((out / "runs" / "unlimited" / "result.json").read_text())
    dos = raw["dos"]
    sizes_n = dos["subgroups"]
    assert sizes_n >= 3
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
    assert None not in raw["iterations"]["iteration_ms"] and doc["config"]["e2e_steps"] == 0  # all synchronised

    assert budget["auto_vs_best"] == pytest.approx(auto["update_ms"] / budget["best"]["update_ms"])
    assert budget["fastest_stride"]["plan"] == "stride:2"
    assert budget["auto_vs_fastest_stride"] == pytest.approx(auto["update_ms"] / plans["stride:2"]["update_ms"])
    targets = _targets(budget)
    assert list(targets) == [AUTO_VS_BEST, PREDICTION, NO_OOM, AUTO_VS_STRIDES]
    assert targets[NO_OOM]["status"] == "met"
    for t in targets.values():
        assert t["status"] in ("met", "missed") and t["value"] is not None, t
    assert [t["target"] for t in overall_targets(doc["budgets"])] == list(targets)

    report = (out / "sweep.md").read_text()
    for text in ("# lightning-dos plan sweep: debug on CPU", "## Hardware", "## Versions", "## Configuration",
                 "## auto against the swept plans", "| auto / best |", "## Budget: unlimited", "| auto |",
                 "sweep.png", '"steps_per_plan": 2'):
        assert text in report, text
    assert "target" not in report.lower() and "met" not in report.split()
    for name in plans:  # every swept plan has a row; the best one (timing decides which) is marked
        row = f"| **{name}** (best) |" if name == budget["best"]["plan"] else f"| {name} |"
        assert row in report, row
    png = out / "sweep.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400


# --- the callback -------------------------------------------------------------------------------------------------


class _Manager:
    """Stands in for the optimizer-state manager: records set_plan calls, makes one record per update."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.buffers = None
        self.active = True
        self.base_plan: Any = None
        self.records: list[Any] = []
        self.set_calls = 0
        self.auto_started_at: list[int] = []
        self.state = "fixed"  # which planning state is in force: "fixed", or auto's ("auto", its update phases)
        self.restored: list[Any] = []

    def set_plan(self, plan: Any) -> None:
        self.set_calls += 1
        self.base_plan = plan

    def start_auto(self) -> None:
        self.auto_started_at.append(len(self.records))
        self.state = ("auto", 0)
        self.base_plan = resolve_plan("host", self.sizes)  # the probe's first step

    def planning_state(self) -> Any:
        return (self.state, self.base_plan)

    def restore(self, state: Any) -> None:
        self.restored.append(state[0])
        self.state, self.base_plan = state

    def update(self, ms: float) -> None:
        if self.state != "fixed":  # auto: after its first update phase it runs the stride:2 lanes, say
            self.state = ("auto", self.state[1] + 1)
            self._record(ms)
            self.base_plan = resolve_plan("stride:2", self.sizes)
            return
        self._record(ms)

    def _record(self, ms: float) -> None:
        timings = LaneTimings(total_s=ms / 1e3)
        self.records.append(SimpleNamespace(plan=self.base_plan, timings=timings, device_fraction=0.25, demoted=(),
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
    assert manager.base_plan == resolve_plan("stride:2", sizes)
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


def test_sweep_on_two_gloo_ranks_counts_each_iterations_slowest_rank(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--devices 2``: one process of two ranks per budget, each sweeping its own partition with the plan the sweep
    set, each iteration's figure the slower rank's update phase, every rank's records kept."""
    out = tmp_path / "sweep2"
    code = main([*TINY, "--accelerator", "cpu", "--devices", "2", "--sweep", "--sweep-plans", "host", "device",
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
    assert "2 ranks, data parallel" in (out / "sweep.md").read_text()


# --- budgets and the command line ---------------------------------------------------------------------------------


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


def test_sweep_defaults_and_its_own_options() -> None:
    invocation = parse_args(["--sweep"])
    sweep = invocation.sweep
    assert sweep is not None and invocation.config is sweep.bench
    assert sweep.plans == ["0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0", "stride:2",
                           "stride:3", "stride:4", "stride:5", "stride:6"] == list(DEFAULT_SWEEP_PLANS)
    assert sweep.steps_per_plan == 3 and sweep.budgets == ["unlimited", "quarter"]
    assert sweep.fixed_steps == 48 and sweep.auto_excluded == 3 and sweep.bench.model is None  # the recipe's
    assert sweep.auto_steps == 10 and sweep.process_steps == 58
    assert sweep.bench.strategies == ["deep_optimizer_states"] and sweep.bench.plans == ["auto"]
    budget = resolve_budget("quarter", 1_000)
    process = sweep.process_config(budget)
    assert (process.steps, process.warmup, process.memory_budget_gib) == (58, 1, budget.gib)
    # no end-to-end window: every iteration of a sweep process is synchronised (its figures are indexed by iteration)
    assert sweep.bench.e2e_steps == 0 and process.e2e_steps == 0
    assert list(process.phase_iterations) == list(range(1, 58))
    assert process.plans == [*DEFAULT_SWEEP_PLANS, "auto"] and process.strategies == ["deep_optimizer_states"]
    custom = parse_args(["--sweep", "--model", "gpt-1b", "--sweep-plans", "host", "stride:3", "--steps-per-plan", "4",
                         "--budgets", "quarter", "20", "--steps", "12", "--warmup", "1"]).sweep
    assert custom is not None and custom.plans == ["host", "stride:3"] and custom.budgets == ["quarter", "20"]
    assert custom.fixed_steps == 8 and custom.auto_excluded == AUTO_MIN_EXCLUDED
    assert parse_args(["--model", "gpt-1b"]).sweep is None
    on_four = parse_args(["--sweep", "--devices", "4"]).sweep
    assert on_four is not None and on_four.devices == 4 and on_four.spec(budget).devices == 4


@pytest.mark.parametrize("argv", [["--sweep", "--plans", "0.5"], ["--budgets", "quarter"], ["--steps-per-plan", "3"],
                                  ["--sweep", "--sweep-plans", "auto"], ["--sweep", "--sweep-plans", "0.5", "0.5"],
                                  ["--sweep", "--steps-per-plan", "1"], ["--sweep", "--budgets", "half"],
                                  ["--sweep", "--memory-budget-gib", "4"], ["--sweep", "--steps", "2"],
                                  ["--sweep", "--sweep-plans", "sideways"], ["--sweep", "--e2e-steps", "2"],
                                  ["--sweep", "--devices", "1", "2"]])
def test_bad_sweep_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_sweep_dry_run_lists_the_processes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--sweep", "--sweep-plans", "0.25", "stride:3", "--budgets", "unlimited", "0.5",
                 "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "2 processes, one per budget, each 10 iterations:" in printed
    assert "2 plans x 3 rounds = 6 iterations (0.25, stride:3)" in printed
    assert "0.5 GiB" in printed and "auto, started cold, spread over rounds 2-3: 4 iterations, the first 3 left out" \
        in printed


# --- figures and targets ------------------------------------------------------------------------------------------


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


def _sweep(plans: list[str]) -> SweepConfig:
    return SweepConfig(bench=BenchConfig(model="debug", steps=6, warmup=3), plans=plans, steps_per_plan=3,
                       budgets=["unlimited"])


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
    sweep = SweepConfig(bench=BenchConfig(model="debug", n_layer=1, n_embd=32, vocab_size=64, seq_len=8,
                                          micro_batch=1, steps=5, warmup=2),
                        plans=["host", "0.5", "stride:2"], steps_per_plan=2, budgets=["unlimited", "quarter"])
    calls: list[tuple[str, int, float | None]] = []

    def fake_launcher(config: BenchConfig, spec: RunSpec, run_dir: Path,
                      extra: dict[str, Any] | None = None) -> dict[str, Any]:
        calls.append((spec.label, config.steps, config.memory_budget_gib))
        run_dir.mkdir(parents=True, exist_ok=True)
        assert extra == {"sweep": {"plans": ["host", "0.5", "stride:2"], "steps_per_plan": 2, "auto_steps": 5}}
        log = str(run_dir / "worker.log")
        if spec.label == "sweep[unlimited]":  # stopped by its time limit during 0.5: only progress.json is left
            done = _process({"host": [(50, 45), (40, 44)], "0.5": [(30, 27)], "stride:2": [(70, 70)]},
                            auto=[90, 80, 37, 38], auto_steps=5)["sweep"]
            (run_dir / PROGRESS_FILE).write_text(json.dumps(done))
            return {**spec.to_dict(), "status": "timeout", "reason": "no result within 60 s (raise --timeout)",
                    "elapsed_s": 60.0, "log": log}
        # the first budget's outputs are already written
        assert len(json.loads((tmp_path / "sweep.json").read_text())["budgets"]) == 1
        assert "**Partial**: written after 1 of 2 budgets" in (tmp_path / "sweep.md").read_text()
        done = _process({"host": [(50, 45), (40, 44)], "0.5": [(30, 27), (39, 39)], "stride:2": [(60, 60), (50, 50)]},
                        auto=[90, 80, 37, 38, 36])
        return {**spec.to_dict(), **done, "elapsed_s": 50.0, "log": log}

    doc = run_sweep(sweep, tmp_path, launcher=fake_launcher, progress=False)
    quarter = doc["budgets"][1]["budget"]["gib"]
    assert quarter == pytest.approx(resolve_budget("quarter", doc["model"]["params"]).gib)
    assert calls == [("sweep[unlimited]", 11, None), ("sweep[quarter]", 11, quarter)]
    budget = doc["budgets"][0]
    # the first round, then auto x2, host, auto x2: stopped in 0.5's second iteration; stride:2 ran only its warm-up
    assert [(p["plan"], p["status"]) for p in budget["plans"]] == [("host", "ok"), ("0.5", "timeout"),
                                                                   ("stride:2", "not run")]
    assert budget["plans"][0]["update_ms"] == 40 and budget["plans"][0]["median_rel_error"] == pytest.approx(0.1)
    assert budget["fixed"]["failed_plan"] == "0.5" and budget["fixed"]["log"] == "runs/unlimited/worker.log"
    a = budget["auto"]  # its iterations so far count, as the fixed plans' do
    assert a["status"] == "ok" and a["update_ms"] == 38 and a["reason"].startswith("4 of 5 iterations")
    t = _targets(budget)
    assert t[NO_OOM]["status"] == "missed" and "sweep process: timeout" in t[NO_OOM]["detail"]
    assert t[AUTO_VS_BEST]["status"] == "met" and t[AUTO_VS_BEST]["value"] == pytest.approx(38 / 40 - 1)
    assert t[AUTO_VS_STRIDES]["status"] == "not measured"

    done = doc["budgets"][1]
    assert done["auto"]["update_ms"] == 37  # warm-up 2: the probe and the first step of its plan left out
    t = _targets(done)
    assert t[AUTO_VS_BEST]["status"] == "met" and t[AUTO_VS_BEST]["value"] == pytest.approx(37 / 39 - 1)
    assert t[AUTO_VS_STRIDES]["status"] == "met" and t[NO_OOM]["status"] == "met"
    assert {t["target"]: t["status"] for t in overall_targets(doc["budgets"])}[NO_OOM] == "missed"

    report = (tmp_path / "sweep.md").read_text()
    assert "Partial" not in report
    for text in ("## Budget: unlimited", "## Budget: quarter (", "| 0.5 | timeout |", "| stride:2 | not run |",
                 "| unlimited | timeout |", "during plan 0.5", "1/3 plans completed", "| auto | ok |",
                 "4 of 5 iterations: the process stopped during plan 0.5"):
        assert text in report, text
    assert json.loads((tmp_path / "sweep.json").read_text())["budgets"][0]["plans"][1]["status"] == "timeout"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_SIGNATURE


def test_the_report_names_autos_host_order_when_it_is_not_id_order() -> None:
    from lightning_dos.bench.sweep.report import _host_order_text

    assert _host_order_text({"lanes": "HDHH", "host_order": [3, 0, 2]}) == ", host lane in order 3 0 2"
    assert _host_order_text({"lanes": "HDHH", "host_order": [0, 2, 3]}) == ""
    assert _host_order_text({"lanes": "HDHH"}) == ""  # records from before the host order was recorded


@pytest.mark.parametrize("budgets", [1, 2])
def test_the_sweep_charts_title_fits_in_the_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   budgets: int) -> None:
    """A one-panel chart is narrower than the title of a GPU host's sweep: it is wrapped, not cut off at both ends."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from lightning_dos.bench import chart

    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "gpt-1b_H200_2026-11-21_runQ3-sweep"
                      / "sweep.json").read_text())
    doc["budgets"] = doc["budgets"] * budgets
    figures = []
    real_save = chart.save
    monkeypatch.setattr(chart, "save", lambda fig, path: figures.append(fig) or real_save(fig, path))
    chart.render_sweep(doc, tmp_path / "sweep.png")
    (fig,) = figures
    title = fig._suptitle
    assert title.get_text().replace("\n", " ") == f"plan sweep: {chart.workload_title(doc)}"
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure as saved (laid out), closed since
    box, page = title.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert ("\n" in title.get_text()) == (budgets == 1)
