"""Typed decoding of a parsed TOML document into frozen dataclasses, with errors that name the field.

One reader for every TOML file of the project (the agent's and the collector's config files
and the use-case registry) and for the JSON the agent's tools read back (its status). A
file's schema is a tree of frozen dataclasses; :func:`decode` walks it by the type hints, so
a schema states each key once (name, type, default, range) and every mistake is reported the
same way: a :class:`SchemaError` with the dotted path of the field as the file writes it
(``broker.port``, ``probes[1].use_case``, ``parameters.m``), a machine-readable ``kind`` and a
problem that says what was expected and what was found. The caller adds the file name (and
turns it into its own error type).

Pure: it reads no file and knows no directory. A caller that needs more (paths relative
to the config file) passes a hook for that type.

What a schema can say:

* ``int``, ``float`` (an integer is accepted and made a float), ``bool``, ``str``,
  ``pathlib.Path`` (a non-empty string), ``datetime.date`` (a TOML local date such as
  ``2026-12-01``, or the same written as a string), ``typing.Any`` (the raw TOML value);
* ``Annotated[int | float, Range(...)]`` for a range, ``Annotated[T | None, EMPTY_IS_NONE]``
  for an optional value that ``""`` switches off (TOML has no null);
* ``Literal[...]``, ``T | None`` (absent means the default; JSON's ``null`` is None),
  ``tuple[T, ...]`` (an array),
  ``Mapping[str, T]`` (a table of free keys, returned read-only);
* a nested dataclass (a table: unknown keys are errors), and a union of dataclasses that
  carry a ``ClassVar[str]`` named ``kind`` (a table told apart by its ``kind`` key);
* cross-field rules in ``__post_init__``, raising :class:`Invalid` with the field's name;
  ``__post_init__`` calls :func:`check_ranges` so that a value built in code (not decoded)
  is held to the same ranges;
* ``MOVED_KEYS: ClassVar[Mapping[str, str]]`` on a dataclass: keys that no longer belong
  there, each with the message that says where they went.

Fields whose metadata has ``internal=True`` are not keys of the file (the caller fills them);
a ``doc`` in a required field's metadata says, when it is missing, what it should hold.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = ["EMPTY_IS_NONE", "Hook", "Invalid", "Range", "SchemaError", "check_ranges", "decode", "type_name"]

T = TypeVar("T")

Hook = Callable[[object, str], object]
"""Decodes the raw value of one type at a field (its dotted path); raises :class:`SchemaError`."""


class SchemaError(ValueError):
    """A TOML value does not fit its schema.

    Attributes:
        field: the dotted path of the field (``"broker.port"``, ``"probes[0].kind"``); ``""``
            for the document as a whole.
        kind: machine-readable: ``unknown-key``, ``missing-field``, ``bad-type``,
            ``out-of-range`` or ``bad-value``.
        problem: what was expected and what was found.
    """

    def __init__(self, field: str, kind: str, problem: str) -> None:
        self.field = field
        self.kind = kind
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class Invalid(ValueError):  # noqa: N818 - raised by a schema's __post_init__, reported as a SchemaError
    """Raised by a schema dataclass's ``__post_init__``; :func:`decode` adds the path.

    Args:
        field: the field at fault, relative to the dataclass (``"key_file"``).
        problem: what is wrong, and what is expected.
        kind: as :attr:`SchemaError.kind` (default ``bad-value``).
    """

    def __init__(self, field: str, problem: str, kind: str = "bad-value") -> None:
        self.field = field
        self.problem = problem
        self.kind = kind
        super().__init__(problem)


@dataclass(frozen=True)
class Range:
    """Bounds of a number (``Annotated[int, Range(1, 65535)]``); non-finite numbers are always out.

    Attributes:
        low: the smallest value (None: no lower bound).
        high: the largest value (None: no upper bound).
        low_open: ``low`` itself is excluded.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def holds(self, value: float) -> bool:
        """True if ``value`` is finite and within the bounds."""
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high

    def text(self) -> str:
        """``[1, 65535]``, ``(0, 60]``, ``> 0``, ``>= 1``: as a message shows it."""
        if self.low is not None and self.high is not None:
            return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"<= {self.high:g}"
        return "finite"


EMPTY_IS_NONE: Final = "empty-is-none"
"""``Annotated[T | None, EMPTY_IS_NONE]``: the empty string means None (the value is off)."""

_NOUNS: Final[Mapping[type, str]] = MappingProxyType(
    {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}
)


def type_name(value: object) -> str:
    """The TOML name of a decoded value's type (``integer``, ``string``, ``table``, ...)."""
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)


