"""Every relative link and image in the README, docs/ and the reports under benchmarks/ points at a file of the
repository (a report whose chart was left out of its commit fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted(ROOT.glob("*.md")), *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "benchmarks").rglob("*.md"))]
#: ``[text](target)`` and ``![alt](target)``; the target up to a space (a title) or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def relative_targets(page: Path) -> list[str]:
    """The relative file targets of ``page``'s links, outside code (anchors dropped; URLs and pure anchors skipped)."""
    text = CODE.sub("", page.read_text())
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_the_link_pattern() -> None:
    page = "see [a](docs/x.md#part), ![c](c.png), [web](https://x.org), [here](#top), `[not](code.md)`"
    assert [t.split("#")[0] for t in LINK.findall(CODE.sub("", page))] == ["docs/x.md", "c.png", "https://x.org", ""]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    missing = [t for t in relative_targets(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"
