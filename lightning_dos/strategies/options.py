"""Owns the arguments ``DeepOptimizerStatesStrategy`` adds to DeepSpeed's: one field each, documented under it, and
checked together: :meth:`DOSOptions.problems` lists every problem, each naming its key and what to set instead, and
the strategy raises them in one :class:`DOSOptionsError` with the DeepSpeed config's
(:func:`~lightning_dos.strategies.dos.dos_config_problems`). The strategy's constructor keeps these as keyword
arguments with the same names and defaults; its ``Args:`` block is made from the field docstrings here
(:func:`document_options`), so each is written once.
"""

from __future__ import annotations

import ast
import inspect
import numbers
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dos.activations.options import (
    DEFAULT_KEEP_LAST_LAYERS,
    DEFAULT_MIN_TENSOR_BYTES,
    OFFLOAD_PLACEMENTS,
    STRATEGY_KEYS,
    OptionsError,
    validate_options,
)
from lightning_dos.blocks import block_override_problems
from lightning_dos.planning.perf_model import CostParams
from lightning_dos.planning.plan import PlanSpec, parse_plan

__all__ = ["AUTO_SUB_GROUP_MAX", "DOSOptions", "DOSOptionsError", "document_options"]

#: Largest subgroup chosen by ``sub_group_size="auto"``: 1e8 fp32 params = 1.2 GB of master/m/v per subgroup.
AUTO_SUB_GROUP_MAX = 100_000_000


