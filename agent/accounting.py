"""Per-use-case privacy accounting: the daily record limit and the lifetime ε cap.

:class:`Budget` is a small pure value: ``check`` says whether a report of ``records``
records costing ``epsilon`` fits, ``spend`` returns the charged budget, ``remaining`` what is
left. The agent persists the charged budget (together with the staged report) *before* the
report can be published, so a crash can lose a report but never send one uncharged.

Days are UTC day numbers, and the budget's day only moves forward: a clock set backwards
reads as the latest day already seen, so it cannot reset a day's count (003 §3.2.1: the
limit on privatized records transmitted per day and use case). A clock set forward starts
a new day, as a real day would; nothing on a device can tell the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.errors import AgentError
from protocol.plain import PlainDoc

__all__ = ["EPSILON_SLACK", "Budget", "LimitReachedError", "Remaining", "day_of"]

EPSILON_SLACK = 1e-9
"""Tolerance on float sums of ε (rounding only; far below any mechanism's ε)."""

DAY_SECONDS = 86_400


def day_of(t: float) -> int:
    """The UTC day number of wall-clock time ``t``."""
    return int(t // DAY_SECONDS)


class LimitReachedError(AgentError):
    """A report would exceed the daily record limit or the lifetime ε cap.

    Attributes:
        which: ``"daily-limit"`` or ``"epsilon-cap"``.
    """

    def __init__(self, which: str, detail: str) -> None:
        self.which = which
        super().__init__(f"{which}: {detail}")


@dataclass(frozen=True, slots=True)
class Remaining:
    """What a budget still allows today and for the rest of the use case's life."""

    records_today: int
    epsilon: float


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The accounting state of one use case.

    Attributes:
        daily_limit: records that may be sent per day.
        epsilon_cap: lifetime ε the use case may spend.
        day: the latest UTC day seen (monotone).
        records_today: records charged on ``day``.
        epsilon_today: ε charged on ``day``.
        epsilon_total: ε charged over the use case's life.
    """

    daily_limit: int
    epsilon_cap: float
    day: int = 0
    records_today: int = 0
    epsilon_today: float = 0.0
    epsilon_total: float = 0.0

    def at(self, day: int) -> Budget:
        """The budget as seen on ``day`` (never earlier than the latest day seen)."""
        if day <= self.day:
            return self
        return replace(self, day=day, records_today=0, epsilon_today=0.0)

    def remaining(self) -> Remaining:
        """Records left today and ε left for the use case's life."""
        return Remaining(
            records_today=max(0, self.daily_limit - self.records_today),
            epsilon=max(0.0, self.epsilon_cap - self.epsilon_total),
        )

    def exhausted(self, cost: float) -> bool:
        """True once not even one more record of ε ``cost`` fits under the lifetime cap.

        The use case then stops recording and reporting for good.
        """
        return self.epsilon_total + cost > self.epsilon_cap + EPSILON_SLACK

    def check(self, records: int, epsilon: float) -> None:
        """Raise :class:`LimitReachedError` unless a report of this size and cost fits.

        Raises:
            LimitReachedError: naming the limit that would be exceeded.
            ValueError: for negative arguments.
        """
        if records < 0 or epsilon < 0:
            raise ValueError("records and epsilon are non-negative")
        if self.records_today + records > self.daily_limit:
            raise LimitReachedError(
                "daily-limit", f"{self.records_today} + {records} records exceeds {self.daily_limit} per day"
            )
        if self.epsilon_total + epsilon > self.epsilon_cap + EPSILON_SLACK:
            raise LimitReachedError(
                "epsilon-cap", f"spent {self.epsilon_total:.6g} + {epsilon:.6g} exceeds the cap {self.epsilon_cap:.6g}"
            )

    def fits(self, records: int, epsilon: float) -> bool:
        """True if :meth:`check` would accept the report."""
        try:
            self.check(records, epsilon)
        except LimitReachedError:
            return False
        return True

    def spend(self, records: int, epsilon: float) -> Budget:
        """The budget after charging a report (checked first).

        Raises:
            LimitReachedError: if it does not fit.
        """
        self.check(records, epsilon)
        return replace(
            self,
            records_today=self.records_today + records,
            epsilon_today=self.epsilon_today + epsilon,
            epsilon_total=self.epsilon_total + epsilon,
        )

    def with_limits(self, *, daily_limit: int, epsilon_cap: float) -> Budget:
        """The same spending under (possibly new) limits from the registry."""
        return replace(self, daily_limit=daily_limit, epsilon_cap=epsilon_cap)

    def to_plain(self) -> PlainDoc:
        """Plain data for the sealed use-case file (the limits come from the registry)."""
        return {
            "day": self.day,
            "records_today": self.records_today,
            "epsilon_today": self.epsilon_today,
            "epsilon_total": self.epsilon_total,
        }

    @classmethod
    def from_plain(cls, data: object, *, daily_limit: int, epsilon_cap: float) -> Budget:
        """Restore spending saved by :meth:`to_plain` under the given limits.

        Raises:
            ValueError: if ``data`` is malformed.
        """
        if not isinstance(data, dict):
            raise ValueError("budget: expected a mapping")
        day, records, eps_today, eps_total = (
            data.get("day"),
            data.get("records_today"),
            data.get("epsilon_today"),
            data.get("epsilon_total"),
        )
        if not (isinstance(day, int) and isinstance(records, int) and records >= 0 and day >= 0):
            raise ValueError("budget: day and records_today are non-negative integers")
        if not (isinstance(eps_today, float) and isinstance(eps_total, float) and 0 <= eps_today <= eps_total):
            raise ValueError("budget: need 0 <= epsilon_today <= epsilon_total")
        return cls(
            daily_limit=daily_limit,
            epsilon_cap=epsilon_cap,
            day=day,
            records_today=records,
            epsilon_today=eps_today,
            epsilon_total=eps_total,
        )
