"""Run a command and report the whole host's peak memory in use while it ran, above what was in use before it.

``python scripts/host_peak.py --out peak.json -- lightning-dos fit --config recipes/gpt-2.7b.yaml``

Memory in use is ``MemTotal - MemAvailable`` from ``/proc/meminfo``: every process's anonymous memory and the pages
the CUDA driver pinned (which a process's RSS does not show), not the page cache the kernel can reclaim. It is
sampled every ``--interval`` seconds (default 0.05) from the command's start to its end; the report gives the
baseline, the peak, their difference and the command's exit status (a command killed by the kernel for memory exits
with -9). Linux only. The command's own output passes through.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1024**3


def in_use_bytes(meminfo: str = "/proc/meminfo") -> int:
    """``MemTotal - MemAvailable`` of the host now, in bytes."""
    fields = {}
    with open(meminfo) as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def measure(command: list[str], interval: float = 0.05, meminfo: str = "/proc/meminfo") -> dict[str, float]:
    """Run ``command``, sampling the host's memory in use; its exit status and the host's peak above the baseline."""
    baseline = in_use_bytes(meminfo)
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, in_use_bytes(meminfo))
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        returncode = subprocess.run(command, stdin=subprocess.DEVNULL).returncode
    finally:
        done.set()
        sampler.join()
    peak = max(peak, in_use_bytes(meminfo))
    return {"returncode": returncode, "seconds": round(time.perf_counter() - started, 1),
            "baseline_gib": baseline / GIB, "peak_gib": peak / GIB, "peak_above_baseline_gib": (peak - baseline) / GIB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the report here as JSON (also printed)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples (default 0.05)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    report = {"command": command, **measure(command, args.interval)}
    text = json.dumps(report)
    print(f"host_peak: {text}", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if report["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
