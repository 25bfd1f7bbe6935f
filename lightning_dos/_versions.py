"""Owns the supported version ranges of DeepSpeed and Lightning, and the early check against them.

The DeepSpeed seam (``lightning_dos.zero``) reads private attributes of ZeRO-3 that change between
releases; it was written against deepspeed 0.19.x and lightning 2.6.x, so anything else fails here,
before a Trainer is built, instead of deep inside an optimizer step.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SUPPORTED = {"deepspeed": ((0, 19), (0, 20)), "lightning": ((2, 6), (2, 7))}


def _major_minor(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def supported_range(package: str) -> str:
    (lo_maj, lo_min), (hi_maj, hi_min) = SUPPORTED[package]
    return f">={lo_maj}.{lo_min},<{hi_maj}.{hi_min}"


def check_versions(installed: dict[str, str] | None = None) -> None:
    """Raise ``ImportError`` naming the supported range if an installed version is outside it."""
    problems = []
    for package, (low, high) in SUPPORTED.items():
        if installed is not None and package in installed:
            found = installed[package]
        else:
            try:
                found = version(package)
            except PackageNotFoundError:
                problems.append(f"{package} is not installed (lightning-dos needs {package}{supported_range(package)})")
                continue
        if not (low <= _major_minor(found) < high):
            problems.append(
                f"{package}=={found} is not supported: lightning-dos needs {package}{supported_range(package)} "
                f"(pip install '{package}{supported_range(package)}')"
            )
    if problems:
        raise ImportError("; ".join(problems))
