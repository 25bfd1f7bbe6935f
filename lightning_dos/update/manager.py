"""Owns the optimizer-state manager: which plan runs each step, and running it.

The manager sits between the DeepSpeed seam and the executor. It resolves the user's ``plan`` against
the real subgroup sizes (explicit plans) or asks the planner (``"auto"``), reads the device memory that
is free when the update phase begins (``dispatch``, called from ``on_before_optimizer_step``) and demotes
device-lane subgroups to the host if they would not fit, runs the executor, and keeps a record of every
step (plan, timings, bytes) for telemetry. No DeepSpeed import: the optimizer is seen through :class:`ZeroOptimizer`.

``plan="auto"``'s probe, choice, re-plans and trials are :class:`~lightning_dos.planning.auto.AutoPlanner`'s: the
manager calibrates the cost model with every measured step, hands the step to it and carries out its decision.

It also decides where each subgroup's state lives (:mod:`lightning_dos.planning.placement`): resident on the device,
or on the host. Nothing is allocated for the state before that: the first backward keeps every gradient on the device,
and at the first dispatch, once the training's peak is known, the resident subgroups are chosen (``resident_gib``: a
number, or ``"auto"``: as many as fit beside the peak), the memory plan is checked against the box (an error naming
the numbers before anything is allocated, if it cannot hold the run) and the seam makes each home. Residents go back
to the host under memory pressure at later dispatches. The planner weighs the resident subgroups as empty, so one plan
covers the three places.

With ``overlap=True`` the update phase is issued to the executor's worker thread and runs beside the next forward
and backward (:mod:`lightning_dos.update.in_flight`); the manager joins it at the next dispatch, before any plan change
and whenever asked (:meth:`OptimizerStateManager.join`), and records and calibrates it then: a step's record appears
one step later than without overlap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from lightning_dos.planning.auto import AUTO_MAX_BUFFERS, AutoPlanner, CalibratedModel
from lightning_dos.planning.calibration import Calibrator, StepMeasurement
from lightning_dos.planning.perf_model import CostParams, device_memory_bytes, predicted_makespan_s
from lightning_dos.planning.placement import (
    GIB,
    DeviceMemory,
    DoesNotFit,
    Home,
    HostMemory,
    MemoryPlan,
    Placement,
    fill,
    host_bytes_per_param,
    memory_plan,
    place,
    resident_room,
    residents_to_release,
    start_plan,
)
from lightning_dos.planning.plan import Lane, Plan, PlanSpec, parse_plan, resolve_plan
from lightning_dos.planning.planner import demote_to_fit
from lightning_dos.planning.trials import TRIAL_SOURCE
from lightning_dos.update.executor import UpdateExecutor
from lightning_dos.update.host_memory import read_meminfo
from lightning_dos.update.in_flight import InFlightUpdate
from lightning_dos.update.resident import ResidentUpdate, resident_bytes
from lightning_dos.update.subgroup import Subgroup
from lightning_dos.update.timings import LaneTimings

log = logging.getLogger(__name__)

#: Device memory kept free for the allocator's fragmentation and the next forward's first kernels.
SAFETY_MARGIN_BYTES = 1 * GIB
DEFAULT_BUFFERS = 2
#: Format of :meth:`OptimizerStateManager.state_dict`; a checkpoint with another is planned afresh.
PLAN_STATE_VERSION = 1


class ZeroOptimizer(Protocol):
    """What the manager reads and calls of the ZeRO-3 optimizer it runs (the DeepSpeed seam,
    :class:`~lightning_dos.zero.optimizer.InterleavedZeroOptimizer`); nothing else of it is touched here."""

    #: every subgroup has its home (its state exists where it lives)
    placed: bool

    def interleaved_supported(self) -> bool:
        """Whether this configuration is one the interleaved update handles (else DeepSpeed's own update runs)."""

    def attach(self, runner: Any) -> None:
        """Hand every update phase to ``runner`` (this manager)."""

    def subgroup_sizes(self) -> list[int]:
        """Parameters of each subgroup of this rank's partition."""

    def device_grad_bytes_per_param(self) -> int:
        """Bytes per parameter of a gradient kept on the device through backward."""

    def host_grad_bytes_per_param(self) -> int:
        """Bytes per parameter of a host home's gradient."""

    def host_gradient_bytes(self) -> int:
        """Host bytes of DeepSpeed's whole-partition gradient buffer (made only under gradient accumulation)."""

    def home_bytes(self) -> dict[Home, int]:
        """Bytes of state and gradients held in each home now."""

    def make_host_gradients(self, ids: Sequence[int]) -> None:
        """Before placement: only the host gradients the first backward writes, for subgroups that will live there."""

    def place(self, homes: Sequence[Home | None]) -> None:
        """Make or move each subgroup's state in ``homes[i]`` (None: leave it)."""

    def ensure_placed(self) -> None:
        """Place every subgroup not placed yet, where :meth:`OptimizerStateManager.choose_homes` says."""

    def settle(self) -> None:
        """Join the phase in flight and place every subgroup, before a reader of the state."""

    def subgroups(self) -> list[Subgroup]:
        """Every subgroup's tensors and current hyperparameters, for one update phase."""

    def grads_to_host(self, sub_group_ids: Sequence[int]) -> None:
        """Bring the device-kept gradients of these subgroups to their host homes, on the calling thread."""

    def forward_order(self) -> tuple[int, ...]:
        """Subgroup ids in the order the first forward read them (with overlap; empty before it)."""


@dataclass
class PlanningState:
    """Everything that decides the manager's next plans: the plan asked for, the calibration, the plan in force, and
    ``auto``'s state machine (None for any other plan)."""

    spec: PlanSpec
    calibrator: Calibrator
    in_force: Plan
    auto: AutoPlanner | None


@dataclass(frozen=True)
class Dispatched:
    """The plan dispatch fitted to this step's free memory and budget, and what it saw, until its update phase runs."""

    plan: Plan
    free_bytes: int | None
    demoted: tuple[int, ...]
    ahead: int
    """Device-lane prefetches issued at dispatch."""
    device_order: tuple[int, ...]
    host_order: tuple[int, ...]


@dataclass
class Plans:
    """The manager's plans, from the one asked for to the one about to run (one object, read top to bottom)."""

    asked: PlanSpec
    """The user's ``plan``: ``"auto"``, a named plan, a fraction, a list."""
    in_force: Plan
    """The plan the next steps run (``set_plan``, ``auto``'s choices, a checkpoint's)."""
    from_asked: Plan | None
    """``asked`` resolved for the subgroups the lanes share, while it is the plan in force (resolved again when the
    residents change); None for ``auto`` or once a plan was set from outside."""
    for_grads: Plan
    """The plan the next backward places its gradients for: with overlap, a plan put in force at a join runs from the
    step after, so that step's gradients are where its plan reads them."""
    dispatched: Dispatched | None = None
    """This step's plan as dispatch fitted it, until its update phase runs."""


@dataclass
class StepRecord:
    """What one update phase did: the plan that ran, demotions, timings and the free memory seen."""

    step: int
    plan: Plan
    timings: LaneTimings
    free_bytes: int | None
    demoted: tuple[int, ...]
    device_fraction: float
    predicted_s: float
    replanned: bool = False


@dataclass
class _InFlight:
    """An issued update phase (``overlap=True``) and what its record will say."""

    phase: InFlightUpdate
    plan: Plan
    free_bytes: int | None
    demoted: tuple[int, ...]
    predicted_s: float


class OptimizerStateManager:
    """Runs DOS update phases for one rank's ZeRO-3 optimizer (its ``UpdateRunner``, attached by one call)."""

    #: subgroups whose gradients stay on the device through the next backward (the seam reads it)
    device_grad_subgroups: frozenset[int] = frozenset()

    def __init__(
        self,
        optimizer: ZeroOptimizer,
        plan: PlanSpec,
        memory_budget_gib: float | None = None,
        buffers: int | None = None,
        device: torch.device | str = "cpu",
        ranks_per_host: int = 1,
        cost: CostParams | None = None,
        cost_overrides: dict[str, float] | None = None,
        device_gradients: bool = True,
        overlap: bool = False,
        resident_gib: float | str = 0.0,
    ) -> None:
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.memory_budget_bytes = None if memory_budget_gib is None else int(memory_budget_gib * GIB)
        self.measured_room_bytes: int | None = None
        """Placed from a measured peak: the room the residents and the device lane share (None: not so placed)."""
        self.buffers = buffers
        # device-lane gradients stay on the device unless gradients accumulate (then vanilla's host path runs)
        self.device_gradients = device_gradients
        # kept gradients are stored in the optimizer's gradient dtype: the memory they take is a fact, not a rate
        base = cost or CostParams(ranks_per_host=max(1, ranks_per_host),
                                  device_grad_bytes_per_param=optimizer.device_grad_bytes_per_param(),
                                  grad_bytes_per_param=optimizer.host_grad_bytes_per_param())
        if cost_overrides:
            base = base.with_values(cost_overrides, key="cost_overrides")
        self._start_cost = base
        self._cost_overrides = cost_overrides
        self.calibrator = Calibrator(base, overrides=cost_overrides)
        self.active = bool(optimizer.interleaved_supported())
        #: whether update phases run beside the next forward (only where the interleaved update runs)
        self.overlap = overlap and self.active
        sizes = list(optimizer.subgroup_sizes())
        self.ranks_per_host = max(1, ranks_per_host)
        #: ``resident_gib="auto"``: the resident subgroups are chosen at the first dispatch, from the measured peak
        self.resident_auto = resident_gib == "auto"
        self._resident_bytes = None if self.resident_auto else int(float(resident_gib) * GIB)
        #: each subgroup's home and the reading behind it (None until placed: at the first dispatch)
        self.placement: Placement | None = None
        #: the memory plans made so far: before the first step (the best case), then at placement
        self.memory_plans: list[MemoryPlan] = []
        #: residents given back under memory pressure since the start (``auto``)
        self.released: tuple[int, ...] = ()
        #: subgroups whose state lives on the device (``resident_gib``); the planner weighs them as empty. With a
        #: number they are known from the start; with ``"auto"`` once placed
        self.resident: tuple[int, ...] = ()
        #: ``"auto"`` before the first dispatch: the subgroups the device could hold (their homes wait for the peak)
        self.candidates: tuple[int, ...] = ()
        if self.active and self._resident_bytes:
            self.resident = fill(sizes, self._resident_bytes)
        self.subgroup_sizes = sizes
        self.sizes = [0 if i in self.resident else n for i, n in enumerate(sizes)]  # what the planner weighs
        #: ``auto``'s state machine (None for any other plan): the probe first, the planner chooses after it
        self.auto: AutoPlanner | None = self._new_auto() if plan.kind == "auto" else None
        first = self.auto.probes[0] if self.auto is not None else self._resolve(plan)
        self.plans = Plans(asked=plan, in_force=first, from_asked=None if self.auto is not None else first,
                           for_grads=first)
        self.executor = UpdateExecutor(self.device)
        if self.active:  # a fixed device footprint (the host lane's upload ring), allocated before any plan runs
            self.executor.reserve_upload_buffers(max(self.sizes, default=1))
        self.records: list[StepRecord] = []
        self._in_flight: _InFlight | None = None  # the phase issued and not yet joined (overlap)
        if self.active:
            self._plan_gradients()
            optimizer.attach(self)
            self._plan_memory_at_start()

    # ------------------------------------------------------------------ planning
    @property
    def cost(self) -> CostParams:
        """The cost parameters in force (starting values, user overrides, then what calibration learnt)."""
        return self.calibrator.params

    @property
    def lane_budget_bytes(self) -> int | None:
        """What the device lane may take (None: no limit): with ``memory_budget_gib``, the budget less the resident
        subgroups' state; placed from a measured peak, no more than the room that peak left less the residents' state.
        The memory free at a dispatch is no limit by itself: the next forward and backward take their activations
        back (at 12.1B on one H100 the lane took it and the third backward ran out of memory)."""
        held = resident_bytes(self.subgroup_sizes, self.resident)
        limits = [max(0, bound - held) for bound in (self.memory_budget_bytes, self.measured_room_bytes)
                  if bound is not None]
        return min(limits) if limits else None

    @property
    def plan_model(self) -> CalibratedModel:
        """The performance model as calibrated now, over the subgroups the lanes share and within the lane budget:
        what ``auto`` chooses with, and what decides which gradients stay on the device."""
        budget = self.lane_budget_bytes
        return CalibratedModel(
            self.calibrator, tuple(self.sizes), budget, max_buffers=self.buffers or AUTO_MAX_BUFFERS,
            may_keep=self._all_grads(), grads_budget_bytes=budget if self.device.type == "cuda" else None,
        )

    def _all_grads(self) -> frozenset[int]:
        """For planning: every device-lane subgroup would keep its gradient on the device (if they may)."""
        return frozenset(range(len(self.sizes))) if self.device_gradients else frozenset()

    def _resolve(self, spec: PlanSpec) -> Plan:
        """A named plan for the subgroups the lanes share."""
        return resolve_plan(spec, self.sizes, buffers=self.buffers or DEFAULT_BUFFERS)

    def _new_auto(self) -> AutoPlanner:
        """``auto`` from its start: the probe made for the subgroups the lanes share now."""
        return AutoPlanner(self.sizes, self.buffers or DEFAULT_BUFFERS, lambda: self.plan_model)

    def set_plan(self, plan: Plan) -> None:
        """Replace the plan used from the next step on (call it before the backward of that step)."""
        if len(plan.lanes) != len(self.sizes):
            raise ValueError(f"plan: has {len(plan.lanes)} lanes, this rank has {len(self.sizes)} subgroups")
        self.join()
        self.plans.in_force = plan
        self._plan_gradients()

    def swap_planning(self, state: PlanningState | None) -> PlanningState:
        """Plan from ``state`` from the next step on, and return the planning state it replaces (the objects, not
        copies); None: ``plan="auto"`` from a cold start, as a new run would begin it (the calibration's starting
        values, user overrides kept; the two probe steps; the planner's choice after them). Call it before a backward;
        the records are kept. The plan sweep swaps the fixed plans' state and ``auto``'s in and out of one process
        with it, and a checkpoint's plan state is put in force through it."""
        self.join()
        previous = PlanningState(spec=self.plans.asked, calibrator=self.calibrator, in_force=self.plans.in_force,
                                 auto=self.auto)
        if state is None:
            auto = self._new_auto()
            state = PlanningState(spec=parse_plan("auto"),
                                  calibrator=Calibrator(self._start_cost, overrides=self._cost_overrides),
                                  in_force=auto.probes[0], auto=auto)
        self.plans.asked = state.spec
        self.calibrator = state.calibrator
        self.auto = state.auto
        self.plans.dispatched = None
        self.set_plan(state.in_force)
        return previous

    def state_dict(self) -> dict[str, Any]:
        """The plan state a checkpoint keeps, JSON-serialisable: the plan asked for, the plan in force, what the
        calibration learnt and how far ``auto`` has come (probe done, trials had), so a resumed run plans on from
        there instead of probing again. Records stay behind (they are telemetry, already logged)."""
        self.join()
        # a named plan has no auto progress; its keys are written all the same, so there is one format
        progress = (self.auto.state_dict() if self.auto is not None else
                    {"auto_steps": 0, "replan_checked": 0, "trials": {"incumbent": None, "trials": 0,
                                                                       "exhausted": False}})
        # "base_plan": the saved format's key for the plan in force
        return {"version": PLAN_STATE_VERSION, "plan": self.plans.asked.source, "sizes": list(self.subgroup_sizes),
                "base_plan": self.plans.in_force.to_json(), "calibrator": self.calibrator.state_dict(), **progress}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Plan on from :meth:`state_dict`'s output (call before the next backward). Returns False, changing nothing,
        when the state belongs to another configuration: another ``plan`` or other subgroups (a changed
        ``sub_group_size`` or model), or another format; the run then plans as a new one would."""
        self.join()
        if (state.get("version") != PLAN_STATE_VERSION or state.get("plan") != self.plans.asked.source
                or list(state.get("sizes", ())) != list(self.subgroup_sizes)):
            log.warning("deep_optimizer_states: the checkpoint's plan state (plan %r, %d subgroups of %s parameters) "
                        "is not this run's (plan %r, %d subgroups of %s: another plan, world size or sub_group_size); "
                        "planning starts afresh", state.get("plan"), len(state.get("sizes", ())),
                        f"{sum(state.get('sizes', ())):,}", self.plans.asked.source, len(self.subgroup_sizes),
                        f"{sum(self.subgroup_sizes):,}")
            return False
        calibrator = Calibrator(self._start_cost, overrides=self._cost_overrides)
        calibrator.load_state_dict(state["calibrator"])
        in_force = Plan.from_json(state["base_plan"])
        auto = None
        if self.auto is not None:
            auto = self._new_auto()
            auto.load_state_dict(state)
            if auto.trials.incumbent is not None:
                in_force = auto.trials.incumbent  # a trial under way is dropped: the plan in force runs
        self.swap_planning(PlanningState(spec=self.plans.asked, calibrator=calibrator, in_force=in_force, auto=auto))
        return True

    def _plan_gradients(self) -> None:
        """Before the next backward: the device lane's subgroups keep their gradients on the device, if they fit.

        Their gradients (in the optimizer's gradient dtype, ``device_grad_bytes_per_param``) then live on the device
        from backward to the end of the update, beside the buffer slots; when a budget is set and both do not fit,
        gradients go to the host as in vanilla.
        """
        kept = frozenset(self.resident) | frozenset(self.candidates) if self.device_gradients else frozenset()
        # a candidate has no host gradient before it is placed: the first backward keeps its gradient on the device,
        # and the peak it shows then includes it
        self.device_grad_subgroups = self._kept_grads(self.plans.in_force) | kept
        self.plans.for_grads = self.plans.in_force

    def _kept_grads(self, plan: Plan) -> frozenset[int]:
        """The subgroups of ``plan`` whose gradients stay on the device (the planner's rule, ``kept_grads``): those
        of the plan as dispatch will run it, demoted to fit the budget if its buffer slots do not fit.

        Up to ``b73d0c1`` a plan whose slots did not fit kept none (``grads_for`` gave None), so a named plan that
        ran demoted sent every gradient to the host while the planner weighed it with its gradients kept.
        """
        return self.plan_model.kept_grads(plan)

    def free_device_bytes(self) -> int | None:
        """Device memory free for the device lane now (None: the host stands in, no limit)."""
        if self.device.type != "cuda":
            return None
        free, _total = torch.cuda.mem_get_info(self.device)
        # memory cached by the allocator but unused is free for us too
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + cached)

    def device_memory(self) -> DeviceMemory | None:
        """The device's memory now (None: the host stands in, nothing to measure). The training's peak is the
        allocator's peak allocation since the process began, not what it holds reserved: the blocks it caches are
        free for the resident state (at 11.7B on a GPU host, 42.85 GiB reserved against a peak of 30.61 allocated)."""
        if self.device.type != "cuda":
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        # valid only while nobody resets the allocator's peak before the first dispatch: the bench's meters start
        # at the second batch
        peak = int(torch.cuda.max_memory_allocated(self.device))
        return DeviceMemory(total=int(total), peak=peak, other=max(0, int(total - free - reserved)))

    def host_memory(self) -> HostMemory | None:
        """The whole host's memory now (``MemAvailable``: driver-pinned pages count as used), shared by this run's
        ranks on the host, with what this rank's host homes hold already; None where it cannot be read."""
        reading = read_meminfo()
        if reading is None:
            return None
        held = self.optimizer.home_bytes()[Home.HOST] + self.optimizer.host_gradient_bytes()
        return HostMemory(*reading, ranks=self.ranks_per_host, held=held)

    def _plan_memory_at_start(self) -> None:
        """When the engine is built: the memory plan of the best case the box allows
        (:func:`~lightning_dos.planning.placement.start_plan`). If even that does not fit the host, the run stops here,
        with the numbers, before anything is allocated for its state. The subgroups it keeps resident are the
        candidates, placed at the first dispatch from the measured peak; the others live on the host, and only the
        gradients their first backward writes there are made now: their masters and moments wait for the plan from
        the measured peak, so a run that does not fit it stops with only those allocated. With residents set by hand,
        or nothing to measure, every home is made now."""
        plan = start_plan(self.subgroup_sizes, self.host_memory(), self.device_memory(),
                          self.optimizer.device_grad_bytes_per_param() if self.device_gradients else 0,
                          self.memory_budget_bytes, self._resident_bytes, self.optimizer.host_gradient_bytes(),
                          host_grad_bytes=self.optimizer.host_grad_bytes_per_param())
        self.memory_plans.append(plan)
        self._check_on_every_rank(plan)
        if self._resident_bytes is not None or plan.device is None:
            self._put_in_force(plan.placement)
            self.optimizer.ensure_placed()
            return
        self.candidates = plan.placement.resident
        self.optimizer.make_host_gradients([i for i in range(len(self.sizes)) if i not in self.candidates])
        self._plan_gradients()

    def choose_homes(self, measured: bool = True) -> tuple[Home, ...]:
        """Each subgroup's home, decided now if it is not yet (the seam asks, then places the state there): at the
        first dispatch, ``measured``, the candidates that fit beside the peak the first forward and backward showed
        (which holds their gradients) stay on the device, in id order. If something reads the state before any
        backward (a universal checkpoint's load), the plan at start decides. The memory plan is checked before
        anything is allocated: a run the box cannot hold stops here, with the numbers."""
        if self.placement is None:
            if measured:
                reading = self.device_memory()
                # under accumulation DeepSpeed's boundary writes an fp32 gradient for each resident, which the peak
                # does not show; without, the peak holds the candidates' kept gradients already
                placement = place(self.subgroup_sizes, reading, self.memory_budget_bytes, candidates=self.candidates,
                                  grad_bytes_per_param=0 if self.device_gradients else 4)
                if reading is not None:
                    self.measured_room_bytes = resident_room(reading, slot_bytes=0)
                when = "after the first forward and backward"
            else:
                placement, reading = self.memory_plans[0].placement, self.memory_plans[0].device
                when = "before the first step, with no peak measured"
            plan = memory_plan(self.subgroup_sizes, placement, self.host_memory(), reading, when,
                               host_extra_bytes=self.optimizer.host_gradient_bytes(),
                               host_grad_bytes=self.optimizer.host_grad_bytes_per_param())
            self.memory_plans.append(plan)
            if measured:  # every rank places at its first dispatch; a reader may come to this on one rank alone
                self._check_on_every_rank(plan)
            plan.check()
            self._put_in_force(placement)
        assert self.placement is not None
        return self.placement.homes

    def _check_on_every_rank(self, plan: MemoryPlan) -> None:
        """Raise :class:`DoesNotFit` on every rank if any rank's plan does not fit (a rank stopping alone would leave
        the others waiting in their next collective); the ranks of one host share it, so the node's total on the host
        is checked too. One collective; nothing to agree on with one rank."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            plan.check()
            return
        rank, world = dist.get_rank(), dist.get_world_size()
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, (plan.host_needed, list(plan.problems)))
        problems = [f"rank {r}: {p}" for r, (_, found) in enumerate(everyone) for p in found]
        node = sum(needed for needed, _ in everyone[rank - rank % self.ranks_per_host:][:self.ranks_per_host])
        host = plan.host
        if host is not None and node > host.ranks * host.share:
            problems.append(f"the {self.ranks_per_host} ranks of this host place {node / GIB:.2f} GiB there, and it "
                            f"has {host.ranks * host.share / GIB:.2f} GiB for them")
        plan.check(problems)

    def _put_in_force(self, placement: Placement) -> None:
        """The residents of ``placement`` set, and the plan made again for the subgroups left to the lanes."""
        self.placement = placement
        self.candidates = ()
        self._set_resident(placement.resident)

    def _release_under_pressure(self) -> bool:
        """At a later dispatch, with ``resident_gib="auto"``: give residents back to the host, newest first, when
        something else has taken more than half the headroom (``residents_to_release``); they move to host homes and
        the planner weighs them again. The host must have room for them: if it has not, the run stops with the numbers
        instead of a kill by the kernel. Returns whether the residents changed."""
        placement = self.placement
        if placement is None or placement.memory is None or not self.resident:
            return False
        free = self.free_device_bytes()
        headroom = placement.memory.headroom
        if free is None or free >= headroom // 2:
            return False
        released = residents_to_release(self.resident, self.subgroup_sizes, free, headroom)
        needed = (host_bytes_per_param(self.optimizer.host_grad_bytes_per_param())
                  * sum(self.subgroup_sizes[i] for i in released))
        host = self.host_memory()
        if host is not None and needed > host.room:
            raise DoesNotFit(
                f"deep_optimizer_states: {free / GIB:.2f} GiB free on the device (under half the {headroom / GIB:.2f} "
                f"GiB headroom): subgroups {', '.join(map(str, released))} would go back to the host, which needs "
                f"{needed / GIB:.2f} GiB for them and has {host.room / GIB:.2f} GiB more this rank may "
                "take; free device "
                "memory (whatever else took it), or set a smaller resident_gib or memory_budget_gib")
        log.warning("deep_optimizer_states: %.2f GiB free on the device (under half the %.2f GiB headroom): subgroups "
                    "%s given back to the host", free / GIB, headroom / GIB, ", ".join(map(str, released)))
        self.join()
        homes = tuple(Home.HOST if i in released else home for i, home in enumerate(placement.homes))
        self.optimizer.place(homes)
        self.placement = Placement(homes=homes, room=placement.room, memory=placement.memory)
        self.released += released
        self._set_resident(self.placement.resident)
        return True

    def _set_resident(self, ids: tuple[int, ...]) -> None:
        """The subgroups ``ids`` live on the device from this dispatch on (no phase in flight): they are updated in
        neither lane, and the plan is made again for the subgroups left to the lanes (``auto``: its probe from the
        start if it has not run yet, else the planner's choice with the calibration so far)."""
        self.join()
        kept = tuple(sorted(ids))
        self.executor.resident = ResidentUpdate(kept, self.subgroup_sizes, self.device) if kept else None
        changed = kept != self.resident
        self.resident = kept
        self.sizes = [0 if i in kept else n for i, n in enumerate(self.subgroup_sizes)]
        if self.auto is not None and changed:
            self.set_plan(self.auto.resize(self.sizes))
        elif self.plans.in_force is self.plans.from_asked and changed:  # a plan set from outside is left as it is
            self.set_plan(self._resolve(self.plans.asked))
            self.plans.from_asked = self.plans.in_force
        else:
            self._plan_gradients()

    def dispatch(self) -> Plan:
        """Finalise this step's plan: fit the device lane into the memory free now and within the budget, and issue
        the device lane's first prefetches, so they overlap what runs before the update phase (overflow check,
        gradient norm). The phase still in flight, if any, is joined first (its calibration may change the plan).

        With ``overlap`` the join comes after the backward, so a plan it puts in force runs from the next step: this
        step runs the plan the backward placed its gradients for (none of them then crosses the link here, and the
        host does not wait for such copies before issuing the update). Both lanes then run in the order the forward
        first reads the subgroups (``forward_order``), so the next forward waits for as little as it can."""
        placed = self.plans.for_grads
        self.join()
        if self.active and self.placement is None:
            self.optimizer.ensure_placed()  # the homes are made now, from the peak the first step showed
            placed = self.plans.in_force  # the plan made for the residents runs now, with or without overlap
        elif self.active and self.resident_auto and self._release_under_pressure():
            placed = self.plans.in_force  # the residents changed: the plan made for them runs now, overlap or not
        plan = placed if self.overlap else self.plans.in_force
        free = self.free_device_bytes()
        limit = self.lane_budget_bytes
        if free is not None:
            usable = max(0, free - SAFETY_MARGIN_BYTES)
            limit = usable if limit is None else min(limit, usable)
        demoted: tuple[int, ...] = ()
        if limit is not None and device_memory_bytes(plan, self.sizes, self.cost) > limit:
            plan, demoted_ids = demote_to_fit(plan, self.sizes, limit, self.cost)
            demoted = tuple(demoted_ids)
            log.info("deep_optimizer_states: %d subgroups demoted to the host lane (limit %.2f GiB)",
                     len(demoted), limit / GIB)
        orders = (plan.device_order, plan.host_order)
        if self.overlap:
            first_reads = self.optimizer.forward_order()
            orders = (forward_order(plan.device_order, first_reads), forward_order(plan.host_order, first_reads))
        ahead = 0
        if self.active and self.optimizer.placed:
            ahead = self.executor.prefetch_ahead(plan.lanes, orders[0], plan.buffers, self.optimizer.subgroups())
        self.plans.dispatched = Dispatched(plan, free, demoted, ahead, *orders)
        return plan

    # ------------------------------------------------------------------ the update phase
    @property
    def phase_in_flight(self) -> InFlightUpdate | None:
        """The update phase issued and not yet joined (``overlap``), or None: the seam gates its reads on it."""
        return self._in_flight.phase if self._in_flight is not None else None

    def run_update_phase(self, optimizer: ZeroOptimizer, host_step: Any, inv_scale: torch.Tensor) -> None:
        """The seam's step calls this once per optimizer step: run the update phase of the plan dispatched (with
        ``overlap``: issue it to the worker and return)."""
        self.join()
        if self.plans.dispatched is None:
            self.dispatch()
        dispatched, self.plans.dispatched = self.plans.dispatched, None
        assert dispatched is not None
        plan, free, demoted, ahead = dispatched.plan, dispatched.free_bytes, dispatched.demoted, dispatched.ahead
        order, host_order = dispatched.device_order, dispatched.host_order
        if self.overlap:  # the worker must make no blocking copy: demoted gradients come to the host here
            optimizer.grads_to_host([i for i, lane in enumerate(plan.lanes) if lane == Lane.HOST
                                     and i not in self.resident])
        subgroups = optimizer.subgroups()
        kept = frozenset(sg.index for sg in subgroups if sg.grad_on_device)  # these gradients need no prefetch
        cost = self.cost if ahead else replace(self.cost, dispatch_lead_s=0.0)  # no head start without early ones
        predicted = predicted_makespan_s(plan, self.sizes, cost, grads_on_device=kept)
        if self.overlap:
            phase = self.executor.issue(plan.lanes, order, plan.buffers, subgroups, inv_scale, host_step,
                                        host_order=host_order)
            self._in_flight = _InFlight(phase, plan, free, demoted, predicted)
            return
        timings = self.executor.run(plan.lanes, order, plan.buffers, subgroups, inv_scale, host_step,
                                    host_order=host_order)
        self._record(plan, timings, free, demoted, predicted)

    def join(self, raise_error: bool = True) -> None:
        """Wait for the update phase in flight (``overlap=True``), if any, then record and calibrate it.

        The worker's exception, if it failed, is raised here (unless a gate raised it already, or
        ``raise_error`` is False: on the way out of a run that failed for another reason)."""
        issued, self._in_flight = self._in_flight, None
        if issued is None:
            return
        try:
            timings = issued.phase.join()
        except BaseException:
            if raise_error:
                raise
            return
        if timings is not None:
            self._record(issued.plan, timings, issued.free_bytes, issued.demoted, issued.predicted_s)

    def settle(self) -> None:
        """Join the phase in flight and have every subgroup placed: the optimizer state DeepSpeed holds is then the
        run's, where it lives, for a reader that goes around DeepSpeed's own methods (those do this themselves)."""
        self.join()
        if self.active:
            self.optimizer.settle()

    def close(self) -> None:
        """At the end of a run: join what is in flight (its failure, if any, is raised) and stop the worker."""
        try:
            self.join()
        finally:
            self.executor.close()

    def _record(self, plan: Plan, timings: LaneTimings, free: int | None, demoted: tuple[int, ...],
                predicted: float) -> None:
        record = StepRecord(
            step=len(self.records),
            plan=plan,
            timings=timings,
            free_bytes=free,
            demoted=demoted,
            device_fraction=plan.device_fraction(self.sizes),
            predicted_s=predicted,
        )
        self.records.append(record)
        self._calibrate(record)

    def _calibrate(self, record: StepRecord) -> None:
        """Fold the measured step into the cost model; ``auto``: hand it to the state machine (choose after the probe,
        re-plan on drift, try the plans the model ranks close to the plan in force) and carry out its decision."""
        t = record.timings
        self.calibrator.observe(
            StepMeasurement(
                host_params=t.host_params,
                host_busy_s=t.host_compute_s,  # CPU Adam alone: feeding the device lane is not part of the rate
                host_overlapped=t.device_params > 0 and self.device.type == "cuda",
                device_params=t.device_params,
                h2d_bytes=t.h2d_bytes + t.upload_bytes,
                h2d_busy_s=t.prefetch_busy_s + t.upload_busy_s,
                d2h_bytes=t.d2h_bytes,
                d2h_busy_s=t.flush_busy_s,
                adam_busy_s=t.adam_busy_s,
                predicted_s=record.predicted_s,
                measured_s=t.total_s,
                device_subgroups=t.device_subgroups,
                lead_s=t.lead_s,
            )
        )
        if self.auto is None:
            return
        decision = self.auto.record(record.step, record.plan, t.total_s, in_force=self.plans.in_force)
        if decision.plan is not None:
            self.set_plan(decision.plan)
        record.replanned = decision.replanned
        for note in decision.notes:
            log.info("deep_optimizer_states: %s", note)

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        sizes = self.subgroup_sizes
        total = sum(sizes)
        if not self.active:
            return (
                f"deep_optimizer_states: {len(sizes)} subgroups ({total:,} params on this rank); this configuration "
                "is not supported by the interleaved update, so DeepSpeed's own host-only update runs"
            )
        plan = self.plans.in_force
        resident = self.executor.resident
        kept = (f"; subgroups {', '.join(map(str, self.resident))} ({resident.params:,} params, "
                f"{resident.nbytes / GIB:.2f} GiB) resident on the device, in neither lane"
                if resident is not None else "")
        if self.placement is None:
            kept = ("; the resident subgroups are chosen after the first forward and backward" if self.resident_auto
                    else f"; {len(self.resident)} subgroups resident from the first step")
        return (
            f"deep_optimizer_states: {len(sizes)} subgroups ({total:,} params on this rank, "
            f"largest {max(sizes):,}); {plan}{kept}; device lane runs on {self.device.type}"
            + (" (the host stands in for the device)" if self.device.type != "cuda" else "")
            + ("; each update phase overlaps the next forward" if self.overlap else "")
        )

    def metrics(self) -> dict[str, float]:
        """``dos/*`` values of the last update phase, for Lightning's loggers."""
        if not self.records:
            return {}
        r = self.records[-1]
        t = r.timings
        out = {
            "dos/device_fraction": r.device_fraction,
            "dos/update_ms": t.total_s * 1e3,
            "dos/predicted_update_ms": r.predicted_s * 1e3,
            "dos/replanned": float(r.replanned),
            "dos/trial": float(r.plan.source == TRIAL_SOURCE),
            "dos/prefetch_busy_ms": t.prefetch_busy_s * 1e3,
            "dos/adam_busy_ms": t.adam_busy_s * 1e3,
            "dos/flush_busy_ms": t.flush_busy_s * 1e3,
            "dos/host_busy_ms": t.host_busy_s * 1e3,
            "dos/host_wait_ms": max(0.0, t.host_busy_s - t.host_compute_s) * 1e3,
            "dos/device_busy_ms": t.device_busy_s * 1e3,
            "dos/h2d_gb": (t.h2d_bytes + t.upload_bytes) / 1e9,
            "dos/d2h_gb": t.d2h_bytes / 1e9,
            "dos/demoted_subgroups": float(len(r.demoted)),
            "dos/device_buffer_gib": t.device_buffer_bytes / GIB,
            "dos/prefetched_ahead": float(t.prefetched_ahead),
            "dos/dispatch_lead_ms": t.lead_s * 1e3,
            "dos/resident_subgroups": float(len(self.resident)),
            "dos/resident_gib": resident_bytes(self.subgroup_sizes, self.resident) / GIB,
        }
        if self.placement is not None:
            out["dos/host_state_gib"] = (host_bytes_per_param(self.optimizer.host_grad_bytes_per_param())
                                         * self.placement.params(self.subgroup_sizes, Home.HOST) / GIB)
        if t.host_compute_s > 0:
            out["dos/cpu_adam_gparam_s"] = t.host_params / t.host_compute_s / 1e9
        if r.free_bytes is not None:
            out["dos/free_device_gib"] = r.free_bytes / GIB
        if t.prefetch_busy_s + t.upload_busy_s > 0:
            out["dos/h2d_gb_per_s"] = (t.h2d_bytes + t.upload_bytes) / (t.prefetch_busy_s + t.upload_busy_s) / 1e9
        if t.flush_busy_s > 0:
            out["dos/d2h_gb_per_s"] = t.d2h_bytes / t.flush_busy_s / 1e9
        median = self.calibrator.median_relative_error()
        if median is not None:
            out["dos/median_prediction_error"] = median
        return out


def forward_order(order: Sequence[int], first_read: Sequence[int]) -> tuple[int, ...]:
    """``order``'s subgroups sorted by when the forward first reads them (``first_read``: subgroup ids in that
    order); those it does not read keep their relative order, after the others."""
    rank = {sg: k for k, sg in enumerate(first_read)}
    return tuple(sorted(order, key=lambda sg: rank.get(sg, len(rank))))
