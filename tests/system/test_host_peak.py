"""``scripts/host_peak.py``: the host's peak memory in use while a command runs, above the baseline, and its exit
status; read here from a stand-in ``/proc/meminfo`` that the command itself changes."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.script_loader import load_script

GIB = 1024**3
MEMINFO = "MemTotal:       {total} kB\nMemFree:        1000 kB\nMemAvailable:   {available} kB\n"


def _meminfo(path: Path, total_gib: float, available_gib: float) -> None:
    path.write_text(MEMINFO.format(total=int(total_gib * GIB / 1024), available=int(available_gib * GIB / 1024)))


def test_the_peak_above_the_baseline_and_the_exit_status(tmp_path: Path) -> None:
    host_peak = load_script("host_peak")
    meminfo = tmp_path / "meminfo"
    _meminfo(meminfo, 100, 90)  # 10 GiB in use before the command
    # the command takes 25 GiB more and exits with 3: the last sample, after it ends, sees the 35 GiB
    grow = (f"from pathlib import Path; Path({str(meminfo)!r}).write_text({MEMINFO!r}.format("
            f"total={int(100 * GIB / 1024)}, available={int(65 * GIB / 1024)})); raise SystemExit(3)")
    report = host_peak.measure([sys.executable, "-c", grow], interval=0.01, meminfo=str(meminfo))
    assert report["returncode"] == 3
    assert report["baseline_gib"] == 10 and report["peak_gib"] == 35 and report["peak_above_baseline_gib"] == 25
    assert host_peak.in_use_bytes(str(meminfo)) == 35 * GIB
