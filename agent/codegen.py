"""``ldp-agent generate``: typed code per use case, for applications that record through the agent.

An application that records through the generated code is checked when it is built: a misspelt
use case is a missing function, and a string where a counter belongs is a type error (mypy,
or the C compiler with ``-Werror``), instead of a ``value-refused`` on the device. The code
calls the clients of this repository (:mod:`agent.client`, ``clients/c/``) and holds nothing
else.

What each use case takes is asked of its mechanism (docs/design.md, convention 4), never of
its name, through :func:`agent.mechanism_calls.value_facts` (the one module of the agent that calls
a mechanism), so a mechanism added to the registry gets its typed function unchanged:

* ``value_type`` gives the type: a bit is a ``bool``, a count an integer, a number a float, a
  string a string;
* ``fixed_categories`` (kind ``CATEGORIES``) turns a string into an enumeration of them;
* ``privatization`` ``COUNTER`` adds the counter's ``key`` (an application, say);
* ``value_range``, and a discovery mechanism's ``alphabet``, go into the documentation with the
  use case's description, ε, period, daily limit, owner and end date.

:func:`signatures` is that reading, once for both languages; :mod:`agent.codegen_python` and
:mod:`agent.codegen_c` write it out, and :func:`agent.generate.generate` picks the writer.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

from agent.mechanism_calls import ValueFacts, value_facts
from protocol.interfaces import ValueType
from protocol.registry import Registry, UseCase

__all__ = ["GenerateError", "Shape", "Signature", "identifier", "signatures", "unique"]


class GenerateError(ValueError):
    """The registry cannot be written as code (two use cases whose names make the same identifier)."""


class Shape(enum.Enum):
    """What a use case's function takes, from its mechanism."""

    BIT = "bit"
    COUNT = "count"
    NUMBER = "number"
    STRING = "string"
    CATEGORY = "category"


_SHAPES: Final = {
    ValueType.BIT: Shape.BIT,
    ValueType.COUNT: Shape.COUNT,
    ValueType.NUMBER: Shape.NUMBER,
    ValueType.STRING: Shape.STRING,
}


@dataclass(frozen=True)
class Signature:
    """One use case as a typed function.

    Attributes:
        use_case: the use case's name (what the request carries).
        name: its identifier, ``snake_case`` (``app_usage_seconds``).
        shape: what the function takes.
        counter: it takes a counter's ``key``.
        categories: the fixed categories a ``CATEGORY`` use case takes, in the mechanism's order.
        doc: the lines of its documentation.
    """

    use_case: str
    name: str
    shape: Shape
    counter: bool
    categories: tuple[str, ...]
    doc: tuple[str, ...]


def identifier(text: str) -> str:
    """``text`` as a ``snake_case`` identifier (ASCII letters, digits and ``_``; never empty)."""
    word = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    return word or "value"


def _shape(facts: ValueFacts) -> Shape:
    return Shape.CATEGORY if facts.categories else _SHAPES[facts.value_type]


def _doc(use_case: UseCase, facts: ValueFacts, shape: Shape) -> tuple[str, ...]:
    lines = [use_case.description or f"Use case {use_case.name}."]
    cost = f"ε {use_case.cost:.4g} per report"
    if use_case.epsilon > use_case.cost * (1 + 1e-9):
        cost += f" (declared at most {use_case.epsilon:g})"
    lines.append(
        f"Mechanism {facts.mechanism}, {cost}, period {use_case.period.value}, daily limit {use_case.daily_limit}, "
        f"lifetime ε {use_case.lifetime_epsilon:g}."
    )
    what = {
        Shape.BIT: "A flag.",
        Shape.COUNT: "A count",
        Shape.NUMBER: "A number",
        Shape.STRING: "A string.",
        Shape.CATEGORY: "One of the categories.",
    }[shape]
    if shape in (Shape.COUNT, Shape.NUMBER):
        bounds = facts.value_range
        what += f" in [{bounds[0]:g}, {bounds[1]:g}]." if bounds is not None else " (>= 0)."
    if facts.counter:
        what += " Added to the period's running total per key, privatized and sent once when the period ends."
    if facts.alphabet is not None:
        what += f" Characters of {facts.alphabet!r} only; others are refused."
    lines.append(what)
    meta = use_case.metadata
    owner = meta.owner or "no owner named in the registry"
    ends = f"expires {meta.expires.isoformat()}" if meta.expires is not None else "no end date"
    lines.append(f"Owner: {owner}; {ends}.")
    return tuple(lines)


def signatures(registry: Registry) -> list[Signature]:
    """Every use case of ``registry`` as a :class:`Signature`, in the registry's order.

    Raises:
        GenerateError: two use cases make the same identifier (``a-b`` and ``a_b``).
    """
    found: dict[str, str] = {}
    out = []
    for name, uc in registry.use_cases.items():
        ident = identifier(name)
        if ident in found:
            raise GenerateError(
                f"use cases {found[ident]!r} and {name!r} both make the identifier {ident!r}; rename one"
            )
        found[ident] = name
        facts = value_facts(uc)
        shape = _shape(facts)
        categories = facts.categories or ()
        out.append(Signature(name, ident, shape, facts.counter, categories, _doc(uc, facts, shape)))
    return out


def unique(names: list[str]) -> list[str]:
    """``names`` with ``_2``, ``_3``, ... added to repeats, so that each is distinct."""
    taken: set[str] = set()
    out = []
    for name in names:
        candidate, n = name, 1
        while candidate in taken:
            n += 1
            candidate = f"{name}_{n}"
        taken.add(candidate)
        out.append(candidate)
    return out
