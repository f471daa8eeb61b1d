"""Measured figures live on docs/benchmarks.md, fed from the benchmarks' JSON, not in code comments:
the page is what its records render, the code cites its sections, no product module quotes a
measurement, and bench_costs (which fed the page's latest run) runs small."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import bench_costs
from benchmarks.page import DOCS, load, render
from tests.benchmarks.support import covers, report, run_main

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("protocol", "runtime", "agent", "collector", "fleet")

MEASUREMENT = re.compile(r"median|measured|load average|instead of", re.IGNORECASE)
"""The words that give a comment away as a lab notebook."""
FIGURE = re.compile(r"\d[\d.,]*\s?(?:µs|us|ms|s)\b")
"""A time figure: microseconds, milliseconds or seconds."""
CITATION = re.compile(r'docs/benchmarks\.md`*,?\s*"([^"]+)"')
"""A citation of one of the page's sections: 'docs/benchmarks.md, "Title"'."""


def _flat(text: str) -> str:
    """The text on one line, comment markers and indentation dropped, so a citation may wrap."""
    return " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())


def measurements_quoted(text: str) -> list[int]:
    """The numbers of the lines of ``text`` that name a measurement next to a time figure."""
    return [n for n, line in enumerate(text.splitlines(), 1) if MEASUREMENT.search(line) and FIGURE.search(line)]


def test_the_check_finds_a_planted_measurement() -> None:
    """The check can fail: a comment quoting a median in µs or seconds is found, a plain duration is not."""
    text = "# median 0.86 s at load average 6\nx = 1  # 21.6 instead of 27.6 us\n# waits 20 ms\n# measured: 41 µs\n"
    assert measurements_quoted(text) == [1, 2, 4]


def test_no_product_module_quotes_a_measurement() -> None:
    """No line of the five packages names a median, a measurement, a load average or an "instead of" next to a time."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            found += [f"{name}:{n}" for n in measurements_quoted(path.read_text(encoding="utf-8"))]
    assert not found, "move these figures to docs/benchmarks.md and cite it:\n  " + "\n  ".join(found)


def test_the_page_is_what_its_records_render() -> None:
    """docs/benchmarks.md is rendered from docs/benchmarks/ (python -m benchmarks.page), every run path resolving."""
    assert (DOCS / "benchmarks.md").read_text(encoding="utf-8") == render(*load())


def test_every_measurement_says_how_and_when() -> None:
    """Each measurement has a date and the command (or, before runs were kept, how it was taken)."""
    sections, runs = load()
    for section in sections:
        for m in section["measurements"]:
            where = runs[m["run"]] if "run" in m else m
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", where["date"]), section["title"]
            assert where.get("command") or m.get("how"), section["title"]
            assert m["conditions"], section["title"]


def test_the_code_cites_each_section_and_only_sections_there_are() -> None:
    """Each file a section names cites it by title, and every citation of the page names one of its titles."""
    sections, _ = load()
    titles = {s["title"] for s in sections}
    for section in sections:
        for name in section["cited_by"]:
            cited = CITATION.findall(_flat((ROOT / name).read_text(encoding="utf-8")))
            assert section["title"] in cited, f"{name} does not cite docs/benchmarks.md, {section['title']!r}"
    for package in (*PRODUCT, "benchmarks", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue  # its own pattern's example
            unknown = set(CITATION.findall(_flat(path.read_text(encoding="utf-8")))) - titles
            assert not unknown, f"{path.relative_to(ROOT)} cites sections the page does not have: {sorted(unknown)}"


@covers("bench_costs")
def test_costs(capsys: pytest.CaptureFixture[str]) -> None:
    """bench_costs --small: every import, the CSPRNG and both RAPPOR paths measured (figures printed only)."""
    doc = run_main(bench_costs.main, ["--small"], capsys)
    assert set(doc["imports"]) == {"bare", *bench_costs.IMPORTS}
    for name in bench_costs.IMPORTS:
        assert doc["imports"][name]["rss_mib"] > 0
    assert doc["urandom"]["8KiB_us"] > 0
    assert doc["rappor_irr"]["pure_us"] > 0
    report("bench_costs", {name: doc["imports"][name]["added_rss_mib"] for name in bench_costs.IMPORTS})
