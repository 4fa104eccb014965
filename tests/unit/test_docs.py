"""The docs stay user guides a newcomer can read: no page over 300 lines (measurements go in
docs/benchmarks.md), and every relative link in README.md and docs/*.md reaches its file and,
when it names one, its heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md"))
MAX_LINES = 300
GUIDES = [p for p in PAGES if p.name != "benchmarks.md"]
"""The user guides; benchmarks.md is the measurement log and grows with every bench."""

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def anchors(markdown: str) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation but `-` and `_` dropped,
    spaces to hyphens, a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    return broken


def test_the_docs_exist() -> None:
    assert {"benchmarks.md", "trainer.md", "quality.md"} <= {p.name for p in PAGES}


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_a_docs_page_has_at_most_300_lines(page: Path) -> None:
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{page.relative_to(REPO)} has {lines} lines (at most {MAX_LINES}): keep it a user "
                                "guide (what, how, knobs, why) and move measurements to docs/benchmarks.md")


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_reach_their_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Run it (`x.y`)\n\n## Run it (`x.y`)\n[ok](#run-it-xy-1) [ok](b.md) "
                                   "[bad](#nowhere) [bad](c.md) [web](https://example.com/c.md)\n"
                                   "```\n[in code](d.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert sorted(broken_links(tmp_path / "a.md")) == [
        "#nowhere: a.md has no heading #nowhere", f"c.md: no file {tmp_path / 'c.md'}"]
