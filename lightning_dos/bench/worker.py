"""Owns one worker process: ``python -m lightning_dos.bench.worker CONFIG RESULT``, in any mode.

Reads ``CONFIG`` (:func:`~lightning_dos.bench.compose.payload`), runs it (a configuration; a sweep's process with a
``sweep`` entry; a ROK run with an ``activations`` entry) and writes what it measured, raw, to ``RESULT``; a failure
too, with a non-zero exit status. A fresh process per run: a fresh CUDA context and memory peak. On several devices
this is rank 0: Lightning starts the other ranks with the same command, their figures are gathered to it, and it
waits for them to exit (:mod:`~lightning_dos.bench.ranks`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_dos.bench import ranks
from lightning_dos.bench.kinds import RunSpec
from lightning_dos.bench.measure import failure, run
from lightning_dos.bench.results import write_json

#: A worker's body: (the config file's payload, the run, its run directory) -> the result to write.
Execute = Callable[[dict[str, Any], RunSpec, Path], dict[str, Any]]


def execute(payload: dict[str, Any], spec: RunSpec, workdir: Path) -> dict[str, Any]:
    """The run of ``payload``: a plan sweep's process if it has a ``sweep`` entry, a ROK placement's run or search
    probe if it has an ``activations`` entry, else one configuration."""
    if "sweep" in payload:
        from lightning_dos.bench.sweep.worker import execute_sweep

        return execute_sweep(payload, spec, workdir)
    if "activations" in payload:
        from lightning_dos.bench.rok.meter import execute_placement

        return execute_placement(payload, spec)
    return run(payload, spec, workdir)


def serve(argv: list[str] | None, execute: Execute = execute) -> int:
    """The worker's entry: ``execute`` the config file's run and write its result (a rank other than 0 writes only
    its failure, beside it); 0 when it succeeded."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m lightning_dos.bench.worker CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    config_path, result_path = Path(args[0]), Path(args[1])
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    spec = RunSpec(**payload["run"])
    try:
        result = execute(payload, spec, config_path.parent)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        result = failure(spec, err)
    ok = result["status"] == "ok"
    rank = ranks.process_rank()
    if rank != 0:
        if not ok:
            ranks.write_failure(result_path, rank, {"status": result["status"], "reason": result.get("reason")})
        return 0 if ok else 1
    write_json(result_path, result)
    return 0 if ok else 1


def exit_now(code: int) -> None:
    """Leave the worker with ``code`` once its result is on disk, skipping interpreter teardown, where a
    library's lingering thread could turn a finished run into a timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the configuration (or sweep process) in ``argv[0]`` and write its result to ``argv[1]``; 0 when it
    succeeded. Rank 0 of a multi-device run returns once the other ranks have exited."""
    code = serve(argv)
    ranks.wait_for_children(succeeded=code == 0)
    return code


if __name__ == "__main__":
    exit_now(main())
