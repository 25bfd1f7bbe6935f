"""Owns the activation placements the ROK curve compares: activation checkpointing on or off, and where the offload puts
the tensors saved for backward. The offload placements are TBA's: offloading *instead of* recomputation, so backward
computes nothing twice. No torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PLACEMENTS", "Placement", "placement"]


@dataclass(frozen=True)
class Placement:
    """One point of the ROK curve."""

    name: str  # What ``--activations`` takes.
    checkpointing: bool  # Activation checkpointing in the model: each block's internals recomputed in backward.
    offload: str | None  # The activation offload's placement (``"host"``, ``"nvme"``), or None: nothing moves.
    summary: str  # One line for the help, the dry run and the report.

    @property
    def hook_placement(self) -> str:
        """The ``ActivationOffloadCallback`` placement of a run that has the hooks on: ``"keep"`` measures only."""
        return self.offload or "keep"


#: Every placement, in the order they run and are reported (the reference, ``keep``, first).
PLACEMENTS: dict[str, Placement] = {p.name: p for p in (
    Placement("keep", False, None, "no activation checkpointing, nothing offloaded: every activation stays on the "
              "device (the reference)"),
    Placement("recompute", True, None, "activation checkpointing (each block's internals recomputed in backward), "
              "nothing offloaded"),
    Placement("offload-host", False, "host", "no checkpointing; the tensors saved for backward go to pinned host "
              "memory during forward and come back ahead of backward (TBA's offload)"),
    Placement("offload-nvme", False, "nvme", "no checkpointing; the tensors saved for backward go to files under "
              "--nvme-path (through host buffers) and come back ahead of backward"),
)}


def placement(name: str) -> Placement:
    """The placement called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise ValueError(f"--activations: unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}") from None
