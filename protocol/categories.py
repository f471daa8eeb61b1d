"""What the frequency oracles over a fixed list of categories share on the device.

``grr``, ``oue``, ``ss`` and ``pgr`` (docs/estimation.md, "Frequency oracles at the
local-privacy limit") estimate how many devices hold each of ``k`` categories that every device
knows in advance (a setting, a device model, a browser): the registry lists them under
``parameters.categories`` and the collector estimates every one of them, in that order
(:attr:`~protocol.interfaces.EstimateKind.CATEGORIES`). Each of them privatizes a value the
moment it is recorded and keeps no permanent state (event-level privacy, as 003 §3.2.1 for the
sketches), so a report costs its ε and the accountant charges every one.

:class:`FixedCategories` is the half of the device contract they have in common: the ε and
category fields and their checks, the index of a category, the value checks, the event-level
privacy figures; each module adds its randomizer, its record and its ε of one report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.checks import EPSILON_MIN_MULTI, check_epsilon
from protocol.errors import InputError, ParameterError
from protocol.interfaces import EstimateKind, NoPermanentState, Privatization, ValueType

__all__ = ["CATEGORIES_MAX", "FixedCategories", "check_categories", "convert_categories"]

CATEGORIES_MAX: Final = 1 << 24
"""Most categories a use case may list (a category list is part of the registry every device
reads; 16 million is far past any list a person writes)."""


def check_categories(value: object, *, low: int = 2) -> tuple[str, ...]:
    """``value`` as a tuple of at least ``low`` distinct strings.

    Raises:
        ParameterError: naming ``categories``, for anything else.
    """
    allowed = f"a list of {low} to {CATEGORIES_MAX:,} distinct strings"
    if not isinstance(value, list | tuple):
        raise ParameterError("categories", allowed, value)
    cats = tuple(value)
    # The message shows what is wrong, not a list of up to millions of entries.
    shown = f"{len(cats):,} entries" if len(cats) > 10 else cats
    if not low <= len(cats) <= CATEGORIES_MAX:
        raise ParameterError("categories", allowed, shown)
    odd = next((c for c in cats if not isinstance(c, str)), None)
    if odd is not None:
        raise ParameterError("categories", f"{allowed}; {odd!r} is not a string", shown)
    seen: set[str] = set()
    for c in cats:
        if c in seen:
            raise ParameterError("categories", f"{allowed}; {c!r} appears twice", shown)
        seen.add(c)
    return cats


def convert_categories(value: object) -> object:
    """The registry's converter: a TOML array becomes a tuple (the constructor checks the rest)."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, kw_only=True)
class FixedCategories(NoPermanentState):
    """The device contract's category half: ε and the list, a value's check, its index.

    The mechanism is a frozen, keyword-only dataclass that extends this one: it inherits the
    ``epsilon`` and ``categories`` fields, checked here in ``__post_init__`` (a mechanism with
    more parameters checks them after calling it). Every such mechanism privatizes each value
    at once (an event), takes one of the categories and is estimated as a count per category.

    Args:
        epsilon: ε of one report, in (0, 64].
        categories: the distinct category names (at least two).
    """

    name: ClassVar[str]
    kind: ClassVar[EstimateKind] = EstimateKind.CATEGORIES
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
    epsilon: float
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon, low=EPSILON_MIN_MULTI)
        object.__setattr__(self, "categories", check_categories(self.categories))

    @property
    def epsilon_report(self) -> float:
        """ε of one report for the implemented coins (each mechanism computes it)."""
        raise NotImplementedError

    def privacy_figures(self) -> dict[str, float]:
        """ε of one report (event-level: every report spends it)."""
        return {"epsilon_report": self.epsilon_report}

    @property
    def k(self) -> int:
        """The number of categories."""
        return len(self.categories)

    @property
    def fixed_categories(self) -> tuple[str, ...]:
        """The categories, in the order the collector estimates them."""
        return self.categories

    @cached_property
    def category_index(self) -> Mapping[str, int]:
        """Each category's position (a dictionary: a list search is linear in ``k``)."""
        return {c: i for i, c in enumerate(self.categories)}

    def check_value(self, value: object) -> str:
        """One of the categories (a value that can never be reported is refused before ε is spent)."""
        if not isinstance(value, str) or value not in self.category_index:
            shown = ", ".join(self.categories[:5]) + (", ..." if len(self.categories) > 5 else "")
            raise InputError(f"takes one of its {len(self.categories):,} categories ({shown}); got {value!r}")
        return value

    def index_of(self, value: str) -> int:
        """The position of a category (``InputError`` for anything else)."""
        try:
            return self.category_index[value]
        except (KeyError, TypeError):
            raise InputError(f"{value!r} is not one of the {len(self.categories):,} categories") from None

    def setup(self, rng: object) -> None:
        """No permanent state: each event is privatized afresh."""
        return

    def parse_value(self, text: str) -> str:
        """The text itself."""
        return text

    def counter_input(self, total: float) -> Any:
        """Not a counter: refused."""
        raise InputError(f"{self.name} is not a counter")
