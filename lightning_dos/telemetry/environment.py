"""Owns the description of the host a run or a bench ran on: GPUs, CPU, host memory, PCIe link, software versions.

A training run logs it with its facts (:mod:`lightning_dos.telemetry.run_info`); the bench puts it in its reports.

Read without touching CUDA in the parent process (a CUDA context there would hold GPU memory while the
workers run): GPUs and PCIe from ``nvidia-smi`` when it is on the PATH, else the PCIe link from ``/sys``;
GPU name and memory then come from what the first worker reports (:func:`device_info`, called in the worker).
Anything unreadable is None.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

from lightning_dos.planning.placement import GIB

NVIDIA_VENDOR = "0x10de"
#: PCIe transfer rate per lane (GT/s) -> generation.
PCIE_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_SMI_FIELDS = ("index", "name", "memory.total", "pcie.link.gen.current", "pcie.link.gen.max",
               "pcie.link.width.current", "pcie.link.width.max", "driver_version")


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def nvidia_smi_gpus(timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """One dict per GPU from ``nvidia-smi`` (name, memory, PCIe link, driver); empty without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(_SMI_FIELDS):
            continue
        row = dict(zip(_SMI_FIELDS, cells))
        memory_mib = _int_or_none(row["memory.total"])
        gpus.append({
            "index": _int_or_none(row["index"]),
            "name": row["name"],
            "memory_gib": None if memory_mib is None else memory_mib / 1024,
            "pcie_gen": _int_or_none(row["pcie.link.gen.current"]),
            "pcie_gen_max": _int_or_none(row["pcie.link.gen.max"]),
            "pcie_width": _int_or_none(row["pcie.link.width.current"]),
            "pcie_width_max": _int_or_none(row["pcie.link.width.max"]),
            "driver": row["driver_version"],
        })
    return gpus


def _pcie_gen(speed: str) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4."""
    try:
        rate = float(speed.split()[0])
    except (IndexError, ValueError):
        return None
    return PCIE_GEN_BY_RATE.get(rate)


def _read(dev: Path, name: str) -> str:
    return (dev / name).read_text().strip()


def sysfs_pcie_links(root: Path = Path("/sys/bus/pci/devices")) -> list[dict[str, Any]]:
    """PCIe links of NVIDIA display/3D controllers from sysfs: current and max generation and width."""
    links = []
    if not root.is_dir():
        return links
    for dev in sorted(root.iterdir()):
        try:
            vendor = (dev / "vendor").read_text().strip()
            klass = (dev / "class").read_text().strip()
            if vendor != NVIDIA_VENDOR or not klass.startswith("0x03"):
                continue
            links.append({
                "address": dev.name,
                "pcie_gen": _pcie_gen(_read(dev, "current_link_speed")),
                "pcie_gen_max": _pcie_gen(_read(dev, "max_link_speed")),
                "pcie_width": _int_or_none(_read(dev, "current_link_width")),
                "pcie_width_max": _int_or_none(_read(dev, "max_link_width")),
            })
        except OSError:
            continue
    return links


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def hardware_info() -> dict[str, Any]:
    """GPU name/count/memory, CPU model and cores, host RAM and the first GPU's PCIe link (None if unreadable)."""
    gpus = nvidia_smi_gpus()
    pcie: dict[str, Any] | None = None
    if gpus and gpus[0]["pcie_gen"] is not None:
        first = gpus[0]
        pcie = {key: first[key] for key in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")}
        pcie["source"] = "nvidia-smi"
    else:
        links = sysfs_pcie_links()
        if links:
            pcie = {key: links[0][key] for key in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")}
            pcie["source"] = "sysfs"
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count()
    return {
        "gpu_name": gpus[0]["name"] if gpus else None,
        "gpu_count": len(gpus),
        "gpu_memory_gib": gpus[0]["memory_gib"] if gpus else None,
        "gpu_driver": gpus[0]["driver"] if gpus else None,
        "gpus": gpus,
        "cpu_model": cpu_model(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_available": available,
        "host_ram_gib": psutil.virtual_memory().total / GIB,
        "pcie": pcie,
        "platform": platform.platform(),
    }


def device_info(device: Any) -> dict[str, Any]:
    """What a worker ran on (a ``torch.device``): its type and, on a GPU, name, total memory in GiB and count."""
    if device.type != "cuda":
        return {"type": device.type, "name": None, "total_memory_gib": None, "device_count": 0}
    import torch

    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "total_memory_gib": props.total_memory / GIB,
            "device_count": torch.cuda.device_count()}


def merge_worker_device(hardware: dict[str, Any], device: dict[str, Any] | None) -> None:
    """Record the device the workers used, and fill the GPU fields nvidia-smi could not give from it."""
    hardware["bench_device"] = device
    if not device or device.get("type") != "cuda":
        return
    if hardware.get("gpu_name") is None:
        hardware["gpu_name"] = device.get("name")
    if hardware.get("gpu_memory_gib") is None:
        hardware["gpu_memory_gib"] = device.get("total_memory_gib")
    if not hardware.get("gpu_count"):
        hardware["gpu_count"] = device.get("device_count") or 1


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


#: Environment variables that change what a run measures (the CUDA caching allocator's settings, DeepSpeed's pinning).
MEASURED_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "DS_PIN_MEMORY_BACKEND")


def measured_env() -> dict[str, str]:
    """Those of :data:`MEASURED_ENV` that are set, with their values."""
    return {name: os.environ[name] for name in MEASURED_ENV if os.environ.get(name)}


def versions() -> dict[str, str | None]:
    """Versions of python, torch, CUDA (torch's build), lightning, deepspeed and lightning-dos."""
    import torch

    import lightning_dos

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": _package_version("lightning"),
        "deepspeed": _package_version("deepspeed"),
        "lightning-dos": _package_version("lightning-dos") or lightning_dos.__version__,
    }
