"""Every relative link in README.md and docs/*.md points at a file that exists, and every `#anchor`
at a heading of its target page; user-facing docs name no issue numbers."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); images are ![...](...)
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (links there are not links)."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"`", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def test_slug_matches_githubs_rule():
    assert slug("Planning: `maskrl plan`") == "planning-maskrl-plan"
    assert slug("Extending maskrl") == "extending-maskrl"
    assert slug("Key/value caches: `cache: prefix | dual`") == "keyvalue-caches-cache-prefix--dual"


def test_the_checker_finds_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see [x](missing.md) and `[y](code.md)`\n```\n[z](fenced.md)\n```\n", encoding="utf-8")
    assert relative_links(page) == ["missing.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    bad = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "results.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_in_user_facing_docs(page):
    hits = re.findall(r"\bissues? \d+|\(issue \d+", page.read_text(encoding="utf-8"), re.I)
    assert not hits, f"{page.relative_to(ROOT)} names {hits}: state the fact, not the issue"
