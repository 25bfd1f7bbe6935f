"""Owns what a run reports about itself: metrics to Lightning's loggers, the run's identity and facts, comparisons.

``callbacks`` holds the callbacks every ``lightning-dos`` run gets (validation report, ``perf/*`` metrics, the stop
at a non-finite loss, ``dos/*`` metrics of every update phase); ``loggers`` the W&B logger the recipes name
(:class:`~lightning_dos.telemetry.loggers.DOSWandbLogger`); ``run_info`` the run identity and the facts logged at fit
start; ``records`` the lane timeline and plan table built from the manager's step records; ``compare`` the
``lightning-dos compare`` tool; ``environment`` the description of the host (hardware, versions); ``peak_memory``
peak host and GPU memory; ``host_census`` and ``device_peak`` where the host's memory went and what was live on the GPU
at the training's peak. It reads the engine (strategies, the manager's records) and is read by the bench; the
engine never imports it. Import from the modules (this file imports none of them: ``loggers`` chooses between W&B
and CSV when it is imported).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``lightning_dos.telemetry.DOSWandbLogger`` (what the logger fragment's ``class_path`` names) and
    ``lightning_dos.telemetry.DevicePeakLog`` (a callback a user adds): short public names, imported when first asked
    for."""
    if name == "DOSWandbLogger":
        from lightning_dos.telemetry.loggers import DOSWandbLogger

        return DOSWandbLogger
    if name == "DevicePeakLog":
        from lightning_dos.telemetry.device_peak import DevicePeakLog

        return DevicePeakLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
