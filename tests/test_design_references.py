"""Every design reference points into this repository: at a section, invariant or convention docs/design.md defines.

The code, the tests and the documents cite the design as "docs/design.md §6.2",
"docs/design.md, invariant 2", "docs/design.md, convention 11" or by a section's title,
'docs/design.md, "Two halves of a mechanism"'. Two checks hold that: no
file names a design or style document by a bare upper-case word ("DESIGN invariant 8",
"STYLE rule 10", 'DESIGN "Receipts"'), which would point outside the repository, and every
citation of docs/design.md names a number or a title the document defines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
THIS = Path(__file__).resolve()

PRODUCT = ("protocol", "runtime", "agent", "collector", "fleet")
"""The packages that ship."""

SCANNED_PY = (*PRODUCT, "tests", "benchmarks")
SCANNED_MD = ("docs/*.md", "README.md", "CHANGELOG.md")

OUTSIDE = re.compile(r"\b(?:DESIGN|STYLE)\b")
"""A design or style document named by a bare upper-case word: "DESIGN invariant 2", "STYLE rule 6"."""

CITATION = re.compile(r'docs/design\.md`*,?\s*(?:(invariant|convention)\s+(\d+)|§\s*(\d+(?:\.\d+)?)|"([^"]+)")')
"""A citation of this repository's design: "docs/design.md, invariant 2", "docs/design.md §3.2",
'docs/design.md, "Mechanisms"'."""


def _scanned() -> Iterator[Path]:
    for top in SCANNED_PY:
        yield from sorted(p for p in (ROOT / top).rglob("*.py") if p.resolve() != THIS)
    for pattern in SCANNED_MD:
        yield from sorted(ROOT.glob(pattern))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def outside_references(name: str, text: str) -> list[str]:
    """``name:line: text`` for each line of ``text`` naming a design or style document outside the repository."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if OUTSIDE.search(line):
            found.append(f"{name}:{number}: {line.strip()}")
    return found


def _flat(text: str) -> str:
    """The text on one line, comment markers and indentation dropped, so a citation may wrap."""
    return " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())


def design_numbers(text: str) -> dict[str, set[str]]:
    """What a design document defines: numbered ``section``s and their ``title``s, ``invariant``s, ``convention``s."""
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\. ", text, flags=re.MULTILINE))
    titles = set(re.findall(r"^#{2,3} (?:\d+(?:\.\d+)?\. )?(.+?)\s*$", text, flags=re.MULTILINE))
    numbered: dict[str, set[str]] = {"invariant": set(), "convention": set()}
    for kind, title in (("invariant", "Invariants"), ("convention", "Conventions")):
        heading = re.search(rf"^## \d+\. {title}$", text, flags=re.MULTILINE)
        if heading is None:
            continue
        body = text[heading.end() :].split("\n## ", 1)[0]
        numbered[kind] = set(re.findall(r"^(\d+)\. \*\*", body, flags=re.MULTILINE))
    return {"section": sections, "title": titles, **numbered}


def unknown_citations(name: str, text: str, defined: dict[str, set[str]]) -> list[str]:
    """``name: citation`` for each citation of docs/design.md in ``text`` whose number or title it does not define."""
    found = []
    for match in CITATION.finditer(_flat(text)):
        kind, number, section, title = match.groups()
        if kind is not None:
            known = number in defined[kind]
        elif section is not None:
            known = section in defined["section"]
        else:
            known = title in defined["title"]
        if not known:
            found.append(f"{name}: {match.group(0)}")
    return found


def test_the_document_defines_the_invariants_and_the_conventions() -> None:
    """docs/design.md numbers its sections, nine invariants and its conventions from 1 without a gap."""
    defined = design_numbers(DESIGN.read_text(encoding="utf-8"))
    assert defined["invariant"] == {str(i) for i in range(1, 10)}
    conventions = sorted(int(n) for n in defined["convention"])
    assert conventions == list(range(1, len(conventions) + 1))
    assert len(conventions) >= 15
    assert {"1", "3.2", "5.4", "6.2", "8", "9"} <= defined["section"]
    assert {"Mechanisms", "Two halves of a mechanism", "Invariants", "Conventions"} <= defined["title"]


def test_the_checks_catch_planted_references() -> None:
    """The check can fail: bare DESIGN and STYLE references and citations of undefined numbers are found."""
    planted = 'a (DESIGN invariant 3)\nb (STYLE rule 10)\nc, DESIGN "Receipts"\nd (docs/design.md, invariant 2)\n'
    assert [hit.split(":")[1] for hit in outside_references("x.py", planted)] == ["1", "2", "3"]
    defined = {"section": {"3", "3.2"}, "title": {"Mechanisms"}, "invariant": {"1", "2"}, "convention": {"1"}}
    text = "docs/design.md, invariant 2; ``docs/design.md``, invariant 12; docs/design.md §3.2; docs/design.md §4\n"
    text += "# (docs/design.md,\n# convention 7) wraps\n"
    text += '(``docs/design.md``, "Mechanisms"); (docs/design.md, "Two halves")\n'
    assert unknown_citations("x.py", text, defined) == [
        "x.py: docs/design.md``, invariant 12",
        "x.py: docs/design.md §4",
        "x.py: docs/design.md, convention 7",
        'x.py: docs/design.md, "Two halves"',
    ]


def test_nothing_points_at_a_design_outside_the_repository() -> None:
    """No product module, test, benchmark or document names DESIGN or STYLE, but the listed protocol/ lines."""
    found: list[str] = []
    for path in _scanned():
        found += outside_references(_relative(path), path.read_text(encoding="utf-8"))
    assert not found, "cite docs/design.md instead:\n  " + "\n  ".join(found)


def test_every_citation_of_the_design_names_what_it_defines() -> None:
    """Each "docs/design.md, invariant N", "convention N", "§N" or '"Title"' names something the document has."""
    defined = design_numbers(DESIGN.read_text(encoding="utf-8"))
    found: list[str] = []
    cited = 0
    for path in _scanned():
        text = path.read_text(encoding="utf-8")
        cited += len(CITATION.findall(_flat(text)))
        found += unknown_citations(_relative(path), text, defined)
    assert cited > 10, "the scan found too few citations: is the pattern still right?"
    assert not found, "citations of numbers docs/design.md does not define:\n  " + "\n  ".join(found)
