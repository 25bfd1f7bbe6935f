"""The results tables of the README and docs/results.md, and the index of benchmarks/, are what the committed reports
render (scripts/render_results.py, from benchmarks/manifest.yaml), and every report's JSON loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
RENDER = load_script("render_results")


def test_the_committed_tables_are_what_the_reports_render() -> None:
    assert not RENDER.stale(ROOT), "run python scripts/render_results.py and commit what it writes"


EVERY_JSON = sorted(path for path in (ROOT / "benchmarks").rglob("*.json*") if path.suffix in (".json", ".jsonl"))


@pytest.mark.parametrize("path", EVERY_JSON, ids=lambda p: str(p.relative_to(ROOT / "benchmarks")))
def test_every_report_loads(path: Path) -> None:
    """Each JSON under benchmarks/ (a .jsonl: each line) parses, and each report's is of a kind the index summarises
    (the records beside a report are not reports)."""
    doc = RENDER.load(path)
    if path in RENDER.reports(ROOT):
        assert RENDER.kind_of(doc) in RENDER.HEADLINES


def test_a_figure_changed_in_a_report_is_caught(tmp_path: Path) -> None:
    """The check reads the figures from the JSON: one value changed in the report of the README's first row makes the
    README and the results page stale, and a row pointed at a label the report lacks is an error naming it."""
    for name in ("README.md", "docs", "benchmarks", "scripts"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    row = yaml.safe_load((ROOT / "benchmarks" / "manifest.yaml").read_text())["tables"]["headline"]["rows"][0]
    report = tmp_path / "benchmarks" / row["report"] / "results.json"
    doc = json.loads(report.read_text())
    next(r for r in doc["results"] if r["label"] == row["dos"])["e2e_iteration_ms"] *= 2
    report.write_text(json.dumps(doc))
    assert RENDER.stale(tmp_path) == ["README.md", "docs/results.md", "benchmarks/README.md"]

    manifest = tmp_path / "benchmarks" / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("label: plain}", "label: plainer}"))
    with pytest.raises(RENDER.ManifestError, match="0 items with label=plainer"):
        RENDER.rendered(tmp_path)


def test_cells_read_paths_selectors_and_arithmetic() -> None:
    doc = {"results": [{"label": "dos(auto,overlap)", "ms": 300.0, "ids": [1, 2, 3]}, {"label": "a.b", "ms": 900.0}]}
    cell = RENDER.cell
    assert cell("{results[label=a.b].ms / results[label=dos(auto,overlap)].ms - 1:+.0%}", doc, {}) == "+200%"
    assert cell("{results.0.ids.#} of {results.1.ms * 2 + 1:,.0f}", doc, {}) == "3 of 1,801"
    assert cell("[{@date}]({@page})", doc, {"date": "2026-11-28", "page": "x/report.md"}) == "[2026-11-28](x/report.md)"
    with pytest.raises(RENDER.ManifestError, match="no 'step_ms'"):
        cell("{results.0.step_ms:.1f}", doc, {})
