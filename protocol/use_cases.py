"""A use case as the registry defines it, the registry it belongs to, and their hashes.

**Canonical hash.** :attr:`Registry.hash` (16 bytes) is the first half of SHA-256 over a
canonical msgpack encoding of the *constructed* objects: for each use case, its name, the
mechanism's name and every dataclass field of the mechanism (so defaults written out or left
implicit, ``4`` or ``4.0``, key order, comments and formatting do not matter), the resolved
seed, period, limits and collector settings. Descriptions and metadata (owner, end date,
:mod:`protocol.metadata`) are excluded. Any change that affects what a report means or how
it is handled changes the hash. Reports of wire format 1 carry it; the collector still reads
them for the registry files it is given.

**Definition hash.** Each use case is versioned on its own: :attr:`UseCase.definition` (16
bytes, :func:`definition_hash`) covers exactly what changes what one of its reports means:
its name, the mechanism's registry name and constructor parameters (the public seed
included), the declared ε, the period, the daily limit and the lifetime cap. It leaves out
the collector settings (a dictionary, a threshold or a correction changes what the collector
releases, not what a report says), the description and the metadata (owner, end date: moving
an end date resumes the same definition), the registry's other use cases and the
names of the Python classes that implement them. Reports of wire format 2 carry it, so adding,
changing or retiring one use case never touches the reports of the others
(``docs/deploy.md``, "Changing the registry on a running fleet").
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import msgpack

from protocol.envelope import HASH_SIZE, largest_report_size
from protocol.errors import LdpError
from protocol.interfaces import HASHED_UNLESS_DEFAULT, Mechanism
from protocol.metadata import UseCaseMetadata

if TYPE_CHECKING:
    from protocol.server.contract import ServerMechanism

__all__ = [
    "REF_HEX_DIGITS",
    "REGISTRY_FORMAT",
    "CollectorSettings",
    "Period",
    "Registry",
    "RegistryError",
    "UseCase",
    "WireMechanism",
    "canonical_hash",
    "definition_hash",
    "mechanism_fingerprint",
]

REGISTRY_FORMAT: Final = 1
"""The registry file format this module reads (top-level ``format = 1``)."""


REF_HEX_DIGITS: Final = 8
"""Hex digits of the definition hash in a definition's name (:attr:`UseCase.ref`)."""

_HASH_DOMAIN: Final = b"ldp-telemetry/registry/v1\x00"
_DEFINITION_DOMAIN: Final = b"ldp-telemetry/use-case-definition/v1\x00"


class RegistryError(LdpError, ValueError):
    """The registry file is invalid. A configuration mistake: fix the file.

    Attributes:
        source: the file (or other source name) being loaded.
        use_case: the use case at fault, or ``None`` for a top-level problem.
        field: the dotted path of the field at fault (``"parameters.m"``), or ``""``.
        kind: machine-readable: ``syntax``, ``missing-field``, ``unknown-key``, ``bad-type``,
            ``out-of-range``, ``bad-value``, ``unknown-mechanism``, ``bad-parameter``,
            ``epsilon-too-small``.
        problem: what was expected and what was found.
    """

    def __init__(self, *, source: str, use_case: str | None, field: str, kind: str, problem: str) -> None:
        self.source = source
        self.use_case = use_case
        self.field = field
        self.kind = kind
        self.problem = problem
        where = source
        if use_case is not None:
            where += f": use case {use_case!r}"
        if field:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")


WireMechanism = Mechanism
"""The mechanism contract (:class:`protocol.interfaces.Mechanism`), under its former name here."""


