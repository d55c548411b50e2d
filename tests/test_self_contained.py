"""The project stands on its own: a clone has no ``../shared``, so the code and the docs cite the
project's own pages for facts -- equations and defaults in docs/spec.md, datasets in docs/data.md --
and every "docs/spec.md §x" they cite is a section of docs/spec.md.

The one outside path allowed is the default data folder itself (``$MASKRL_DATA_DIR``, else
``../shared/data``): a place to look for files, not a source of facts.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC_PAGE = ROOT / "docs" / "spec.md"
#: where facts must not be cited from outside the project
OWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
       *sorted(p for p in (ROOT / "src").rglob("*") if p.suffix in (".py", ".md", ".txt", ".json", ".yaml"))]
#: where "docs/spec.md §x" citations are checked against the page's sections
CITING = OWN + [p for d in ("benchmarks", "tests", "configs") for p in sorted((ROOT / d).rglob("*"))
                if p.suffix in (".py", ".md", ".yaml")]

SECTION = r"§\d+(?:\.\d+)*"
CITATION = re.compile(rf"docs/spec\.md((?:\s*(?:,|;|–|-|/|and|or)?\s*{SECTION})+)")
HEADING = re.compile(rf"^#{{1,6}}\s+({SECTION})\s", re.M)


def outside_citations(text: str) -> list[str]:
    """The places in ``text`` that cite the outside material a clone lacks: the old spec ("SPEC",
    "SPEC §x", SPEC.md), the data provenance file (SOURCES.md) and any ``shared/`` path other than the
    data folder itself (``shared/data``, not a file inside it)."""
    hits = [m.group(0) for m in re.finditer(r"\bSPEC\b(?:\s*§[\d.]*|\.md)?", text)]
    hits += re.findall(r"\bSOURCES\.md\b", text)
    for m in re.finditer(r"shared/([\w.\-/]*)", text):
        if m.group(1).rstrip(".") != "data":
            hits.append(m.group(0))
    return hits


def spec_sections() -> set[str]:
    """The section numbers of docs/spec.md's headings (``## §2 …``, ``### §2.1 …``)."""
    return {s.lstrip("§") for s in HEADING.findall(SPEC_PAGE.read_text(encoding="utf-8"))}


def cited_sections(text: str) -> list[str]:
    """Every section a "docs/spec.md §x" citation names, lists and ranges included ("§2–§4")."""
    return [s.lstrip("§") for m in CITATION.finditer(text) for s in re.findall(SECTION, m.group(1))]


def test_the_checks_can_fail():
    assert outside_citations("ratio (SPEC §1.5); see ../shared/SPEC.md") == ["SPEC §1.5", "SPEC.md", "shared/SPEC.md"]
    assert outside_citations("provenance: `shared/data/SOURCES.md`") == ["SOURCES.md", "shared/data/SOURCES.md"]
    assert outside_citations("d1's outputs (`shared/data/d1-generations`)") == ["shared/data/d1-generations"]
    assert outside_citations("the default `$MASKRL_DATA_DIR` or `../shared/data`; else ../shared/data.") == []
    assert outside_citations("SPECIAL_TOKENS, MODEL_SPECS") == []
    assert cited_sections("docs/spec.md §1.5, §3.2 and docs/spec.md §2–§4; docs/spec.md §1.1's ids") == [
        "1.5", "3.2", "2", "4", "1.1"]


def test_spec_page_keeps_the_section_numbers():
    """Every section the code has cited since the first version, in order of the page."""
    want = {"1", "1.1", "1.2", "1.3", "1.4", "1.5", "2", "2.1", "2.2", "2.3", "3", "3.1", "3.2", "3.3", "3.4",
            "4", "5"}
    assert want <= spec_sections()


@pytest.mark.parametrize("path", OWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_facts_cited_from_outside_the_project(path):
    hits = outside_citations(path.read_text(encoding="utf-8", errors="replace"))
    assert not hits, (f"{path.relative_to(ROOT)} cites {sorted(set(hits))}: a clone has no ../shared; cite "
                      "docs/spec.md §x (equations, defaults) or docs/data.md (datasets)")


def test_every_spec_citation_names_a_section_of_the_page():
    have = spec_sections()
    bad = {}
    for path in CITING:
        missing = [s for s in cited_sections(path.read_text(encoding="utf-8", errors="replace")) if s not in have]
        if missing:
            bad[str(path.relative_to(ROOT))] = sorted(set(missing))
    assert not bad, f"citations of sections docs/spec.md does not have: {bad}"
