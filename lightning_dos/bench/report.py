"""Owns report.md: a study's tables beside its JSON and chart. It formats the JSON and computes nothing new; each
study gives its tables (:class:`Table`), this module the head (what ran, where, with what) and the number formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MISSING = "–"


@dataclass
class Table:
    title: str
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    note: str = ""  # one line under the title: what the figures are


def num(value: float | None, digits: int = 1) -> str:
    """``value`` with ``digits`` decimals and thousands separators; :data:`MISSING` for None."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None) -> str:
    """``1.23x``."""
    return MISSING if value is None else f"{value:.2f}x"


def pct(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1%}"


def count(value: float | None) -> str:
    """``2.78B``, ``168K``: a parameter count."""
    if value is None:
        return MISSING
    factor, prefix = next(((f, p) for f, p in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if abs(value) >= f), (1, ""))
    return f"{value / factor:.3g}{prefix}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table's lines (``|`` in a cell escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]


def host_text(hw: dict[str, Any]) -> str:
    """GPUs, CPU, cores and RAM in one line."""
    gpu = (f"{hw['gpu_count']} x {hw.get('gpu_name')}" + (f" ({hw['gpu_memory_gib']:.0f} GiB)"
                                                          if hw.get("gpu_memory_gib") else "")
           if hw.get("gpu_count") else "no GPU")
    return (f"{gpu}; {hw.get('cpu_model') or 'unknown CPU'}, {hw.get('cpu_cores_available')} cores available; "
            f"{num(hw.get('host_ram_gib'))} GiB host RAM")


def render(doc: dict[str, Any], tables: Sequence[Table], chart: str | None, data: str) -> str:
    """report.md of a study's JSON document ``doc`` (its file: ``data``) with ``tables`` and ``chart``."""
    cfg, model = doc["config"], doc["model"]
    device = doc["hardware"].get("gpu_name") or "CPU"
    params = f", {count(model['params'])} parameters" if model.get("params") else ""
    sizes = doc.get("sizes")
    workload = (f"GPT sizes {count(sizes[0]['params'])} to {count(sizes[-1]['params'])} (the blocks of "
                f"{cfg['model']} grown)" if sizes else f"{cfg['model']}{params}")
    lines = [f"# lightning-dos bench {cfg.get('study', 'compare')}: {workload} on {device}", "",
             f"- Date: {doc['date']}; host: {host_text(doc['hardware'])}",
             "- Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()),
             *(["- Environment: " + ", ".join(f"`{k}={v}`" for k, v in doc["environment"].items())]
               if doc.get("environment") else []),
             f"- Command: `{cfg.get('command') or 'lightning-dos bench'}`",
             f"- Each run: `lightning-dos fit --config {cfg['recipe']} --config configs/strategy/<fragment>.yaml` "
             "with the row's and the study's settings (the command is the first line of its `worker.log`); "
             f"micro-batch {cfg['micro_batch']} x seq {cfg['seq_len']}, {cfg['precision']}, {cfg['data']} data, "
             f"seed {cfg['seed']}",
             f"- {doc['measurement']['timing']}"]
    if doc.get("interrupted"):
        lines.append("- **Interrupted**: the runs after the interruption were not made.")
    for table in tables:
        lines += ["", f"## {table.title}", ""] + ([table.note, ""] if table.note else [])
        lines += markdown_table(table.header, table.rows) if table.rows else ["(none)"]
    if chart:
        lines += ["", f"![{cfg.get('study', 'compare')}]({chart})"]
    return "\n".join(lines + ["", f"Every figure, raw sample and setting: `{data}`; each run's command, config and "
                              "log: `runs/`.", ""])
