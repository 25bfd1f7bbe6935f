"""Calibration replayed on update phases measured on a GPU host (run G's plan sweep, docs/benchmarks).

``auto`` runs only mixed plans after its probe, so its calibrator never sees the host lane without DMA beside it.
Replaying the host-lane measurements of that process must leave an uncontended CPU Adam rate that predicts the
host-only plan the fixed-plan process measured on the same machine, instead of the reference host's starting
value, while the contended rate that mixed plans use stays what the measurements say.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lightning_dos.planning import Calibrator, CostParams, StepMeasurement

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
RECORDS = BENCHMARKS / "sweep_gpt-2.7b_H200_2026-11-21_runG_updates.json"


def _host_measurement(record: dict, params: int) -> StepMeasurement:
    host = round((1.0 - record["device_fraction"]) * params)
    return StepMeasurement(host_params=host, host_busy_s=record["host_compute_ms"] / 1e3,
                           host_overlapped=record["device_fraction"] > 0, device_params=params - host, h2d_bytes=0,
                           h2d_busy_s=0.0, d2h_bytes=0, d2h_busy_s=0.0, adam_busy_s=0.0, predicted_s=0.0,
                           measured_s=record["update_ms"] / 1e3)


def test_auto_calibration_predicts_the_host_only_plan_of_the_same_machine() -> None:
    data = json.loads(RECORDS.read_text())
    params = data["params"]
    auto = data["auto"]["steps"]
    assert all(r["device_fraction"] > 0 for r in auto)  # auto never ran the host lane alone
    calibrator = Calibrator(CostParams())
    for record in auto:
        calibrator.observe(_host_measurement(record, params))
    fitted = calibrator.params
    host_only_ms = params / fitted.cpu_adam_params_per_s * 1e3

    measured = [r["host_compute_ms"] for r in data["fixed"]["steps"] if set(r["lanes"]) == {"H"}]
    assert len(measured) >= 2
    assert host_only_ms == pytest.approx(statistics.median(measured), rel=0.10)
    # the reference host's starting value (what the rate stayed at before) is far off on this machine
    assert params / CostParams().cpu_adam_params_per_s * 1e3 < 0.7 * statistics.median(measured)
    # the contended rate follows the mixed plans' measurements
    contended = [(1.0 - r["device_fraction"]) * params / (r["host_compute_ms"] / 1e3) for r in auto[-4:]]
    assert fitted.cpu_adam_params_per_s * fitted.cpu_contention == pytest.approx(statistics.mean(contended), rel=0.10)


RECORDS_H = BENCHMARKS / "sweep_gpt-2.7b_H200_2026-11-21_runH_updates.json"


def _measurement(record: dict, params: int) -> StepMeasurement:
    """The manager's StepMeasurement of one recorded update phase (bytes and busy times as the executor gave them)."""
    device = round(record["device_fraction"] * params)
    return StepMeasurement(host_params=params - device, host_busy_s=record["host_compute_ms"] / 1e3,
                           host_overlapped=device > 0, device_params=device, h2d_bytes=round(record["h2d_gb"] * 1e9),
                           h2d_busy_s=(record["prefetch_busy_ms"] + record["upload_busy_ms"]) / 1e3,
                           d2h_bytes=round(record["d2h_gb"] * 1e9), d2h_busy_s=record["flush_busy_ms"] / 1e3,
                           adam_busy_s=record["adam_busy_ms"] / 1e3, predicted_s=record["predicted_ms"] / 1e3,
                           measured_s=record["update_ms"] / 1e3)


@pytest.mark.parametrize("budget", ["unlimited", "quarter"])
def test_calibration_learns_how_the_duplex_link_splits_between_directions(budget: str) -> None:
    """Run H's auto processes: under the duplex cap H2D ran at ~42 GB/s and D2H at ~50 GB/s.

    Replaying their updates, the H2D rate the model then uses while both directions run (``h2d_bytes_per_s`` times the
    duplex factor) must match the measured one within 3%; an even split of the learnt sum, which is what the
    calibration did before, is more than 7% too fast, and that is the H2D-bound device lane predicted ~9% short.
    """
    data = json.loads(RECORDS_H.read_text())
    params = data["params"]
    steps = data[f"auto_{budget}"]["steps"]
    calibrator = Calibrator(CostParams())
    for record in steps:
        calibrator.observe(_measurement(record, params))
    fitted = calibrator.params
    assert fitted.duplex_scale() < 1  # the cap is active: the learnt sum is below the directions' own rates
    measured_h2d = statistics.median(
        r["h2d_gb"] * 1e9 / ((r["prefetch_busy_ms"] + r["upload_busy_ms"]) / 1e3) for r in steps[-5:])
    measured_d2h = statistics.median(r["d2h_gb"] * 1e9 / (r["flush_busy_ms"] / 1e3) for r in steps[-5:])
    assert fitted.h2d_bytes_per_s * fitted.duplex_scale() == pytest.approx(measured_h2d, rel=0.03)
    assert fitted.d2h_bytes_per_s * fitted.duplex_scale() == pytest.approx(measured_d2h, rel=0.03)
    even_split = fitted.duplex_bytes_per_s * CostParams().h2d_bytes_per_s / (
        CostParams().h2d_bytes_per_s + CostParams().d2h_bytes_per_s)
    assert even_split > 1.07 * measured_h2d


def test_the_learnt_split_keeps_the_plan_and_lengthens_its_prediction() -> None:
    """The figures docs/performance-model.md quotes for the split rule, with 27 equal subgroups standing in for
    gpt-2.7b's real ones: the planner picks the same plan with or without the learnt split (the rule before it
    never moved ``h2d_bytes_per_s`` / ``d2h_bytes_per_s`` under the cap, so they stay at their starting values),
    and predicts it at 486 instead of 464 ms (run H measured 495-526 ms for auto's plan)."""
    from dataclasses import replace

    from lightning_dos.planning import best_plan, predict

    data = json.loads(RECORDS_H.read_text())
    params = data["params"]
    calibrator = Calibrator(CostParams())
    for record in data["auto_unlimited"]["steps"]:
        calibrator.observe(_measurement(record, params))
    learnt = calibrator.params
    even = replace(learnt, h2d_bytes_per_s=CostParams().h2d_bytes_per_s, d2h_bytes_per_s=CostParams().d2h_bytes_per_s)
    sizes = [params // 27] * 26 + [params - 26 * (params // 27)]
    kept = frozenset(range(27))
    plans = [best_plan(sizes, p, None, max_buffers=2, grads_on_device=kept) for p in (learnt, even)]
    assert plans[0].lanes == plans[1].lanes and plans[0].buffers == plans[1].buffers
    assert round(plans[0].device_fraction(sizes), 3) == 0.407
    predicted = [round(predict(plans[0], sizes, p, kept).makespan_s * 1e3) for p in (learnt, even)]
    assert predicted == [486, 464]
