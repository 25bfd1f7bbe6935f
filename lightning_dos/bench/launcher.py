"""Owns running one worker process and turning whatever happened into a result.

The parent writes the run's ``config.json`` (:func:`~lightning_dos.bench.compose.payload`), starts ``python -m
lightning_dos.bench.worker config.json result.json`` in a new process group from the invocation's directory (a
recipe's relative paths mean what they mean to ``lightning-dos fit``), its output in ``worker.log`` after the command
it runs, waits up to the timeout and reads ``result.json``. A worker that wrote none is classified: SIGKILL (most often
the out-of-memory killer) ``oom``, the time limit ``timeout``, anything else ``failed``, with a reason from its log or,
on several devices, the first error a failed rank recorded (:mod:`~lightning_dos.bench.ranks`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lightning_dos.bench import compose, ranks
from lightning_dos.bench.config import BenchConfig
from lightning_dos.bench.kinds import ROOT, RunSpec

WORKER_MODULE = "lightning_dos.bench.worker"
#: Seconds a timed-out worker gets to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 10.0
#: Launcher or distributed settings of an enclosing job that would confuse a single-process worker.
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT", "PL_TRAINER_GPUS", "SLURM_NTASKS")
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Killed|out of memory)", re.IGNORECASE)


def worker_env() -> dict[str, str]:
    """The parent's environment (TORCH_EXTENSIONS_DIR included, so no op is rebuilt) for a worker."""
    env = {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def log_reason(log_path: Path, max_chars: int = 300) -> str | None:
    """The last line of the log that looks like an error, cut to ``max_chars``."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-400:]
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        if text and _ERROR_LINE.search(text):
            return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
    return None


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the worker's process group, then SIGKILL it if it lingers."""
    for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _reap_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the worker's process group once rank 0 has exited (ranks hung in a collective)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def rank_failure(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Status and reason of a run whose rank 0 wrote no result, from the failures other ranks recorded (the first
    rank's; the others' ranks named), or None when none did."""
    if not failures:
        return None
    first = failures[0]
    reason = f"rank {first.get('rank')}: {first.get('reason')}"
    others = [str(f.get("rank")) for f in failures[1:]]
    if others:
        reason += f" (also failed: rank {', '.join(others)})"
    return {"status": first.get("status") or "failed", "reason": reason}


def classify_exit(returncode: int | None, timed_out: bool, timeout_s: float, log_path: Path) -> dict[str, Any]:
    """Status and reason of a worker that wrote no result."""
    detail = log_reason(log_path)
    if timed_out:
        return {"status": "timeout", "reason": f"no result within {timeout_s:g} s (raise --timeout)"}
    if returncode == -signal.SIGKILL:
        reason = "killed by SIGKILL, most likely the kernel's out-of-memory killer (host memory exhausted)"
        return {"status": "oom", "reason": reason}
    if detail and "out of memory" in detail.lower():
        return {"status": "oom", "reason": detail}
    reason = f"worker exited with code {returncode} without a result"
    return {"status": "failed", "reason": f"{reason}: {detail}" if detail else reason}


def launch(config: BenchConfig, spec: RunSpec, run_dir: Path, timeout_s: float | None = None,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``spec`` in a fresh worker process and return its result, whatever happened (``extra``: a mode's entries
    of its config file); every result has ``status``, ``reason``, ``returncode``, ``elapsed_s`` and ``log``."""
    timeout_s = config.timeout_s if timeout_s is None else timeout_s
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path, result_path, log_path = run_dir / "config.json", run_dir / "result.json", run_dir / "worker.log"
    result_path.unlink(missing_ok=True)
    ranks.clear_failures(run_dir)
    payload = compose.payload(config, spec, run_dir, extra)
    config_path.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    command = [sys.executable, "-m", WORKER_MODULE, str(config_path), str(result_path)]
    started = time.perf_counter()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"{payload['fit']['command']}\n")  # what it runs, as a user would type it
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=worker_env(),
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
        except BaseException:  # Ctrl-C: take the worker down with the parent
            _stop_group(proc)
            raise
        _reap_group(proc)
    elapsed = time.perf_counter() - started
    result: dict[str, Any] | None = None
    if result_path.is_file() and not timed_out:
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            result = None
    if result is None:
        failed_rank = rank_failure(ranks.read_failures(run_dir))  # a failed rank explains a hang of the others too
        result = {**spec.to_dict(), **(failed_rank or classify_exit(proc.returncode, timed_out, timeout_s, log_path))}
    result.update(returncode=proc.returncode, elapsed_s=elapsed, log=str(log_path))
    return result
