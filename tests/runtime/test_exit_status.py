"""The exit-status table the three tools share: its numbers never change, and the README lists each."""

from __future__ import annotations

import re
from pathlib import Path

from runtime.exit_status import HELP, MEANING, ExitStatus

README = Path(__file__).resolve().parents[2] / "README.md"

PINNED = {
    "OK": 0,
    "ERROR": 1,
    "CONFIG": 2,
    "REFUSED": 3,
    "NO_CONSENT": 4,
    "STOPPED": 5,
    "STATE_UNREADABLE": 6,
    "NOT_RELEASED": 7,
    "UNAVAILABLE": 8,
    "BEYOND_TOLERANCE": 9,
    "STORE_DAMAGED": 10,
}
"""What scripts test for: a status keeps its number for good."""


def test_every_status_keeps_its_number() -> None:
    """The statuses are exactly the pinned names and numbers, each with one sentence."""
    assert {s.name: s.value for s in ExitStatus} == PINNED
    assert set(MEANING) == set(ExitStatus)
    assert all(MEANING[s].strip() for s in ExitStatus)


def test_help_lists_every_status_in_order() -> None:
    """--help's table has one line per status, in numeric order, with its sentence."""
    lines = HELP.splitlines()[1:]
    assert lines == [f"  {s.value}  {MEANING[s]}" for s in sorted(ExitStatus)]


def test_the_readme_table_names_the_module_and_every_status() -> None:
    """README "Exit status" points at runtime/exit_status.py and has one row per status, 0 to 10."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Exit status", 1)[1].split("\n## ", 1)[0]
    assert "`runtime/exit_status.py`" in section
    rows = [int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.MULTILINE)]
    assert rows == sorted(s.value for s in ExitStatus)
