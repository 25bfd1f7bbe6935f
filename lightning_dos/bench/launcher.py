"""Owns running one worker process and turning whatever happened into a result.

The parent writes ``config.json`` and starts ``python -m lightning_dos.bench.worker config.json result.json`` in a
new process group from the invocation's directory (a recipe's relative paths mean what they mean to ``lightning-dos
fit``), its output in ``worker.log``; while it waits it samples the memory in use on the whole host, so a worker the
kernel kills still has its peak. A worker that wrote no result is ``oom`` (SIGKILL, most often the kernel's
out-of-memory killer), ``timeout`` or ``failed``, with a reason from its log or from a failed rank's record; one
that wrote what it measured as training ended (:data:`~lightning_dos.bench.measure.TRAINED`) and then died or raised
keeps those figures, ``ok``, its reason saying how it ended. Then the worker's whole process group is killed and
waited for (:func:`end_group`), and the next run reads the host's memory before it starts only once that has stopped
falling (:func:`settled_host_in_use`): the kernel frees an exited worker's shared memory after its processes are gone.
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

from lightning_dos.bench import ranks
from lightning_dos.bench.measure import TRAINED
from lightning_dos.bench.results import read_json
from lightning_dos.bench.settings import ROOT
from lightning_dos.telemetry.callbacks import host_in_use_gib
from lightning_dos.telemetry.host_census import last_reading

WORKER_MODULE = "lightning_dos.bench.worker"
#: Seconds a timed-out worker gets to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 10.0
#: Seconds between two readings of the host's memory in use while a worker runs.
HOST_SAMPLE_S = 0.1
#: Seconds a killed worker's process group gets to be gone before the next run starts.
GROUP_EXIT_S = 60.0
#: The host's memory in use is settled once it fell by less than this (GiB) over the last second ...
HOST_SETTLE_GIB = 0.1
#: ... read for at most this long before a run starts (the kernel frees an exited run's shared memory after it).
HOST_SETTLE_S = 30.0
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


def _read_log(log_path: Path) -> str:
    """The worker's log; empty where it cannot be read."""
    try:
        return log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def log_reason(log_path: Path, max_chars: int = 300) -> str | None:
    """The last line of the log that looks like an error, cut to ``max_chars``."""
    for line in reversed(_read_log(log_path).splitlines()[-400:]):
        text = line.strip()
        if text and _ERROR_LINE.search(text):
            return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
    return None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The live processes of group ``pgid`` (not zombies: their memory is back); empty without ``/proc``."""
    members = []
    for stat in proc_root.glob("[0-9]*/stat"):
        try:  # the fields after the command name, which may hold spaces and brackets
            state, _, pgrp = stat.read_text().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):  # exited while we looked
            continue
        members += [int(stat.parent.name)] if state not in "ZX" and int(pgrp) == pgid else []
    return members


def end_group(proc: subprocess.Popen, timeout_s: float = GROUP_EXIT_S) -> list[int]:
    """SIGKILL the worker's group (ranks left in a collective, a peer's optimizer process), wait until none of it
    lives; those still alive after ``timeout_s``."""
    _signal_group(proc, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while (alive := group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(HOST_SAMPLE_S)
    return alive


def settled_host_in_use(timeout_s: float = HOST_SETTLE_S) -> float | None:
    """The host's memory in use (GiB) once it has stopped falling, or after ``timeout_s``; None where unknown."""
    readings, window = [host_in_use_gib()], round(1.0 / HOST_SAMPLE_S)
    deadline = time.monotonic() + timeout_s
    while readings[-1] is not None and time.monotonic() < deadline:
        if len(readings) > window and readings[-window - 1] - readings[-1] < HOST_SETTLE_GIB:
            break
        time.sleep(HOST_SAMPLE_S)
        readings.append(host_in_use_gib())
    return readings[-1]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the worker's process group, then SIGKILL it if it lingers."""
    for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


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
        reason = f"no result within {timeout_s:g} s (raise --timeout)"
        return {"status": "timeout", "timeout_s": timeout_s, "reason": reason}
    if returncode == -signal.SIGKILL:
        reading = last_reading(_read_log(log_path))  # the last host-memory reading the worker logged
        last = f" (its last reading: {reading[0]}, {reading[1]:.1f} GiB of host memory in use)" if reading else ""
        reason = f"killed by SIGKILL{last}, most likely the kernel's out-of-memory killer (host memory exhausted)"
        return {"status": "oom", "reason": reason}
    if detail and "out of memory" in detail.lower():
        return {"status": "oom", "reason": detail}
    reason = (f"killed by {signal.Signals(-returncode).name}" if returncode is not None and returncode < 0
              and -returncode in signal.valid_signals() else f"worker exited with code {returncode}")
    reason += " without a result"
    return {"status": "failed", "reason": f"{reason}: {detail}" if detail else reason}


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[bool, float | None]:
    """Wait for the worker up to ``timeout_s``; ``(timed out, peak memory in use on the host in GiB)``."""
    deadline = time.monotonic() + timeout_s
    peak = host_in_use_gib()
    while True:
        try:
            proc.wait(timeout=min(HOST_SAMPLE_S, max(0.0, deadline - time.monotonic())))
            return False, peak
        except subprocess.TimeoutExpired:
            now = host_in_use_gib()
            peak = None if peak is None or now is None else max(peak, now)
            if time.monotonic() >= deadline:
                return True, peak


def launch(payload: dict[str, Any], run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``payload`` in a fresh worker process and return its result, whatever happened; every result has
    ``status``, ``reason``, ``returncode``, ``elapsed_s``, ``log`` and the host's memory in use at the worker's peak,
    less what was in use before it started (``host_in_use_gib``; all processes', pages the driver pinned included)."""
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path, result_path, log_path = run_dir / "config.json", run_dir / "result.json", run_dir / "worker.log"
    result_path.unlink(missing_ok=True)
    (run_dir / TRAINED).unlink(missing_ok=True)
    ranks.clear_failures(run_dir)
    config_path.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    command = [sys.executable, "-m", WORKER_MODULE, str(config_path), str(result_path)]
    before = settled_host_in_use()  # not what the last run's exit is still giving back
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"{payload['fit']['command']}\n")  # what it runs, as a user would type it
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=worker_env(),
                                start_new_session=True)
        try:
            timed_out, peak = _wait(proc, timeout_s)
            if timed_out:
                _stop_group(proc)
        except BaseException:  # Ctrl-C: take the worker down with the parent
            _stop_group(proc)
            raise
        # the next run's reading of the host's memory in use before it starts holds none of this one's
        end_group(proc)
    elapsed = time.perf_counter() - started
    result: dict[str, Any] | None = None if timed_out else read_json(result_path)
    if result is None:
        failed_rank = rank_failure(ranks.read_failures(run_dir))  # a failed rank explains a hang of the others too
        result = {**payload["run"], **(failed_rank or classify_exit(proc.returncode, timed_out, timeout_s, log_path))}
    trained = None if result["status"] == "ok" else read_json(run_dir / TRAINED)  # its steps all ran: figures stand
    if trained is not None:
        result = {**trained, "reason": f"trained its {trained['steps']} steps, then ended: {result['reason']}"}
    (run_dir / TRAINED).unlink(missing_ok=True)  # the result holds it now
    in_use = None if peak is None or before is None else max(0.0, peak - before)
    result.update(returncode=proc.returncode, elapsed_s=elapsed, log=str(log_path), host_in_use_gib=in_use,
                  host_in_use_before_gib=before)
    return result
