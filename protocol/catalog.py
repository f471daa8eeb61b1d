"""The definitions a collector accepts: its current registry and the earlier ones still in the field.

A fleet never changes its registry at one instant: agents take a new registry file over days
or weeks, and until one does, it goes on reporting under the definitions it has. Each report
names its use case and the hash of that use case's definition
(:attr:`protocol.registry.UseCase.definition`; wire format 1 named the whole registry's
hash instead), so a collector given every registry file still in the field can count each
report under exactly the definition it was made with. A :class:`Catalog` is that set of
definitions, built once from the files' parsed registries (``protocol/`` reads no file):

* the **current** registry (what agents are moving to) and the **earlier** ones, newest
  first; a definition present in several files is one definition;
* each definition is known by its :attr:`~protocol.registry.UseCase.ref`
  (``name@<8 hex digits>``), which is how the store, the HTTP API, the CLI and the dashboard
  name it; a bare use-case name stands for its current definition (or, for a use case the
  current registry no longer has, its newest earlier one);
* a definition may be given a **retirement date**: reports for its periods that start on or
  after that day (UTC) are refused as ``retired``.

``docs/deploy.md`` ("Changing the registry on a running fleet") is the operator's procedure.
"""

from __future__ import annotations

import datetime
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from protocol.errors import LdpError
from protocol.registry import REF_HEX_DIGITS, Registry, UseCase

__all__ = ["Catalog", "CatalogError", "catalog_of"]

_DAY_SECONDS: Final = 86_400


