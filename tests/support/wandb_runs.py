"""Read an offline W&B run back once wandb has finished writing it.

``Run.finish()`` hands the run's last records to wandb's own writer process; on a loaded machine the transaction log
(``run-*.wandb``) can still be short of them when ``finish()`` returns (seen in fresh-clone CI runs: a config update,
once a whole history missing). The log ends with an ``exit`` record once the run is complete: wait for it.
"""

from __future__ import annotations

import time
from pathlib import Path

from lightning_dos.telemetry.compare import Run, _wandb_log, read_wandb_run, wandb_records


def read_finished_wandb_run(path: Path, timeout_s: float = 60.0) -> Run:
    """``read_wandb_run(path)`` once its log holds the ``exit`` record (AssertionError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = Path(path) if Path(path).is_file() else _wandb_log(Path(path))
        if log is not None and any(r.WhichOneof("record_type") == "exit" for r in wandb_records(log)):
            return read_wandb_run(path)
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: wandb wrote no exit record within {timeout_s:g} s of finish()")
        time.sleep(0.25)