def _found(value: object) -> str:
    if isinstance(value, dict | list):
        return f"a{'n' if isinstance(value, list) else ''} {type_name(value)}"
    return f"{type_name(value)} {value!r}"


class _Decoder:
    def __init__(self, hooks: Mapping[type, Hook]) -> None:
        self.hooks = hooks

    def value(self, tp: Any, raw: object, where: str) -> Any:  # noqa: PLR0911, PLR0912  one case per type form, in precedence order
        origin = get_origin(tp)
        if origin is Annotated:
            inner, *meta = get_args(tp)
            if EMPTY_IS_NONE in meta and raw == "":
                return None
            rng = next((m for m in meta if isinstance(m, Range)), None)
            return self.value(inner, raw, where) if rng is None else self.number(inner, raw, where, rng)
        if origin in (Union, types.UnionType):
            options = get_args(tp)
            if type(None) in options and len(options) == 2:
                inner = next(o for o in options if o is not type(None))
                return None if raw is None else self.value(inner, raw, where)
            return self.tagged(options, raw, where)
        if origin is Literal:
            allowed = get_args(tp)
            if raw not in allowed or type(raw) not in {type(a) for a in allowed}:
                shown = ", ".join(map(repr, allowed))
                raise SchemaError(where, "bad-value", f"must be one of {shown}; got {_found(raw)}")
            return raw
        if origin is tuple:
            item = get_args(tp)[0]
            if not isinstance(raw, list):
                raise SchemaError(where, "bad-type", f"expected an array; got {_found(raw)}")
            return tuple(self.value(item, x, f"{where}[{i}]") for i, x in enumerate(raw))
        if origin in (dict, Mapping) or tp is Mapping:
            vt = get_args(tp)[1] if get_args(tp) else Any
            if not isinstance(raw, dict):
                raise SchemaError(where, "bad-type", f"expected a table; got {_found(raw)}")
            return MappingProxyType({str(k): self.value(vt, v, _join(where, str(k))) for k, v in raw.items()})
        if dataclasses.is_dataclass(tp):
            return self.section(typing.cast(type[Any], tp), raw, where)
        if tp in self.hooks:
            return self.hooks[tp](raw, where)
        if tp is Any:
            return raw
        if tp in (int, float):
            return self.number(tp, raw, where, None)
        if tp is bool and not isinstance(raw, bool):
            raise SchemaError(where, "bad-type", f"expected true or false; got {_found(raw)}")
        if tp is str and not isinstance(raw, str):
            raise SchemaError(where, "bad-type", f"expected a string; got {_found(raw)}")
        if tp is Path:
            if not isinstance(raw, str) or not raw:
                raise SchemaError(where, "bad-type", f"expected a path; got {_found(raw)}")
            return Path(raw)
        if tp is datetime.date:
            return _date(raw, where)
        if tp in (bool, str):
            return raw
        raise TypeError(f"schema decoder cannot handle {tp!r}")  # a bug in a schema, not in the file

    def number(self, tp: Any, raw: object, where: str, rng: Range | None) -> Any:
        expected = _expected(tp, rng)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or (tp is int and not isinstance(raw, int)):
            raise SchemaError(where, "bad-type", f"expected {expected}; got {_found(raw)}")
        value: int | float = float(raw) if tp is float else raw
        if rng is not None and not rng.holds(float(value)):
            raise SchemaError(where, "out-of-range", f"expected {expected}; got {raw!r}")
        return value

    def tagged(self, options: tuple[Any, ...], raw: object, where: str) -> Any:
        if not isinstance(raw, dict):
            raise SchemaError(where, "bad-type", f"expected a table; got {_found(raw)}")
        kind = raw.get("kind")
        by_kind = {o.kind: o for o in options}
        if kind not in by_kind:
            shown = ", ".join(map(repr, sorted(by_kind)))
            problem = f"must be one of {shown}; got {kind!r}"
            raise SchemaError(_join(where, "kind"), "missing-field" if kind is None else "bad-value", problem)
        rest = {k: v for k, v in raw.items() if k != "kind"}
        return self.section(by_kind[kind], rest, where)

    def section(self, cls: type[Any], raw: object, where: str) -> Any:
        if not isinstance(raw, dict):
            raise SchemaError(where, "bad-type", f"expected a table; got {_found(raw)}")
        hints = _hints(cls)
        known = _known_fields(cls)
        moved: Mapping[str, str] = getattr(cls, "MOVED_KEYS", {})
        for key in raw:
            if key in moved:
                raise SchemaError(_join(where, key), "unknown-key", moved[key])
            if key not in known:
                raise SchemaError(_join(where, key), "unknown-key", f"unknown key (known: {', '.join(sorted(known))})")
        # Any: the keyword arguments of a dataclass whose fields differ in type (checked above).
        kwargs: dict[str, Any] = {}
        for name, f in known.items():
            if name in raw:
                kwargs[name] = self.value(hints[name], raw[name], _join(where, name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                what = f.metadata.get("doc")
                problem = f"is required but missing; add it ({what})" if what else "is required but missing; add it"
                raise SchemaError(_join(where, name), "missing-field", problem)
        try:
            return cls(**kwargs)
        except Invalid as e:
            raise SchemaError(_join(where, e.field), e.kind, e.problem) from None


def _date(raw: object, where: str) -> datetime.date:
    """A TOML local date (``2026-12-01``), or the same as a string; not a date-time."""
    if isinstance(raw, datetime.date) and not isinstance(raw, datetime.datetime):
        return raw
    if isinstance(raw, str):
        try:
            return datetime.date.fromisoformat(raw)
        except ValueError:
            pass
    raise SchemaError(where, "bad-type", f"expected a date such as 2026-12-01; got {_found(raw)}")


def _expected(tp: Any, rng: Range | None) -> str:
    noun = _NOUNS.get(tp, "a number")
    if rng is None:
        return noun
    if rng.low is not None and rng.high is not None:
        return f"{noun} in {rng.text()}"  # "an integer in [1, 65535]"
    return f"{noun} {rng.text()}"  # "a number > 0"


_R = TypeVar("_R")


def _per_class(compute: Callable[[type[Any]], _R]) -> Callable[[type[Any]], _R]:
    """``compute`` memoized per class (classes are module-level and never change their fields)."""
    memo: dict[type[Any], _R] = {}

    @functools.wraps(compute)
    def cached(cls: type[Any]) -> _R:
        try:
            return memo[cls]
        except KeyError:
            out = memo[cls] = compute(cls)
            return out

    return cached


@_per_class
def _hints(cls: type[Any]) -> Mapping[str, Any]:
    """``cls``'s type hints, evaluated once per class: its annotations are strings (``from
    __future__ import annotations``), and evaluating them again at every decode and every
    :func:`check_ranges` was most of the time ``ldp-agent status`` spent reading the registry.
    Read-only: every decode shares it."""
    return MappingProxyType(get_type_hints(cls, include_extras=True))


@_per_class
def _known_fields(cls: type[Any]) -> Mapping[str, dataclasses.Field[Any]]:
    """The fields of ``cls`` a table may set, by name (read-only, shared by every decode)."""
    return MappingProxyType({f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")})


@_per_class
def _ranged_fields(cls: type[Any]) -> tuple[tuple[str, Any, tuple[Range, ...]], ...]:
    """``(name, type, ranges)`` of each field of ``cls`` annotated with :class:`Range` bounds."""
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if get_origin(tp) is not Annotated:
            continue
        inner, *meta = get_args(tp)
        ranges = tuple(m for m in meta if isinstance(m, Range))
        if ranges:
            out.append((f.name, inner, ranges))
    return tuple(out)


def check_ranges(obj: object) -> None:
    """Hold a dataclass's fields to their ``Annotated[..., Range(...)]`` bounds (call it from ``__post_init__``).

    Raises:
        Invalid: naming the first field out of its range, with the message :func:`decode` gives.
    """
    for name, inner, ranges in _ranged_fields(type(obj)):
        value = getattr(obj, name)
        for rng in ranges:
            if isinstance(value, int | float) and not isinstance(value, bool) and not rng.holds(float(value)):
                raise Invalid(name, f"expected {_expected(inner, rng)}; got {value!r}", kind="out-of-range")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where and key else where or key


def decode(cls: type[T], raw: object, *, field: str = "", hooks: Mapping[type, Hook] | None = None) -> T:
    """Decode a parsed TOML value (a table, as ``tomllib`` returns it) into ``cls``.

    Args:
        cls: the schema: a frozen dataclass.
        raw: the parsed TOML table.
        field: the dotted path of ``raw`` in its document, prefixed to every error's field.
        hooks: decoders for types the schema uses beyond the built-in ones (or instead of
            them: a :class:`~pathlib.Path` hook resolves relative paths).

    Raises:
        SchemaError: naming the field, with a kind and the problem.
    """
    decoded: T = _Decoder(hooks or {}).section(cls, raw, field)
    return decoded
