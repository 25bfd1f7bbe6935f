"""Render the results tables of the README and docs/results.md, and the index of benchmarks/, from the reports' JSON.

``benchmarks/manifest.yaml`` says which report (and which row of its JSON) answers which row of each table; this
script writes each table between the marker comments of the files it names, and the index of every report folder
into benchmarks/README.md. No figure is typed into those files: each comes from a committed report's JSON::

    python scripts/render_results.py           # rewrite the tables and the index
    python scripts/render_results.py --check   # exit 1, naming the files, where the committed text differs

A table's block in a file: ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` (the index's NAME is ``index``).
The manifest's header says how a cell is written.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = "benchmarks"
MANIFEST = "manifest.yaml"
#: a report folder's pages and JSON, by the names the bench and the scripts write
PAGES = ("report.md", "sweep.md", "sweep_quarter.md", "rok.md", "sizes.md")
RAW = ("updates.json", "iterations.json")  # records beside a report, summarised by its JSON
FOLDER = re.compile(r"(?P<model>[^_]+)_(?P<hardware>[^_]+)_(?P<date>\d{4}-\d\d-\d\d)_(?P<tag>[^_]+)")
FIELD = re.compile(r"\{([^{}]+)\}")
SPEC = re.compile(r"[<>=^]?[+\- ]?#?0?\d*[,_]?(\.\d+)?[a-z%]?")
VARIABLE = re.compile(r"\$(\w+)")
OPERATOR = re.compile(r"\s+([-+*/])\s+")


class ManifestError(ValueError):
    """A manifest entry that does not resolve against its report."""


# ----------------------------------------------------------------------------------------- reading the reports
def load(path: Path) -> Any:
    """A report's JSON (a ``.jsonl`` file: the list of its lines)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def reports(root: Path) -> list[Path]:
    """Every report JSON under benchmarks/ (one or more per folder; the raw records beside them are not reports)."""
    found = [*(root / BENCHMARKS).glob("*/*.json"), *(root / BENCHMARKS).glob("*/*.jsonl")]
    return sorted(p for p in found if p.name not in RAW)


def kind_of(doc: Any) -> str:
    """What a report JSON holds, from its shape (an unknown shape is an error: the index could not summarise it)."""
    if isinstance(doc, list):
        return "recipes"
    if "results" in doc:
        return "comparison"
    if doc.get("kind") in ("plan_sweep", "rok_curve", "recipe_pair", "size_sweep"):
        return doc["kind"]
    if "train/loss" in doc:
        return "converging"
    if "runs" in doc and "loss" in doc:
        return "soak"
    raise ManifestError(f"a report JSON of unknown shape (keys {sorted(doc)[:6]})")


def main_json(folder: Path) -> Path:
    """The JSON a table row reads unless it names another: the first report JSON of its folder."""
    found = [p for p in sorted(folder.glob("*.json*")) if p.name not in RAW]
    if not found:
        raise ManifestError(f"{folder.name}: no report JSON")
    return found[0]


def main_page(folder: Path) -> Path:
    """A report's page: its markdown report if it has one, else its folder (charts and JSON)."""
    return next((folder / name for name in PAGES if (folder / name).is_file()), folder)


# ------------------------------------------------------------------------------------------------ the cells
def resolve(doc: Any, path: str) -> Any:
    """The value at ``path``: keys joined by dots, ``[key=value]`` the item of a list whose key has that value, a
    number the item at that index, ``#`` the length."""
    value = doc
    for segment in re.findall(r"[^.\[\]]+|\[[^\]]*\]", path):
        if segment.startswith("["):
            key, _, wanted = segment[1:-1].partition("=")
            matches = [item for item in value if str(resolve(item, key)) == wanted]
            if len(matches) != 1:
                raise ManifestError(f"{path}: {len(matches)} items with {key}={wanted}")
            value = matches[0]
        elif segment == "#":
            value = len(value)
        elif isinstance(value, list):
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            raise ManifestError(f"{path}: no {segment!r}")
    return value


