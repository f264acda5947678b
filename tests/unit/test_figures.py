"""A figure quoted in the docs says what its source says: BENCHMARKS.md's table of the figures the docs quote.

A page quotes a figure as a link to that table with the figure's key as the link's title,
`[41 minutes](BENCHMARKS.md#figures-the-docs-quote "make-test")`; this test fails when the quoted text and the
table's figure differ, when a quote names a key the table lacks, or when the table holds a figure nobody quotes.
Re-measure, change the table, and every quote follows (or this test names the pages to change).
"""

from __future__ import annotations

import re
import sys

from tests.conftest import ROOT

SOURCE = ROOT / "BENCHMARKS.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HEADING = "## Figures the docs quote"
QUOTE = re.compile(r'\[([^\]]+)\]\((?:\.\./)?BENCHMARKS\.md#figures-the-docs-quote "([a-z0-9-]+)"\)')
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| ([^|]+?) \| (.+) \|$")


def figures() -> dict[str, str]:
    """key -> figure, from the table under HEADING."""
    text = SOURCE.read_text()
    assert HEADING in text, f"{SOURCE.name} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        row = ROW.match(line)
        if row:
            assert row[1] not in found, f"{SOURCE.name}: figure {row[1]!r} twice"
            found[row[1]] = row[2]
    assert found, f"{SOURCE.name}: no figure rows under '{HEADING}': the table's format changed"
    return found


def quotes() -> list[tuple[str, str, str]]:
    """(page, key, quoted text) for every quote in the pages, a quote split over two lines included."""
    found = []
    for page in PAGES:
        text = re.sub(r"\s*\n\s*", " ", page.read_text())
        found += [(page.relative_to(ROOT).as_posix(), key, quoted) for quoted, key in QUOTE.findall(text)]
    return found


def test_every_quoted_figure_is_its_sources_figure():
    table = figures()
    wrong = [
        f"{page}: quotes {key} as {quoted!r}, BENCHMARKS.md says {table[key]!r}"
        if key in table
        else f"{page}: quotes {key}, which BENCHMARKS.md's table lacks"
        for page, key, quoted in quotes()
        if table.get(key) != quoted
    ]
    assert not wrong, "\n".join(wrong)


def test_every_figure_in_the_table_is_quoted_somewhere():
    quoted = {key for _, key, _ in quotes()}
    assert not set(figures()) - quoted, f"figures no page quotes: {sorted(set(figures()) - quoted)}"


def test_a_changed_figure_is_caught(tmp_path, monkeypatch):
    """The check can fail: the table's figure changed, the page's quote not."""
    source = tmp_path / "BENCHMARKS.md"
    page = tmp_path / "page.md"
    source.write_text(f"{HEADING}\n\n| figure | value | measured |\n|---|---|---|\n| `x` | 2.0 s | here |\n")
    page.write_text('It took [1.0 s](BENCHMARKS.md#figures-the-docs-quote "x").\n')
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "SOURCE", source)
    monkeypatch.setattr(this, "PAGES", [page])
    monkeypatch.setattr(this, "ROOT", tmp_path)
    try:
        test_every_quoted_figure_is_its_sources_figure()
    except AssertionError as exc:
        assert "quotes x as '1.0 s', BENCHMARKS.md says '2.0 s'" in str(exc)
    else:
        raise AssertionError("a quote that disagrees with its source passed")
