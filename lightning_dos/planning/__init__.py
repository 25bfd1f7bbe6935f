"""Owns the pure planning layer of Deep Optimizer States: plans, the performance model, the planner, calibration,
and ``auto``'s state machine (its probe, choice, re-plans and trials).

Nothing here imports torch, so plans and predictions can be computed, printed and tested on any machine;
the strategy feeds it subgroup sizes and measurements and executes the plans it returns.
"""

from .auto import AutoPlanner
from .calibration import Calibrator, StepMeasurement, probe_plan, probe_plans
from .perf_model import CostParams, Prediction, SubgroupEvent, device_memory_bytes, predict
from .plan import (
    PLAN_HINT,
    Lane,
    Plan,
    PlanSpec,
    even_device_lanes,
    fraction_lanes,
    parse_plan,
    resolve_plan,
    stride_lanes,
)
from .planner import (
    best_plan,
    candidate_lanes,
    candidate_plans,
    demote_to_fit,
    fewer_slots_to_fit,
    grads_for,
    kept_grads,
    largest_first,
    rank_plans,
)

__all__ = [
    "PLAN_HINT",
    "AutoPlanner",
    "Calibrator",
    "CostParams",
    "Lane",
    "Plan",
    "PlanSpec",
    "Prediction",
    "StepMeasurement",
    "SubgroupEvent",
    "best_plan",
    "candidate_lanes",
    "candidate_plans",
    "demote_to_fit",
    "fewer_slots_to_fit",
    "grads_for",
    "kept_grads",
    "largest_first",
    "device_memory_bytes",
    "even_device_lanes",
    "fraction_lanes",
    "parse_plan",
    "predict",
    "probe_plan",
    "probe_plans",
    "rank_plans",
    "resolve_plan",
    "stride_lanes",
]
