"""Calibration and planning replayed on the update records of runs Q-Q3 (benchmarks/, the current plan sweeps).

Each sweep process keeps two planning states: the fixed plans' and ``auto``'s (started cold). Feeding each state's
recorded update phases, in order, to a fresh :class:`Calibrator` as the manager does must give back every prediction
the run logged (the performance model, the calibration rules, the gradients kept on the device and the head start
of today's code are the ones that ran), and the planner, after ``auto``'s two probe update phases, must choose the
plan ``auto`` ran next.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lightning_dos.planning import Calibrator, CostParams, StepMeasurement, best_plan
from lightning_dos.planning.perf_model import predicted_makespan_s
from lightning_dos.planning.plan import Lane, Plan

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GIB = 2**30
#: (run, model, budget) of every sweep of runs Q, Q2 and Q3.
CASES = [("Q", "gpt-1b", "unlimited"), ("Q", "gpt-1b", "quarter"), ("Q", "gpt-2.7b", "unlimited"),
         ("Q", "gpt-2.7b", "quarter"), ("Q2", "gpt-1b", "unlimited"), ("Q2", "gpt-1b", "quarter"),
         ("Q2", "gpt-2.7b", "quarter"), ("Q3", "gpt-1b", "unlimited")]
#: The starting cost values of a bf16 run: the manager sets the bytes of a gradient kept on the device from the
#: optimizer (2 for bf16 gradients), which enters the memory a plan needs. Runs Q-Q3 streamed whole subgroups through
#: the device lane's slots (pieces came later): each slot held the largest device-lane subgroup (``slot_params``).
START = CostParams(device_grad_bytes_per_param=2, slot_params=10**12)


def _case(run: str, model: str, budget: str) -> tuple[list[int], list[dict], float | None]:
    """The subgroup sizes, the iterations of that budget's process in order, and its budget in bytes."""
    folder = BENCHMARKS / f"{model}_H200_2026-11-21_run{run}-sweep"
    records = json.loads((folder / "updates.json").read_text())
    report = json.loads((folder / f"sweep{'' if budget == 'unlimited' else '_quarter'}.json").read_text())
    (gib,) = [b["budget"]["gib"] for b in report["budgets"] if b["budget"]["name"] == budget]
    return records["subgroup_sizes"], records[budget]["iterations"], None if gib is None else gib * GIB


def _plan(record: dict) -> Plan:
    """The plan an update record ran: its lanes, buffers and host order."""
    return Plan(lanes=tuple(Lane.DEVICE if c == "D" else Lane.HOST for c in record["lanes"]),
                buffers=record["buffers"], host_order=tuple(record["host_order"]))


def _measurement(record: dict, sizes: list[int]) -> StepMeasurement:
    """The manager's StepMeasurement of one recorded update phase."""
    device = sum(size for size, lane in zip(sizes, record["lanes"]) if lane == "D")
    return StepMeasurement(host_params=sum(sizes) - device, host_busy_s=record["host_compute_ms"] / 1e3,
                           host_overlapped=device > 0, device_params=device,
                           h2d_bytes=round(record["h2d_gb"] * 1e9),
                           h2d_busy_s=(record["prefetch_busy_ms"] + record["upload_busy_ms"]) / 1e3,
                           d2h_bytes=round(record["d2h_gb"] * 1e9), d2h_busy_s=record["flush_busy_ms"] / 1e3,
                           adam_busy_s=record["adam_busy_ms"] / 1e3, predicted_s=record["predicted_ms"] / 1e3,
                           measured_s=record["update_ms"] / 1e3, device_subgroups=record["lanes"].count("D"),
                           lead_s=record["dispatch_lead_ms"] / 1e3)


def _kept(record: dict, sizes: list[int]) -> frozenset[int]:
    """The device-lane subgroups whose gradients stayed on the device: all or none (the planner's rule), told apart
    by the bytes the update phase moved host to device (a gradient on the host adds 4 bytes per parameter)."""
    device = [g for g, lane in enumerate(record["lanes"]) if lane == "D"]
    kept_bytes = sum(sizes[g] * (12 if record["lanes"][g] == "D" else 4) for g in range(len(sizes)))
    on_host_bytes = kept_bytes + 4 * sum(sizes[g] for g in device)
    moved = record["h2d_gb"] * 1e9
    return frozenset(device) if abs(moved - kept_bytes) < abs(moved - on_host_bytes) else frozenset()


@pytest.mark.parametrize("state", ["fixed plans", "auto"])
@pytest.mark.parametrize(("run", "model", "budget"), CASES)
def test_the_calibration_replayed_makes_the_predictions_the_run_logged(run: str, model: str, budget: str,
                                                                       state: str) -> None:
    sizes, iterations, _ = _case(run, model, budget)
    records = [r for it in iterations if (it["plan"] == "auto") == (state == "auto") for r in it["records"]]
    calibrator = Calibrator(START)
    for k, record in enumerate(records):
        if k > 0:  # every update phase after the first is predicted from the ones before it
            params = calibrator.params if record["prefetched_ahead"] else replace(calibrator.params,
                                                                                  dispatch_lead_s=0.0)
            predicted = predicted_makespan_s(_plan(record), sizes, params, _kept(record, sizes))
            assert predicted * 1e3 == pytest.approx(record["predicted_ms"], rel=1e-6), k
        calibrator.observe(_measurement(record, sizes))
    assert calibrator.observations == len(records) >= 24


@pytest.mark.parametrize(("run", "model", "budget"), CASES)
def test_the_planner_replayed_after_the_probe_chooses_the_plan_auto_ran(run: str, model: str, budget: str) -> None:
    """``auto``'s probe (the host lane alone, then half the subgroups on the device lane, demoted to fit the budget
    where it had to be) and the planner's choice from those two update phases: lanes, buffers and host order."""
    sizes, iterations, limit = _case(run, model, budget)
    auto = [r for it in iterations if it["plan"] == "auto" for r in it["records"]]
    assert auto[0]["lanes"].count("D") == 0 and auto[1]["lanes"].count("D") > 0
    assert [r["source"] for r in auto[:2]] in (["probe", "probe"], ["probe", "probe+demoted"])
    calibrator = Calibrator(START)
    for record in auto[:2]:
        calibrator.observe(_measurement(record, sizes))
    chosen = best_plan(sizes, calibrator.params, limit, 2, frozenset(range(len(sizes))))
    assert (chosen.lane_letters(), chosen.buffers, list(chosen.host_order)) == \
        (auto[2]["lanes"], auto[2]["buffers"], auto[2]["host_order"])
