"""Owns what every mode's markdown report shares: the number formats, tables, a JSON block, the title and the
hardware, versions and model text. Each report (report.md, sweep.md, rok.md) formats its JSON with these and computes
nothing new.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MISSING = "–"


def num(value: float | None, digits: int = 1) -> str:
    """``value`` with ``digits`` decimals and thousands separators; :data:`MISSING` for None."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None) -> str:
    """``1.23x``."""
    return MISSING if value is None else f"{value:.2f}x"


def sig(value: float | None) -> str:
    """Three significant digits."""
    return MISSING if value is None else f"{value:.3g}"


def sci(value: float | None) -> str:
    """Scientific notation, ``1.23e-04``."""
    return MISSING if value is None else f"{value:.2e}"


def pct(value: float | None, signed: bool = False) -> str:
    """A share as a percentage, ``12.3%`` (``+12.3%`` when ``signed``)."""
    if value is None:
        return MISSING
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def scaled(value: float, unit: str) -> str:
    """``2.8e9`` -> ``2.80 B``-style with K/M/B/T prefixes (``unit`` appended)."""
    for factor, prefix in ((1e12, "T"), (1e9, "B" if not unit else "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table's lines (``|`` in a cell escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def section(title: str, text: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``## title``, ``text`` and the table of ``rows``, then a blank line; nothing without rows."""
    return ["## " + title, "", text, "", *table(header, rows), ""] if rows else []


def json_block(data: Any) -> list[str]:
    """``data`` as an indented JSON code block."""
    return ["```json", *json.dumps(data, indent=2).splitlines(), "```"]


def heading(doc: dict[str, Any], mode: str, interrupted: str, note: str | None = None) -> list[str]:
    """A report's title (the mode, the model, the device) and date, then ``interrupted`` when the run was and
    ``note`` if any, then the hardware and versions sections."""
    device = doc["hardware"].get("gpu_name") or "CPU"
    lines = [f"# lightning-dos {mode}: {doc['config']['model']} on {device}", "", f"Date: {doc['date']}", ""]
    lines += [interrupted, ""] if doc.get("interrupted") else []
    return lines + ([note, ""] if note else []) + environment_lines(doc)


def devices_text(devices: Sequence[int]) -> str:
    """``one``, or ``1 and 2 (--devices)``: how many devices each configuration ran on."""
    counts = [str(d) for d in devices]
    if counts == ["1"]:
        return "one"
    return (", ".join(counts[:-1]) + " and " + counts[-1] if len(counts) > 1 else counts[0]) + " (--devices)"


def hardware_lines(hw: dict[str, Any], devices: Sequence[int] = (1,)) -> list[str]:
    """The host's table: GPUs (and how many each configuration used), CPU, cores, RAM, PCIe link, platform."""
    if hw.get("gpu_count"):
        gpu = f"{hw['gpu_count']} x {hw.get('gpu_name') or 'unknown GPU'}"
        if hw.get("gpu_memory_gib"):
            gpu += f", {hw['gpu_memory_gib']:.1f} GiB each"
        if hw.get("gpu_driver"):
            gpu += f" (driver {hw['gpu_driver']})"
        gpu += f"; each configuration uses {devices_text(devices)}"
    else:
        gpu = "none (accelerator: CPU)"
    cores = (f"{hw.get('cpu_cores_physical')} physical / {hw.get('cpu_cores_logical')} logical cores, "
             f"{hw.get('cpu_cores_available')} available to the bench")
    pcie = hw.get("pcie")
    if pcie:
        link = f"Gen {pcie.get('pcie_gen') or '?'} x{pcie.get('pcie_width') or '?'}"
        link += f" (max Gen {pcie.get('pcie_gen_max') or '?'} x{pcie.get('pcie_width_max') or '?'}"
        link += f"; from {pcie['source']}; an idle GPU may report a lower current generation)"
    else:
        link = "not readable (no nvidia-smi, no NVIDIA device in /sys)"
    rows = [
        ("GPU", gpu),
        ("CPU", f"{hw.get('cpu_model') or 'unknown'}"),
        ("CPU cores", cores),
        ("Host RAM", f"{num(hw.get('host_ram_gib'))} GiB"),
        ("PCIe (first GPU)", link),
        ("Platform", str(hw.get("platform"))),
    ]
    return table(("", ""), rows)


def environment_lines(doc: dict[str, Any]) -> list[str]:
    """The hardware and versions sections of every report."""
    versions = doc["versions"]
    lines = ["## Hardware", ""]
    lines += hardware_lines(doc["hardware"], doc["config"].get("devices") or [1])
    lines += ["", "## Versions", ""]
    lines += table(tuple(versions), [tuple(str(v) if v is not None else MISSING for v in versions.values())])
    return lines


def model_text(model: dict[str, Any]) -> str:
    """The model's shape, parameters and FLOPs per token (a module other than the GPT: its class)."""
    if not model.get("params"):
        return str(model.get("preset"))
    return (f"{model['preset']} ({model['style']}): {model['n_layer']} layers, n_embd {model['n_embd']}, "
            f"{model['n_head']} heads ({model['n_kv_head']} kv), MLP {model['intermediate_size']}, "
            f"vocab {model['vocab_size']}; {scaled(model['params'], '')} parameters ({model['params']:,}), "
            f"{scaled(model['flops_per_token'], 'FLOP')} per token (model FLOPs, recomputation not counted)")