class DOSOptionsError(MisconfigurationException, ValueError):
    """Every problem with the strategy's arguments, one line each. A configuration error in Lightning's sense, and a
    ``ValueError`` as well, as each argument's own check (``parse_plan``, the activation options) raises."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("deep_optimizer_states cannot run with these arguments:" + "".join(
            f"\n  - {problem}" for problem in self.problems))


@dataclass(frozen=True)
class DOSOptions:
    """What a Deep Optimizer States run asks for beyond Lightning's ``DeepSpeedStrategy``, as given (unchecked until
    :meth:`validate`)."""

    plan: Union[str, float, Sequence[str]] = "auto"
    """which lane updates each subgroup. ``"auto"`` lets the performance model choose every step; ``"host"`` updates
    every subgroup on the CPU (vanilla ZeRO-3 offload, with pinned state); ``"device"`` streams every subgroup through
    the accelerator; a float in [0, 1] puts that fraction of the parameters (by size) on the device lane;
    ``"stride:K"`` puts every K-th subgroup there (the reference implementation's rule); a list of
    ``"host"``/``"device"`` gives one lane per subgroup."""

    sub_group_size: Union[int, str] = "auto"
    """parameters per subgroup (ZeRO-3 never splits a tensor, so subgroups are about this size). ``"auto"`` picks
    ``min(1e8, partition / 16)`` from the model once it is built."""

    memory_budget_gib: Optional[float] = None
    """most accelerator memory DOS may keep for the optimizer state: the resident subgroups and the device lane's
    buffers and kept gradients (``None``: whatever is free beside the training, less a headroom and a safety
    margin)."""

    resident_gib: Union[Literal["auto"], float] = "auto"
    """accelerator memory in which to keep optimizer-state subgroups for the whole run, their only home (no host
    copy). ``"auto"`` (the default): when the engine is built, the subgroups the device could hold beside the 16-bit
    parameters are the candidates and the others get their host homes; after the first forward and backward, the
    candidates that fit beside the measured peak, a headroom (8% of the device, at least 2 GiB) and two device-lane
    slots, within ``memory_budget_gib``, are resident and the rest join the host; residents move to the host, newest
    first, if something else later takes more than half the headroom (``lightning_dos.planning.placement``). A
    number: that many GiB, placed when the engine is built; 0: none. Resident subgroups, in id order at 12 bytes per
    parameter (fp32 master and both moments), are updated on the device by fused Adam and never cross the host-device
    link; the plan balances the others, which take 14 bytes per parameter of host memory in 16-bit training (16 in
    fp32). Each choice is printed as a memory plan, and a run the box cannot hold stops before its state is
    allocated; see ``docs/optimizer-state-manager.md``."""

    buffers: Optional[int] = None
    """device-lane buffer slots (prefetch depth); ``None`` lets the planner choose."""

    cost_overrides: Optional[dict[str, float]] = None
    """fixed values for performance-model parameters (e.g. ``{"h2d_bytes_per_s": 25e9}``); calibration never changes
    an overridden parameter. See ``docs/performance-model.md``."""

    pin_memory: bool = True
    """keep offloaded optimizer state in page-locked memory (2-3x faster transfers)."""

    param_persistence: Union[Literal["auto"], bool, int] = "auto"
    """whether ZeRO-3 keeps the 16-bit parameters whole on the device between steps instead of gathering and releasing
    each layer's in every forward and backward (on one GPU that fetch-and-release roughly doubles forward and
    backward). ``"auto"``: yes on one rank (its partition is the whole model already, so persisting costs no memory),
    and on several ranks when a whole 16-bit copy takes at most a quarter of the device memory free when the engine is
    built; ``True``/``False``: always/never; an int: DeepSpeed's ``stage3_param_persistence_threshold`` (parameters of
    at most that many elements persist). A persistence threshold in ``config`` wins."""

    leaf_blocks: Union[Literal["auto"], bool] = "auto"
    """whether ZeRO-3 hooks each repeated block (the transformer blocks: see ``layers``) once instead of every layer in
    it (DeepSpeed's z3 leaf modules; ``lightning_dos.zero.leaf_blocks``): a block's parameters are fetched together
    and its gradients reduced together when its backward ends. ``"auto"``: on one rank (where every parameter
    persists, so the per-layer hooks fetch nothing); ``True``/``False``: always/never (on several ranks a whole block
    is gathered at once and its gradients reduced only when its backward ends: more device memory, later
    communication; not measured). A ``leaf_module`` entry in ``config`` wins."""

    layers: Optional[Union[str, list[str]]] = None
    """the module holding the model's transformer blocks, by name relative to the LightningModule (``"model.layers"``:
    its children are the blocks), or the blocks' own names; for ``leaf_blocks`` and ``activation_offload``. ``None``
    (the default) finds them: the children of the model's largest ``nn.ModuleList``, ``nn.Sequential`` or
    ``nn.ModuleDict`` of one block class (``lightning_dos.blocks``)."""

    layer_types: Optional[list[str]] = None
    """the blocks' classes or class names instead (``["LlamaDecoderLayer"]``): the outermost modules of those classes
    are the blocks."""

    bind_cores: bool = True
    """with several ranks on one host, give each rank's process (its CPU Adam and torch's CPU threads) its own block of
    the host's cores, NUMA node by NUMA node (``lightning_dos.strategies.host_binding``), so one rank's update phase
    does not take another's cores. Nothing changes with one rank per host."""

    stage: int = 3
    """must stay 3: it exists so that a mistaken override is reported clearly instead of silently ignored."""

    offload_optimizer: bool = True
    """must stay true: it exists so that a mistaken override is reported clearly instead of silently ignored."""

    activation_offload: Optional[str] = None
    """where the activations saved for backward go during each training step: ``None`` (stay on the device, the
    default), ``"host"`` (pinned host memory) or ``"nvme"`` (files under ``activation_nvme_path``). Installs
    :class:`~lightning_dos.activations.ActivationOffloadCallback`; see ``docs/activation-offload.md``."""

    activation_nvme_path: Optional[Union[str, Path]] = None
    """an existing, writable directory on a local disk with at least 1 GiB free, for ``activation_offload="nvme"``
    only (DeepSpeed's own ``nvme_path`` is for parameter/optimizer offload)."""

    activation_min_tensor_bytes: int = DEFAULT_MIN_TENSOR_BYTES
    """saved storages smaller than this many bytes stay on the device."""

    activation_keep_last_layers: int = DEFAULT_KEEP_LAST_LAYERS
    """the last this-many transformer blocks keep their activations on the device."""

    overlap: Union[Literal["auto"], bool] = "auto"
    """run each update phase on a worker thread beside the next forward and backward instead of before them (exact:
    every read of a subgroup's params or host gradient waits for that subgroup's update; see
    ``docs/optimizer-state-manager.md``). ``"auto"`` (the default): on where it was measured faster, one rank training
    on a CUDA device with the interleaved update; serial elsewhere (several ranks, a CPU run, a configuration that
    runs DeepSpeed's own update). ``True`` insists (anything else is one error before training); ``False`` runs every
    update phase before the next forward. When on, DeepSpeed's throughput timer is not synchronised unless ``config``
    says otherwise, and each phase's ``dos/*`` record is logged one step later (the last one at the end of
    training)."""

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[str]:
        """Every way these options cannot run, one line each naming the key and what to set instead (empty: none).
        ``activation_nvme_path`` is probed for real (written, read back, its free space measured)."""
        problems: list[str] = []
        try:
            parse_plan(self.plan)
        except ValueError as error:
            problems.append(str(error))
        if not _is_size(self.sub_group_size) and self.sub_group_size != "auto":
            problems.append(f"sub_group_size: {self.sub_group_size!r} is not a positive whole number of parameters; "
                            "set e.g. 50000000 (a few 1e7 to 1e8 per subgroup) or 'auto'")
        budget_ok = self.memory_budget_gib is None or _is_gib(self.memory_budget_gib, finite=False)
        if not budget_ok:
            problems.append(f"memory_budget_gib: {self.memory_budget_gib!r} is not a size; set a size in GiB >= 0 or "
                            "null")
        resident_ok = self.resident_gib == "auto" or _is_gib(self.resident_gib)
        if not resident_ok:
            problems.append(f"resident_gib: {self.resident_gib!r} is not a size; set auto (the default: as much as "
                            "fits beside the training's measured peak), or the GiB of accelerator memory in which to "
                            "keep optimizer state (a number >= 0; 0 keeps all of it on the host)")
        elif (budget_ok and self.resident_gib != "auto" and self.memory_budget_gib is not None
              and self.resident_gib > self.memory_budget_gib):
            problems.append(f"resident_gib: {self.resident_gib} GiB is more than memory_budget_gib "
                            f"({self.memory_budget_gib} GiB), which covers the resident subgroups too; set "
                            "resident_gib <= memory_budget_gib, or resident_gib: auto")
        if self.buffers is not None and not (_is_int(self.buffers) and self.buffers >= 1):
            problems.append(f"buffers: {self.buffers!r} is not a number of device-lane buffer slots; set 1 or more, "
                            "or null to let the planner choose")
        problems += self._cost_override_problems()
        if not (self.param_persistence == "auto" or isinstance(self.param_persistence, bool)
                or (_is_int(self.param_persistence) and self.param_persistence >= 0)):
            problems.append(f"param_persistence: {self.param_persistence!r}; set 'auto', true, false, or a number of "
                            "elements >= 0 (parameters of at most that many elements stay whole on the device)")
        if not (self.leaf_blocks == "auto" or isinstance(self.leaf_blocks, bool)):
            problems.append(f"leaf_blocks: {self.leaf_blocks!r}; set 'auto', true or false")
        problems += block_override_problems(self.layers, self.layer_types)
        if self.stage != 3:
            problems.append(f"stage: deep_optimizer_states needs ZeRO stage 3, got {self.stage}; set stage: 3 (or use "
                            f"strategy: deepspeed_stage_{self.stage} for plain DeepSpeed)")
        if not self.offload_optimizer:
            problems.append("offload_optimizer: deep_optimizer_states keeps the optimizer state in host memory; set "
                            "offload_optimizer: true (or use strategy: deepspeed_stage_3 for a GPU-resident optimizer)")
        try:
            validate_options(self.activation_offload, self.activation_nvme_path, self.activation_min_tensor_bytes,
                             self.activation_keep_last_layers, keys=STRATEGY_KEYS,
                             placements=(None, *OFFLOAD_PLACEMENTS))
        except OptionsError as error:
            problems += error.problems
        if not (self.overlap == "auto" or isinstance(self.overlap, bool)):
            problems.append(f"overlap: {self.overlap!r} is not 'auto', true or false; set overlap: auto (the default: "
                            "on with one CUDA device), true to run the update beside the next forward, or false")
        return problems

    def validate(self) -> None:
        """Raise one :class:`DOSOptionsError` listing every problem (:meth:`problems`), if any."""
        problems = self.problems()
        if problems:
            raise DOSOptionsError(problems)

    def _cost_override_problems(self) -> list[str]:
        if self.cost_overrides is None:
            return []
        if not isinstance(self.cost_overrides, dict):
            return [f"cost_overrides: {self.cost_overrides!r} is not a mapping; set e.g. {{h2d_bytes_per_s: 25e9}} "
                    "or null"]
        try:
            CostParams().with_values(self.cost_overrides, key="cost_overrides")
        except (TypeError, ValueError) as error:
            return [str(error)]
        return []

    # ------------------------------------------------------------------ what the checked values mean
    @property
    def plan_spec(self) -> PlanSpec:
        """The parsed ``plan`` (valid options only)."""
        return parse_plan(self.plan)

    @property
    def auto_sub_group_size(self) -> bool:
        """Whether the subgroup size is chosen from the model once it is built."""
        return self.sub_group_size == "auto"

    @property
    def initial_sub_group_size(self) -> int:
        """The ``sub_group_size`` for DeepSpeed's config before the model is built (``"auto"``: the largest; it is
        chosen when the model is built)."""
        return int(self.sub_group_size) if _is_size(self.sub_group_size) else AUTO_SUB_GROUP_MAX

    @property
    def resident(self) -> Union[Literal["auto"], float]:
        """``resident_gib`` as GiB, or ``"auto"``."""
        return "auto" if self.resident_gib == "auto" else float(self.resident_gib)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_size(value: Any) -> bool:
    """A positive whole number (YAML may give ``5e7`` as a float)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0
            and float(value).is_integer())


def _is_gib(value: Any, finite: bool = True) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= 0
            and (not finite or value < float("inf")))


# ---------------------------------------------------------------------- documentation
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it in the class body), read from the source; empty where the source
    is not shipped."""
    try:
        body = getattr(ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0], "body", [])
    except (OSError, TypeError):
        return {}
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def document_options(doc: str, options: type = DOSOptions) -> str:
    """``doc`` (a Google-style class docstring) with an ``Args:`` entry per field of ``options`` inserted at the top of
    its ``Args:`` block, for ``help()`` and the CLI's ``--help``."""
    entries = "".join(textwrap.fill(f"{name}: {text}", width=116, break_on_hyphens=False, initial_indent=" " * 8,
                                    subsequent_indent=" " * 12) + "\n" for name, text in field_docs(options).items())
    head, marker, tail = doc.partition("    Args:\n")
    return head + marker + entries + tail if marker else doc
