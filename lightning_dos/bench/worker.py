"""Owns one worker process: ``python -m lightning_dos.bench.worker CONFIG RESULT``, for any study.

Trains ``CONFIG``'s run (with a plan sweep's or a ROK placement's callbacks when it has their entry) and writes what
it measured, raw, to ``RESULT``; a failure too. A fresh process per run: a fresh CUDA context and memory peak. It
offers itself to the kernel's out-of-memory killer first: a host out of memory ends the worker, not the study. On
several devices this is rank 0; the ranks Lightning starts report to it (:mod:`~lightning_dos.bench.ranks`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from lightning_dos.bench import ranks
from lightning_dos.bench.measure import failure, run
from lightning_dos.bench.results import write_json
from lightning_dos.bench.settings import Run


def execute(payload: dict[str, Any], spec: Run, workdir: Path) -> dict[str, Any]:
    """The run of ``payload``: a plan sweep's process, a ROK placement's run, or one configuration."""
    if "sweep" in spec.extra:
        from lightning_dos.bench.sweep.worker import execute_sweep

        return execute_sweep(payload, spec, workdir)
    if "activations" in spec.extra:
        from lightning_dos.bench.rok.meter import execute_placement

        return execute_placement(payload, spec)
    return run(payload, spec, workdir)


def serve(argv: list[str]) -> int:
    """Execute the config file's run and write its result (a rank other than 0 writes only its failure, beside it);
    0 when it succeeded."""
    if len(argv) != 2:
        print("usage: python -m lightning_dos.bench.worker CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    config_path, result_path = Path(argv[0]), Path(argv[1])
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    spec = Run(**payload["run"])
    try:
        result = execute(payload, spec, config_path.parent)
    except Exception as err:  # every failure becomes a result; the traceback goes to the log
        traceback.print_exc()
        result = failure(spec, err)
    ok = result["status"] == "ok"
    rank = ranks.process_rank()
    if rank == 0:
        write_json(result_path, result)
    elif not ok:
        ranks.write_failure(result_path, rank, {"status": result["status"], "reason": result.get("reason")})
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the configuration in ``argv[0]`` and write its result to ``argv[1]``; 0 when it succeeded. Rank 0 of a
    multi-device run returns once the other ranks have exited."""
    try:  # the kernel's out-of-memory killer takes the process with the highest score first
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass
    code = serve(sys.argv[1:] if argv is None else argv)
    ranks.wait_for_children(succeeded=code == 0)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, where a library's lingering thread could turn a run into a timeout