class CatalogError(LdpError, ValueError):
    """The registry files or retirement dates given to a collector do not fit together.

    Attributes:
        field: the configuration field at fault (``retire.homepage@1a2b3c4d``), or ``""``.
        problem: what was expected and what was found.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


@dataclass(frozen=True, eq=False)
class Catalog:
    """Every use-case definition a collector accepts (build it with :meth:`build`).

    Attributes:
        current: the current registry (what agents are moving to).
        earlier: earlier registries still in the field, newest first.
        use_cases: every definition by its ref: the current registry's first, then the
            earlier ones that the current registry does not have, each once.
        retired: ref -> the first UTC day (a ``datetime.date``) whose periods are refused.
    """

    current: Registry
    earlier: tuple[Registry, ...]
    use_cases: Mapping[str, UseCase]
    retired: Mapping[str, datetime.date] = field(default_factory=dict)
    _by_definition: Mapping[bytes, UseCase] = field(default_factory=dict, repr=False)
    _by_registry: Mapping[bytes, Registry] = field(default_factory=dict, repr=False)
    _by_name: Mapping[str, tuple[UseCase, ...]] = field(default_factory=dict, repr=False)
    _largest: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        current: Registry,
        earlier: Sequence[Registry] = (),
        *,
        retire: Mapping[str, datetime.date] | None = None,
    ) -> Catalog:
        """The catalog of ``current`` and ``earlier`` (newest first), with retirement dates.

        Args:
            current: the current registry.
            earlier: earlier registries whose agents are still in the field.
            retire: definition ref (``name@hex``, at least 8 hex digits) or a bare use-case
                name (every definition of it) -> the first UTC day refused.

        Raises:
            CatalogError: a retirement names no definition, or two definitions of one use
                case share their ref (a hash prefix collision: give the ref more digits).
        """
        registries = (current, *[r for r in earlier if r.hash != current.hash])
        by_definition: dict[bytes, UseCase] = {}
        by_ref: dict[str, UseCase] = {}
        by_name: dict[str, list[UseCase]] = {}
        for registry in registries:
            for uc in registry.use_cases.values():
                if uc.definition in by_definition:
                    continue
                clash = by_ref.get(uc.ref)
                if clash is not None:
                    raise CatalogError(
                        "",
                        f"two definitions of use case {uc.name!r} share the ref {uc.ref} ({clash.definition.hex()} in "
                        f"{_sources(registries, clash)}, {uc.definition.hex()} in {registry.source}); change either",
                    )
                by_definition[uc.definition] = uc
                by_ref[uc.ref] = uc
                by_name.setdefault(uc.name, []).append(uc)
        catalog = cls(
            current=current,
            earlier=tuple(registries[1:]),
            use_cases=MappingProxyType(by_ref),
            _by_definition=MappingProxyType(by_definition),
            _by_registry=MappingProxyType({r.hash: r for r in registries}),
            _by_name=MappingProxyType({n: tuple(ucs) for n, ucs in by_name.items()}),
            # The decoder asks this of every report: worked out once per name, not per report.
            _largest=MappingProxyType(
                {
                    n: (max(uc.max_report_bytes for uc in ucs), max(uc.daily_limit for uc in ucs))
                    for n, ucs in by_name.items()
                }
            ),
        )
        dates: dict[str, datetime.date] = {}
        for key, day in (retire or {}).items():
            matches = catalog.matching(key)
            if not matches:
                raise CatalogError(f"retire.{key}", f"names no definition; the definitions are {', '.join(by_ref)}")
            for uc in matches:
                dates[uc.ref] = min(day, dates.get(uc.ref, day))
        object.__setattr__(catalog, "retired", MappingProxyType(dates))
        return catalog

    # --- lookups -------------------------------------------------------------------------

    @property
    def registries(self) -> tuple[Registry, ...]:
        """The current registry, then the earlier ones."""
        return (self.current, *self.earlier)

    @property
    def hash_hex(self) -> str:
        """The current registry's canonical hash, in hex (for status and logs)."""
        return self.current.hash_hex

    def names(self) -> tuple[str, ...]:
        """Every use-case name with a definition here, the current registry's first."""
        return tuple(self._by_name)

    def by_definition(self, definition: bytes) -> UseCase | None:
        """The definition with this hash (wire format 2), or None."""
        return self._by_definition.get(definition)

    def by_registry(self, registry_hash: bytes) -> Registry | None:
        """The registry with this canonical hash (wire format 1), or None."""
        return self._by_registry.get(registry_hash)

    def definitions_of(self, name: str) -> tuple[UseCase, ...]:
        """Every definition of a use case, the current one (if any) first, then newest first."""
        return self._by_name.get(name, ())

    def current_of(self, name: str) -> UseCase | None:
        """The current registry's definition of ``name``, or None."""
        return self.current.use_cases.get(name)

    def is_current(self, use_case: UseCase) -> bool:
        """True if ``use_case`` is the current registry's definition of its name."""
        current = self.current.use_cases.get(use_case.name)
        return current is not None and current.definition == use_case.definition

    def resolve(self, text: str) -> UseCase | None:
        """The definition ``text`` names: a ref (``name@hex``, 8 or more hex digits), or a bare
        name (its current definition, else its newest earlier one); None if none matches."""
        matches = self.matching(text)
        if "@" in text:
            return matches[0] if len(matches) == 1 else None
        return matches[0] if matches else None

    def matching(self, text: str) -> tuple[UseCase, ...]:
        """The definitions ``text`` names: every one of a bare name, or those of ``name@hex``
        whose hash starts with ``hex`` (at least 8 digits)."""
        name, at, prefix = text.partition("@")
        found = self._by_name.get(name, ())
        if not at:
            return found
        prefix = prefix.lower()
        if len(prefix) < REF_HEX_DIGITS or any(c not in "0123456789abcdef" for c in prefix):
            return ()
        return tuple(uc for uc in found if uc.definition.hex().startswith(prefix))

    def sources(self, use_case: UseCase) -> tuple[str, ...]:
        """The registry files that hold this definition, the current one first."""
        return tuple(
            r.source
            for r in self.registries
            if (uc := r.use_cases.get(use_case.name)) is not None and uc.definition == use_case.definition
        )

    def retired_from(self, use_case: UseCase) -> int | None:
        """The first period index refused as ``retired`` (periods starting on or after the
        retirement day), or None for a definition that is not retired."""
        day = self.retired.get(use_case.ref)
        if day is None:
            return None
        start = (day - datetime.date(1970, 1, 1)).days * _DAY_SECONDS
        seconds = use_case.period.seconds
        return -(-start // seconds)

    def largest_report(self, name: str) -> tuple[int, int] | None:
        """The largest report size and record count any definition of ``name`` allows (None:
        no such use case); the decoder's cheap bound before a report's definition is known."""
        return self._largest.get(name)

    @property
    def max_daily_limit(self) -> int:
        """The largest daily limit of any definition."""
        return max(uc.daily_limit for uc in self.use_cases.values())


def _sources(registries: Iterable[Registry], use_case: UseCase) -> str:
    return ", ".join(
        r.source for r in registries if (uc := r.use_cases.get(use_case.name)) and uc.definition == use_case.definition
    )


_SINGLE: weakref.WeakKeyDictionary[Registry, Catalog] = weakref.WeakKeyDictionary()


def catalog_of(registry: Registry | Catalog) -> Catalog:
    """``registry`` as a catalog of its own definitions only (a catalog is returned as is).

    The catalog of a registry is built once and kept as long as the registry lives.
    """
    if isinstance(registry, Catalog):
        return registry
    found = _SINGLE.get(registry)
    if found is None:
        found = Catalog.build(registry)
        _SINGLE[registry] = found
    return found
