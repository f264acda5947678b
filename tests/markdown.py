"""Checks of Markdown as a real CommonMark + GFM-tables renderer (markdown-it-py) reads it, not by eye.

The two ways a generated report went wrong: a text line right after a table becomes one more table
row in GitHub-flavoured Markdown, and a line such as `# 7e+09 parameters` becomes a top-level heading.
"""

from __future__ import annotations

from markdown_it import MarkdownIt

RENDERER = MarkdownIt("commonmark").enable("table")


def problems(text: str) -> list[str]:
    """What renders differently from what the text means: [] when the document is sound."""
    tokens = RENDERER.parse(text)
    lines = text.splitlines()
    found = []
    titles = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h1"]
    if len(titles) != 1:
        found.append(f"{len(titles)} top-level headings, want the title alone: {titles}")
    for t in tokens:
        if t.type == "table_open":
            assert t.map is not None  # markdown-it maps every block token to its lines
            start, end = t.map
            for number in range(start, end):
                if not lines[number].lstrip().startswith("|"):
                    found.append(f"line {number + 1} is read as a table row: {lines[number][:80]!r}")
    return found