class Period(enum.Enum):
    """The reporting slot of a use case. Reports carry the slot index, never a finer time."""

    SIX_HOURS = "6h"
    DAY = "1d"

    @property
    def seconds(self) -> int:
        """Length of one slot in seconds."""
        return _PERIOD_SECONDS[self._value_]  # _value_, not the slower value property: read per report

    @property
    def max_index(self) -> int:
        """Largest plausible slot index: slots starting before 2**33 s after the epoch (year 2242)."""
        return _PERIOD_MAX_INDEX[self._value_]

    def index_at(self, unix_seconds: float) -> int:
        """The slot number containing ``unix_seconds`` (slots are aligned to the Unix epoch, UTC)."""
        if not math.isfinite(unix_seconds) or unix_seconds < 0:
            raise ValueError(f"a time in seconds since the epoch, >= 0; got {unix_seconds!r}")
        return int(unix_seconds // self.seconds)


_PERIOD_SECONDS: Final = MappingProxyType({"6h": 21_600, "1d": 86_400})
_PERIOD_MAX_INDEX: Final = MappingProxyType({k: (1 << 33) // v for k, v in _PERIOD_SECONDS.items()})


@dataclass(frozen=True, kw_only=True)
class CollectorSettings:
    """Collector-side settings of a use case.

    Attributes:
        min_reports: no estimate is released for a period with fewer reports.
        release_threshold: estimated counts below it are withheld (the threshold T of 003 §3.2.2);
            0 releases everything.
        dictionary: path of the dictionary (CMS, HCMS) or candidate strings (RAPPOR), one per line,
            relative to the registry file's directory; ``None`` if none is configured.
        correction: the multiple-testing correction of the release test of every frequency
            output (CMS, HCMS, SFP, RAPPOR; ``collector.decoding.release``): each entry is tested
            one-sided against ``release_threshold`` and the correction runs over all entries
            tested (004 §4 names Bonferroni and Benjamini-Hochberg; ``collector.decoding.stats``
            has all four). The default, Benjamini-Hochberg at 0.05, bounds the expected share of
            released entries whose true count is below the threshold by 5 % at any number of
            reports (docs/design.md, invariant 9).
        alpha: its level: the family-wise error (``bonferroni``), the false-discovery rate
            (``bh``, ``storey``), both in (0, 1); the expected number of false positives
            (``pfer``), any positive number.
        top_t: SFP only: ``T``, the (puzzle piece, fragment) pairs kept per position in
            discovery (003 Alg. 10 step 10); ``None``: derived by the collector's planner.
    """

    min_reports: int
    release_threshold: float = 0.0
    dictionary: str | None = None
    correction: str = "bh"
    alpha: float = 0.05
    top_t: int | None = None


@dataclass(frozen=True, kw_only=True)
class UseCase:
    """One use case: its mechanism (constructed and validated), limits and collector settings.

    Attributes:
        name: the use case's name, as it travels in reports.
        mechanism: the frozen mechanism object.
        epsilon: the declared ε of one report (``>= mechanism.epsilon_report``).
        period: the reporting slot.
        daily_limit: most records a device sends per day; also the most one report may carry.
        lifetime_epsilon: cap on the ε a device ever spends on this use case.
        seed: the public hash seed, for hashed mechanisms; ``None`` otherwise.
        collector: collector-side settings.
        description: free text for people (not part of the registry hash).
        metadata: who answers for the use case and until when it may collect
            (:mod:`protocol.metadata`; not part of any hash).
    """

    name: str
    mechanism: Mechanism
    epsilon: float
    period: Period
    daily_limit: int
    lifetime_epsilon: float
    seed: bytes | None
    collector: CollectorSettings
    description: str = ""
    metadata: UseCaseMetadata = dataclasses.field(default_factory=UseCaseMetadata)

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """:func:`mechanism_fingerprint` of this use case's mechanism (computed once: the
        mechanism is frozen, and an agent asks for it whenever it starts a use case's state)."""
        return mechanism_fingerprint(self.mechanism)

    @functools.cached_property
    def server(self) -> ServerMechanism:
        """The server half of this use case's mechanism (:mod:`protocol.server`; numpy), built
        when a server first asks for it: a device never does."""
        from protocol.server.contract import server_of  # noqa: PLC0415 - the server half, only where it runs

        return server_of(self.mechanism)

    @functools.cached_property
    def definition(self) -> bytes:
        """The 16-byte hash of this use case's definition (:func:`definition_hash`), carried in
        every report made under it (wire format 2)."""
        return definition_hash(self)

    @functools.cached_property
    def ref(self) -> str:
        """``name@<first 8 hex digits of the definition>``: how people, the API and the store
        name one definition of a use case (``emoji@3f2a9c1b``); formatted once, as the
        collector asks for it for every report it receives."""
        return f"{self.name}@{self.definition.hex()[:REF_HEX_DIGITS]}"

    @functools.cached_property
    def cost(self) -> float:
        """The ε an accountant charges for one report: the mechanism's exact ``epsilon_report``.

        Computed once per use case (the mechanism is frozen): exact ``epsilon_report`` is
        rational arithmetic, and an agent asks for the cost several times per report."""
        return float(self.mechanism.epsilon_report)

    @functools.cached_property
    def max_report_bytes(self) -> int:
        """Bytes of this use case's largest encoded report: ``daily_limit`` records, each at
        its largest, under the largest period index (``protocol.envelope.largest_report_size``)."""
        return largest_report_size(
            use_case=self.name,
            max_period=self.period.max_index,
            daily_limit=self.daily_limit,
            max_record_bytes=self.mechanism.max_record_bytes,
        )


@dataclass(frozen=True, eq=False)
class Registry:
    """A loaded registry. Compare registries by :attr:`hash`.

    Attributes:
        use_cases: the use cases by name (read-only).
        hash: the 16-byte canonical hash that every report carries.
        source: where the registry was loaded from (for messages).
        strict: the file asked for every use case's owner and end date (``strict = true``;
            not part of the hash).
    """

    use_cases: Mapping[str, UseCase]
    hash: bytes
    source: str = "<registry>"
    strict: bool = False

    @property
    def hash_hex(self) -> str:
        """The canonical hash in hex, for logs and the CLI."""
        return self.hash.hex()

    def __getitem__(self, name: str) -> UseCase:
        return self.use_cases[name]

    def __contains__(self, name: object) -> bool:
        return name in self.use_cases


# --- canonical hash ------------------------------------------------------------------------


def _canonical(value: object) -> object:  # noqa: PLR0911  one case per kind of value a registry holds
    """A plain, order-independent form of a parsed value for hashing."""
    if value is None or isinstance(value, bool | str | bytes):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # 4 and 4.0 mean the same; -0.0 and 0.0 too.
        return int(value) if value.is_integer() else value
    if type(value).__module__ == "numpy":
        # A numpy scalar or array (never in built-in parameters; an extension may hold one):
        # its Python value, without importing numpy here.
        return _canonical(value.tolist())  # type: ignore[attr-defined]
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(value[k]) for k in sorted(value, key=str)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canonical(getattr(value, f.name)) for f in _hashed_fields(value)}
        return {"type": type(value).__name__, "fields": dict(sorted(fields.items()))}
    raise TypeError(f"registry hash: cannot canonicalise a {type(value).__name__}")


def _hashed_fields(value: object) -> list[dataclasses.Field[object]]:
    """A dataclass's fields as the hashes see them: a field marked :data:`HASHED_UNLESS_DEFAULT`
    is left out while it holds its default, so adding such a parameter to a mechanism leaves
    the hashes of every use case that does not set it as they were (SFP's ``alphabet``)."""
    return [
        f
        for f in dataclasses.fields(value)  # type: ignore[arg-type]
        if not (f.metadata.get(HASHED_UNLESS_DEFAULT) and getattr(value, f.name) == f.default)
    ]


def mechanism_fingerprint(mechanism: Mechanism) -> bytes:
    """16 bytes that identify a mechanism's parameters (name, every field, the seed).

    Canonical like the registry hash (``4`` and ``4.0`` agree). The agent stores it next to
    permanent state and the collector next to aggregates: when a registry changes the
    parameters, state drawn or folded under the old ones is never reused.
    """
    doc = {"name": mechanism.name, "mechanism": _canonical(mechanism)}
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(b"ldp-telemetry/mechanism/v1\x00" + encoded).digest()[:HASH_SIZE]


def _definition_canonical(value: object) -> object:
    """:func:`_canonical`, but with no Python class name in it: a dataclass (a mechanism or its
    buckets) is its constructor fields, and its ``kind`` where it declares one, so renaming or
    splitting a class leaves every definition hash as it was."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _definition_canonical(getattr(value, f.name)) for f in _hashed_fields(value) if f.init}
        kind = getattr(type(value), "kind", None)
        doc: dict[str, object] = {"fields": dict(sorted(fields.items()))}
        if isinstance(kind, str):
            doc["kind"] = kind
        return doc
    if isinstance(value, list | tuple):
        return [_definition_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _definition_canonical(value[k]) for k in sorted(value, key=str)}
    return _canonical(value)


def definition_hash(use_case: UseCase) -> bytes:
    """The 16-byte hash of one use case's definition (the module docstring says what it covers).

    The first half of SHA-256 over a domain tag and the canonical msgpack encoding of the
    name, the mechanism's registry name, its constructor parameters, ε, period, daily limit
    and lifetime cap (``4`` and ``4.0`` agree; key order and formatting do not matter).
    """
    doc = {
        "name": use_case.name,
        "mechanism": use_case.mechanism.name,
        "parameters": _definition_canonical(use_case.mechanism),
        "epsilon": _canonical(use_case.epsilon),
        "period": use_case.period.value,
        "daily_limit": use_case.daily_limit,
        "lifetime_epsilon": _canonical(use_case.lifetime_epsilon),
    }
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(_DEFINITION_DOMAIN + encoded).digest()[:HASH_SIZE]


def _collector_canonical(settings: CollectorSettings) -> object:
    """The collector settings as the registry hash has always encoded them.

    SFP's alphabet was a collector setting (``null`` unless set) before it became a parameter
    of the mechanism, where the hash covers it now; its ``null`` stays here so that every
    registry's hash is what it was.
    """
    doc = _canonical(settings)
    assert isinstance(doc, dict)
    doc["fields"] = dict(sorted({**doc["fields"], "alphabet": None}.items()))
    return doc


def canonical_hash(use_cases: Mapping[str, UseCase]) -> bytes:
    """The 16-byte whole-registry hash (:attr:`Registry.hash`; the module docstring says what it covers)."""
    doc = {
        "format": REGISTRY_FORMAT,
        "use_cases": {
            name: {
                "mechanism": _canonical(uc.mechanism),
                "mechanism_name": uc.mechanism.name,
                "epsilon": _canonical(uc.epsilon),
                "period": uc.period.value,
                "daily_limit": uc.daily_limit,
                "lifetime_epsilon": _canonical(uc.lifetime_epsilon),
                "seed": uc.seed,
                "collector": _collector_canonical(uc.collector),
            }
            for name, uc in sorted(use_cases.items())
        },
    }
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(_HASH_DOMAIN + encoded).digest()[:HASH_SIZE]