def evaluate(doc: Any, expression: str) -> Any:
    """Paths and numbers joined by `` + ``, `` - ``, `` * `` and `` / `` (spaces around each), with the usual
    precedence; a lone path is its value, whatever its type."""
    tokens = OPERATOR.split(expression.strip())
    values = [float(t) if re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", t) else resolve(doc, t) for t in tokens[::2]]
    if len(values) == 1:
        return values[0]
    if any(not isinstance(v, (int, float)) for v in values):
        raise ManifestError(f"{expression}: arithmetic on a value that is not a number")
    terms, operators = [values[0]], []
    for operator, value in zip(tokens[1::2], values[1:]):
        if operator == "*":
            terms[-1] *= value
        elif operator == "/":
            terms[-1] /= value
        else:
            terms.append(value)
            operators.append(operator)
    total = terms[0]
    for operator, term in zip(operators, terms[1:]):
        total = total + term if operator == "+" else total - term
    return total


def cell(template: str, doc: Any, specials: dict[str, str]) -> str:
    """``template`` with each ``{expression:format}`` replaced by its value from ``doc`` (``{@name}``: a special)."""
    def field(match: re.Match[str]) -> str:
        inner = match[1]
        if inner.startswith("@"):
            return specials[inner[1:]]
        expression, colon, spec = inner.rpartition(":")
        if not colon or not SPEC.fullmatch(spec):
            expression, spec = inner, ""
        value = evaluate(doc, expression)
        if value is None:
            raise ManifestError(f"{expression}: no value (null in the report)")
        return format(value, spec)
    return FIELD.sub(field, template)


def row_cells(table: dict[str, Any], row: dict[str, Any], root: Path, target: Path) -> list[str]:
    """One row's cells: each column's template read at its ``at`` path (the column's, else the table's, else the
    report's root), ``$name`` replaced by the row's variable; a column naming a variable the row lacks, or whose
    ``when`` variable it lacks, prints its ``missing``."""
    folder = root / BENCHMARKS / row["report"]
    if not folder.is_dir():
        raise ManifestError(f"{row['report']}: no such report folder")
    json_path = folder / row["json"] if "json" in row else main_json(folder)
    doc = load(json_path)
    page = folder / row["page"] if "page" in row else main_page(folder)
    name = FOLDER.fullmatch(folder.name)
    specials = {"page": Path(os.path.relpath(page, target.parent)).as_posix(), **name.groupdict()}
    variables = {k: str(v) for k, v in row.items()}
    cells = []
    for column in table["columns"]:
        at, template = column.get("at", table.get("at", "")), column["cell"]
        needed = [*VARIABLE.findall(at + template), *([column["when"]] if "when" in column else [])]
        if any(v not in variables for v in needed):
            cells.append(column.get("missing", "–"))
            continue
        try:
            where = resolve(doc, VARIABLE.sub(lambda m: variables[m[1]], at)) if at else doc
            cells.append(cell(VARIABLE.sub(lambda m: variables[m[1]], template), where, specials))
        except (ManifestError, KeyError, IndexError, ValueError, TypeError) as error:
            raise ManifestError(f"{row['report']}, column {column['head']!r}: {error}") from error
    return cells


def markdown_table(heads: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def render_table(table: dict[str, Any], root: Path, target: Path) -> str:
    """The table, then (unless ``sources: false``) a line linking each report its rows come from."""
    heads = [column["head"] for column in table["columns"]]
    text = markdown_table(heads, (row_cells(table, row, root, target) for row in table["rows"]))
    if table.get("sources", True):
        folders = dict.fromkeys(root / BENCHMARKS / row["report"] for row in table["rows"])
        links = [f"[{f.name}]({Path(os.path.relpath(main_page(f), target.parent)).as_posix()})" for f in folders]
        text += f"\nFrom {', '.join(links)}.\n"
    return text


# ------------------------------------------------------------------------------------------------ the index
def _devices(result: dict[str, Any]) -> int:
    return int(result.get("devices") or 1)


def _memory(row: dict[str, Any]) -> str:
    """A row's memory in a headline: its peak on the GPU, or on a CPU-only host the host's memory it took."""
    if row.get("peak_gpu_gib") is None:
        return f"{row['host_in_use_gib']:.2f} GiB of host memory in use"
    return f"{row['peak_gpu_gib']:.2f} GiB"


def comparison_headline(doc: dict[str, Any]) -> str:
    """At each device count: the fastest DOS row, and vanilla's (else the first other row) with its time over DOS's;
    a report without a DOS row: each row."""
    ok = [r for r in doc["results"] if r.get("status") == "ok"]
    parts, timed = [], "end to end"
    for devices in sorted({_devices(r) for r in ok}):
        rows = [r for r in ok if _devices(r) == devices]
        key = "e2e_iteration_ms" if all(r.get("e2e_iteration_ms") for r in rows) else "iteration_ms"
        timed = "end to end" if key == "e2e_iteration_ms" else "synchronised"
        dos = [r for r in rows if r["strategy"] == "deep_optimizer_states"]
        others = [r for r in rows if r["strategy"] != "deep_optimizer_states"]
        if not dos:
            parts += [f"{r['label']} {r[key]:.0f} ms at {_memory(r)}" for r in others]
            continue
        best = min(dos, key=lambda r: r[key])
        text = f"{best['label']} {best[key]:.0f} ms at {_memory(best)}"
        ref = next((r for r in others if r["strategy"] == "zero3_offload"), others[0] if others else None)
        if ref is not None:
            text += f", {ref['label']} {ref[key]:.0f} ms ({ref[key] / best[key]:.2f}x DOS's time)"
        parts.append(text)
    return f"{timed}: " + "; ".join(parts)


def sweep_headline(doc: dict[str, Any]) -> str:
    parts = []
    for budget in doc["budgets"]:
        auto, best = budget["auto"]["update_ms"], budget["best"]["update_ms"]
        parts.append(f"{budget['budget']['label']}: `auto` {auto:.1f} ms, best fixed plan {budget['best']['plan']} "
                     f"{best:.1f} ms ({auto / best - 1:+.1%}); median prediction error "
                     f"{budget['prediction_error_median']:.1%}")
    return "; ".join(parts)


def rok_headline(doc: dict[str, Any]) -> str:
    return "; ".join(f"{p['placement']} {p['headline_ms']:.0f} ms at {p['peak_activation_gib']:.2f} GiB of "
                     "activations" for p in doc["placements"] if p["status"] == "ok")


def converging_headline(doc: dict[str, Any]) -> str:
    train = doc["train/loss"]
    text = f"train loss, mean abs delta: DOS vs vanilla {train['dos_vs_vanilla']['mean']:.2e}"
    if "vanilla_vs_vanilla" in train:
        text += f", vanilla vs vanilla {train['vanilla_vs_vanilla']['mean']:.2e}"
    return text


def soak_headline(doc: dict[str, Any]) -> str:
    return "host RSS per 1,000 steps: " + ", ".join(
        f"{run} {figures['rss_gib']['slope_per_1000_steps']:+.4f} GiB" for run, figures in doc["runs"].items())


def recipe_pair_headline(doc: dict[str, Any]) -> str:
    runs = {r["strategy"]: r["iteration_ms"] for r in doc["runs"]}
    text = ", ".join(f"{strategy} {ms:.0f} ms" for strategy, ms in runs.items())
    if "deep_optimizer_states" in runs and "zero3_offload" in runs:
        text += f" ({runs['zero3_offload'] / runs['deep_optimizer_states']:.2f}x)"
    return "end to end: " + text


def recipes_headline(doc: list[dict[str, Any]]) -> str:
    return "; ".join(f"{r['recipe']} {r['steps']} steps" + (f", {r['iteration_ms']:.0f} ms per iteration"
                                                            if r.get("iteration_ms") else "") for r in doc)


def sizes_headline(doc: dict[str, Any]) -> str:
    """Each strategy's largest size trained, and what stopped it."""
    parts = []
    for label, e in doc["largest"].items():
        text = f"{label}: " + (f"{e['params'] / 1e9:.2f}B ({e['shape']})" if e["params"] else "none")
        parts.append(text + (f", stopped by {e['stopped'].split(':')[0]}" if e["stopped"] else ""))
    return "largest trained: " + "; ".join(parts)


HEADLINES: dict[str, Callable[[Any], str]] = {
    "comparison": comparison_headline, "plan_sweep": sweep_headline, "rok_curve": rok_headline,
    "converging": converging_headline, "soak": soak_headline, "recipe_pair": recipe_pair_headline,
    "recipes": recipes_headline, "size_sweep": sizes_headline}
SECTIONS = (("comparison", "Strategy comparisons"), ("size_sweep", "The largest model per box"),
            ("plan_sweep", "Plan sweeps"),
            ("rok_curve", "Activation placement (ROK curve)"), ("other", "Convergence, reliability and recipes"))


def render_index(manifest: dict[str, Any], root: Path) -> str:
    """Every report folder, by kind then date: its pages, what it measured (the manifest's words) and a headline
    from each of its JSON."""
    described = manifest["reports"]
    folders = sorted(p for p in (root / BENCHMARKS).iterdir() if p.is_dir())
    unknown = sorted(set(described) - {f.name for f in folders})
    undescribed = [f.name for f in folders if f.name not in described]
    if unknown or undescribed:
        raise ManifestError(f"manifest reports without a folder: {unknown}; folders the manifest does not describe: "
                            f"{undescribed}")
    by_section: dict[str, list[tuple[str, list[str]]]] = {key: [] for key, _ in SECTIONS}
    for folder in folders:
        name = FOLDER.fullmatch(folder.name)
        if name is None:
            raise ManifestError(f"{folder.name}: not named [model]_[hardware]_[date]_[tag]")
        docs = [load(p) for p in sorted(folder.glob("*.json*")) if p.name not in RAW]
        kinds = {kind_of(doc) for doc in docs}
        kind = next(iter(kinds)) if len(kinds) == 1 else "other"
        if not docs and (folder / "rok.md").is_file():
            kind = "rok_curve"
        pages = [p for p in (folder / n for n in PAGES) if p.is_file()] or [folder]
        links = ", ".join(f"[{p.stem if p != folder else 'folder'}]({p.relative_to(root / BENCHMARKS).as_posix()})"
                          for p in pages)
        headline = "; ".join(HEADLINES[kind_of(doc)](doc) for doc in docs) or "no JSON kept: its page only"
        entry = described[folder.name]
        commit = re.sub(r"\b([0-9a-f]{7})\b", r"`\1`", str(entry["commit"])) if entry.get("commit") else "–"
        cells = [f"`{folder.name}`: {links}", name["date"], name["hardware"], commit, entry["what"], headline]
        by_section[kind if kind in by_section else "other"].append((name["date"] + folder.name, cells))
    out = []
    for key, title in SECTIONS:
        rows = [cells for _, cells in sorted(by_section[key])]
        if not rows:  # no report of this kind yet
            continue
        out += [f"### {title}\n", markdown_table(["report", "date", "host", "commit", "what it measured", "headline"],
                                                 rows)]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- the targets
def _targets_script() -> Any:
    spec = importlib.util.spec_from_file_location("targets", Path(__file__).resolve().parent / "targets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_targets(section: dict[str, Any], root: Path, target: Path) -> str:
    """The project's targets (scripts/targets.py) judged on each report the manifest names: those it met or missed
    (a target whose configurations the report did not run is left out)."""
    targets_of = _targets_script().targets_of
    rows = []
    for entry in section["reports"]:
        folder = root / BENCHMARKS / entry["report"]
        path = folder / entry["json"] if "json" in entry else main_json(folder)
        link = f"[{folder.name}]({Path(os.path.relpath(main_page(folder), target.parent)).as_posix()})"
        judged = [claim for claim in targets_of(load(path)) if claim["status"] != "not measured"]
        for claim in judged:
            rows.append([link if claim is judged[0] else "", claim.get("claim") or claim["target"],
                         claim["threshold"], "–" if claim["value"] is None else f"{claim['value']:.3g}",
                         f"**{claim['status']}**"])
    return markdown_table(["report", "target", "threshold", "value", "status"], rows)


# ------------------------------------------------------------------------------------------- the files
def blocks(manifest: dict[str, Any], root: Path) -> dict[Path, dict[str, str]]:
    """What goes between each file's markers: file -> {block name: text}."""
    out: dict[Path, dict[str, str]] = {}
    for name, table in manifest["tables"].items():
        for file in table["files"]:
            target = root / file
            text = render_targets(table, root, target) if table.get("kind") == "targets" else render_table(
                table, root, target)
            out.setdefault(target, {})[name] = text
    out.setdefault(root / BENCHMARKS / "README.md", {})["index"] = render_index(manifest, root)
    return out


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """Each file the manifest names, with its blocks rendered from the reports (files whose markers are missing are
    an error: the block would silently not be written)."""
    manifest = yaml.safe_load((root / BENCHMARKS / MANIFEST).read_text(encoding="utf-8"))
    out = {}
    for path, named in blocks(manifest, root).items():
        text = path.read_text(encoding="utf-8")
        for name, body in named.items():
            start, end = f"<!-- results:{name} -->\n", f"<!-- /results:{name} -->"
            if start not in text or end not in text.partition(start)[2]:
                raise ManifestError(f"{path.relative_to(root)}: no <!-- results:{name} --> block")
            before, _, rest = text.partition(start)
            text = before + start + "\n" + body + "\n" + end + rest.partition(end)[2]
        out[path] = text
    return out


def stale(root: Path = ROOT) -> list[str]:
    """The files whose committed text differs from what the reports render."""
    return [str(path.relative_to(root)) for path, text in rendered(root).items()
            if path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a file differs")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        for path in differ:
            print(f"{path}: differs from what the reports render (python scripts/render_results.py)")
        return 1 if differ else 0
    for path, text in rendered().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"rendered {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
