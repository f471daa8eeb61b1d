"""ldp-fleet's last line and exit status: only an error beyond the tolerance is a failure.

A fleet too small for the release rule has nothing released to compare; that is "nothing to
show yet" (7), said as such, not "some errors are beyond the tolerance" (9).
"""

from __future__ import annotations

from fleet.cli import _verdict
from fleet.report import UseCaseSummary
from runtime.exit_status import ExitStatus


def _summary(name: str, compared: int, beyond: int = 0) -> UseCaseSummary:
    return UseCaseSummary(
        name=name,
        mechanism="cms",
        kind="frequency",
        definition=f"{name}@00",
        current=True,
        periods=(),
        max_abs_z=None if compared == 0 else 1.0 + 5 * beyond,
        compared=compared,
        beyond=beyond,
        ok=beyond == 0 and compared > 0,
    )


def test_every_error_within_the_tolerance_is_a_pass() -> None:
    assert _verdict([_summary("emoji", 1200), _summary("domains", 30)], 5.0, 1000) == (
        "all 1,230 errors within 5 SE",
        ExitStatus.OK,
    )


def test_an_error_beyond_the_tolerance_is_a_failure_even_beside_a_use_case_with_nothing_compared() -> None:
    line, status = _verdict([_summary("emoji", 100, beyond=2), _summary("domains", 0)], 5.0, 1000)
    assert status == ExitStatus.BEYOND_TOLERANCE
    assert line == "some errors are beyond the tolerance: emoji"


def test_nothing_compared_at_all_says_so_and_how_to_get_a_comparison() -> None:
    line, status = _verdict([_summary("emoji", 0), _summary("domains", 0)], 5.0, 20)
    assert status == ExitStatus.NOT_RELEASED
    assert line == "nothing to compare: with 20 devices nothing reaches the release threshold; try --devices 1000"


def test_no_use_case_at_all_is_nothing_to_compare() -> None:
    assert _verdict([], 5.0, 20)[1] == ExitStatus.NOT_RELEASED


def test_a_use_case_with_nothing_released_is_named_and_is_not_a_pass() -> None:
    line, status = _verdict([_summary("emoji", 300), _summary("domains", 0)], 5.0, 120)
    assert status == ExitStatus.NOT_RELEASED
    assert line == "all 300 errors within 5 SE; nothing to compare for domains (no estimate released)"
