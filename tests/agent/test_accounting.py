"""The accountant: daily record limit and lifetime ε cap, a small pure class."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.accounting import EPSILON_SLACK, Budget, LimitReachedError


def test_check_spend_remaining() -> None:
    """spend charges records and ε; remaining shrinks; check refuses what does not fit."""
    b = Budget(daily_limit=3, epsilon_cap=2.0).at(10)
    b = b.spend(2, 1.0)
    assert b.remaining().records_today == 1
    assert b.remaining().epsilon == pytest.approx(1.0)
    with pytest.raises(LimitReachedError, match="daily-limit"):
        b.check(2, 0.1)
    with pytest.raises(LimitReachedError, match="epsilon-cap"):
        b.check(1, 1.5)
    assert b.fits(1, 1.0)
    assert not b.fits(2, 0.0)
    assert not b.exhausted(1.0)
    assert b.exhausted(1.5)
    b = b.spend(1, 1.0)
    assert b.exhausted(1e-6)


def test_days_only_move_forward() -> None:
    """A clock set back reads as the latest day seen: the day's count is not reset."""
    b = Budget(daily_limit=2, epsilon_cap=100.0).at(20).spend(2, 1.0)
    assert b.at(19) is b
    assert b.at(19).remaining().records_today == 0
    fresh = b.at(21)
    assert fresh.remaining().records_today == 2
    assert fresh.epsilon_total == pytest.approx(1.0)


def test_plain_round_trip_and_validation() -> None:
    """to_plain/from_plain round-trips; malformed data is refused."""
    b = Budget(daily_limit=4, epsilon_cap=9.0).at(3).spend(1, 0.25)
    assert Budget.from_plain(b.to_plain(), daily_limit=4, epsilon_cap=9.0) == b
    for bad in ({}, {"day": -1, "records_today": 0, "epsilon_today": 0.0, "epsilon_total": 0.0}, "x"):
        with pytest.raises(ValueError, match="budget"):
            Budget.from_plain(bad, daily_limit=4, epsilon_cap=9.0)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(-3, 3), st.integers(0, 5), st.floats(0.0, 2.0)),
        max_size=40,
    )
)
def test_limits_never_exceeded(steps: list[tuple[int, int, float]]) -> None:
    """Whatever the sequence of clock moves and charges, no day exceeds the limit and the total stays under the cap."""
    b = Budget(daily_limit=4, epsilon_cap=5.0)
    day = 100
    charged: dict[int, int] = {}
    for move, records, eps in steps:
        day += move
        b = b.at(day)
        try:
            b = b.spend(records, eps)
        except LimitReachedError:
            continue
        charged[b.day] = charged.get(b.day, 0) + records
    assert all(n <= 4 for n in charged.values())
    assert b.epsilon_total <= 5.0 + EPSILON_SLACK
