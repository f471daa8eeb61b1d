"""A mechanism's device half: the typed contract of what every mechanism answers on a device.

A mechanism is one typed contract, not a name (``docs/design.md``, "Mechanisms"): the agent,
the collector, the planner and the fleet ask the mechanism object what they need instead of
switching on its registry string. It has two halves:

* the **device half**, here: the mechanism's frozen parameters (validated once), its
  :class:`Privatization` (when the agent privatizes), its :class:`ValueType` and the validation
  and coercion of a recorded value, its per-device state in plain form, the privatizer that
  turns a value into a record's wire form, and its ε figures. It is pure Python: a device
  installs no numpy (``tests/test_base_install.py``).
* the **server half**, in :mod:`protocol.server` (numpy): decoding records, aggregates,
  estimates, the planner's formulas. The device half's ``server`` attribute names it
  (``"protocol.server.cms:CMSServer"``); :func:`protocol.server.contract.server_of` builds it.

Per kind of estimate, a few facts of the parameters are asked of the device half too (a
histogram's bucket edges, a frequency oracle's fixed categories, a discovery mechanism's
longest string): :class:`HistogramMechanism`, :class:`FrequencyMechanism` and
:class:`DiscoveryMechanism`, narrowed by :func:`as_histogram` and its siblings.

A module makes itself known with a :class:`MechanismEntry` (its name, its parameters' class,
which of the use case's fields it takes); the registry builds use cases from an explicit tuple
of entries (:data:`protocol.registry.BUILTIN_MECHANISMS`, and any a caller adds), so importing
a module registers nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from protocol.errors import InputError, StateError
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource

__all__ = [
    "HASHED_UNLESS_DEFAULT",
    "DiscoveryMechanism",
    "EstimateKind",
    "EventLevelStrings",
    "FrequencyMechanism",
    "HistogramMechanism",
    "Mechanism",
    "MechanismEntry",
    "MemoizedState",
    "NoPermanentState",
    "PlainRecords",
    "Privatization",
    "RecordValue",
    "ValueType",
    "as_discovery",
    "as_frequencies",
    "as_histogram",
    "memos_in_plain",
    "own",
]

RecordValue = int | float | str | bytes
"""A value the agent records, after the mechanism's validation and coercion."""

HASHED_UNLESS_DEFAULT = "ldp-hashed-unless-default"
"""Field metadata of a mechanism parameter added after use cases were deployed: while it holds
its default it is left out of every hash (:mod:`protocol.use_cases`), so the definitions,
fingerprints and registry hashes of use cases that do not set it stay as they were."""

T = TypeVar("T")


class Privatization(enum.Enum):
    """When the agent privatizes a value (docs/design.md §3.3).

    * ``COUNTER``: recorded values add up to a running total per period and counter key;
      when the period closes the total is answered from the device's permanent state
      (000 §3.1, §3.4) and erased. The total is the only raw value the agent keeps.
    * ``STRING``: privatized when recorded from a memo kept in the permanent state, keyed by
      a keyed hash (004 §2 step 2); each distinct value is reported at most once per period.
    * ``EVENT``: event-level privacy (003 §3.2.1): privatized at once, only the record kept.
    """

    COUNTER = "counter"
    STRING = "string"
    EVENT = "event"


class ValueType(enum.Enum):
    """What a use case records: a bit, a count in ``[0, m]``, a non-negative number, a string."""

    BIT = "bit"
    COUNT = "count"
    NUMBER = "number"
    STRING = "string"


class EstimateKind(enum.Enum):
    """What the collector estimates from a mechanism's aggregate, and which protocol it meets.

    :attr:`result` is the coarser family the JSON estimate names (``"frequencies"`` for
    every per-string output).
    """

    PROPORTION = "proportion"  # MeanMechanism: share of devices whose bit is 1
    MEAN = "mean"  # MeanMechanism: mean value
    HISTOGRAM = "histogram"  # HistogramMechanism
    DICTIONARY = "dictionary"  # FrequencyMechanism: counts of the entries of a dictionary
    CATEGORIES = "categories"  # FrequencyMechanism: counts of a fixed set of categories
    CANDIDATES = "candidates"  # CandidateMechanism: candidates decoded jointly (004 §4)
    DISCOVERY = "discovery"  # DiscoveryMechanism: strings found without a dictionary

    @property
    def result(self) -> str:
        """``proportion``, ``mean``, ``histogram`` or ``frequencies``."""
        if self in (EstimateKind.PROPORTION, EstimateKind.MEAN, EstimateKind.HISTOGRAM):
            return str(self.value)
        return "frequencies"

    @property
    def scalar(self) -> bool:
        """True for one number per period (a proportion or a mean)."""
        return self in (EstimateKind.PROPORTION, EstimateKind.MEAN)


@runtime_checkable
class Mechanism(Protocol):
    """A mechanism's device half: what every mechanism answers on a device (pure Python)."""

    @property
    def name(self) -> str:
        """The registry name (``"cms"``, ...)."""
        ...

    @property
    def kind(self) -> EstimateKind:
        """What is estimated from the aggregate (and which kind protocol the server half meets)."""
        ...

    @property
    def privatization(self) -> Privatization:
        """When the agent privatizes a recorded value."""
        ...

    @property
    def value_type(self) -> ValueType:
        """What a use case of this mechanism records."""
        ...

    @property
    def value_range(self) -> tuple[float, float] | None:
        """The closed range of a recorded number (``None``: unbounded or not a number)."""
        ...

    @property
    def epsilon_report(self) -> float:
        """ε of one report: what an accountant charges."""
        ...

    def privacy_figures(self) -> Mapping[str, float]:
        """Every ε figure of the mechanism by name (``epsilon_report`` always;
        ``epsilon_longitudinal`` for a mechanism with memoized responses: what one memo reveals
        of an unchanged value however many reports draw on it), and the parameters a device's
        local policy bounds (RAPPOR's ``f``)."""
        ...

    def check_value(self, value: object) -> RecordValue:
        """The value coerced to what ``privatize`` takes; ``InputError`` says why not."""
        ...

    def parse_value(self, text: str) -> RecordValue:
        """A value typed on a command line; ``InputError`` if the text is not one."""
        ...

    def counter_input(self, total: float) -> RecordValue:
        """What a counter's period total is privatized as (COUNTER mechanisms)."""
        ...

    def setup_plain(self, rng: RandomSource) -> object:
        """Fresh per-device permanent state in plain form (``None`` if the mechanism keeps none)."""
        ...

    def check_state_plain(self, data: object) -> None:
        """Raise ``StateError`` if saved state ``data`` does not belong to this mechanism."""
        ...

    def privatize_plain(self, value: object, state: object, rng: RandomSource) -> tuple[object, object]:
        """Privatize a checked value with plain state; the record's wire form and the plain state to save."""
        ...

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records of this mechanism in wire form (``TypeError`` for another's records)."""
        ...

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record's wire form takes in msgpack (``protocol.checks.encoded_size``):
        the registry bounds a use case's largest report by it and ``daily_limit``."""
        ...


@runtime_checkable
class HistogramMechanism(Mechanism, Protocol):
    """A histogram over fixed buckets (dBitFlip): its buckets are a fact of the parameters."""

    @property
    def bucket_edges(self) -> tuple[float, ...]:
        """The ``count + 1`` bucket edges."""
        ...

    def bucket_of(self, value: float) -> int:
        """The bucket a recorded value falls in."""
        ...


@runtime_checkable
class FrequencyMechanism(Mechanism, Protocol):
    """Frequencies of strings: over a dictionary (CMS, HCMS) or a fixed set of categories."""

    @property
    def fixed_categories(self) -> tuple[str, ...] | None:
        """The fixed categories (kind ``CATEGORIES``), or ``None``: a dictionary is queried."""
        ...


@runtime_checkable
class DiscoveryMechanism(Mechanism, Protocol):
    """Strings found without a dictionary (SFP, 003 §4.3)."""

    @property
    def alphabet(self) -> str:
        """The characters discovered strings are assembled from (a device refuses others)."""
        ...

    def check_discoverable(self, value: str, /) -> str:
        """``value`` as it is privatized if it can ever be discovered; ``InputError`` naming why not.

        Privatizing takes any value :meth:`Mechanism.check_value` takes; the agent asks this
        too before it records, so that no ε is spent on a value that can never be released.
        """
        ...

    def reported_as(self, value: str) -> str:
        """How a recorded string appears among the discovered ones (truncated, unpadded)."""
        ...

    @property
    def longest(self) -> int:
        """The longest string the mechanism can report whole."""
        ...


def own(value: object, cls: type[T], what: str) -> T:
    """``value`` as the mechanism's own ``cls``; ``TypeError`` if another mechanism's object came in.

    A plain-form method takes opaque objects from the shells; handing one mechanism's batch or
    aggregate to another is a programming error, never an input error.
    """
    if not isinstance(value, cls):
        raise TypeError(f"expected a {what} ({cls.__name__}); got {type(value).__name__}")
    return value


def _not_a(mechanism: Mechanism, what: str) -> TypeError:
    return TypeError(f"mechanism {mechanism.name!r} (kind {mechanism.kind.value}) is not a {what}")


def as_histogram(mechanism: Mechanism) -> HistogramMechanism:
    """``mechanism`` as a :class:`HistogramMechanism`."""
    if mechanism.kind is EstimateKind.HISTOGRAM and isinstance(mechanism, HistogramMechanism):
        return mechanism
    raise _not_a(mechanism, "HistogramMechanism")


def as_frequencies(mechanism: Mechanism) -> FrequencyMechanism:
    """``mechanism`` as a :class:`FrequencyMechanism` (kinds ``DICTIONARY`` and ``CATEGORIES``)."""
    kinds = (EstimateKind.DICTIONARY, EstimateKind.CATEGORIES)
    if mechanism.kind in kinds and isinstance(mechanism, FrequencyMechanism):
        return mechanism
    raise _not_a(mechanism, "FrequencyMechanism")


def as_discovery(mechanism: Mechanism) -> DiscoveryMechanism:
    """``mechanism`` as a :class:`DiscoveryMechanism`."""
    if mechanism.kind is EstimateKind.DISCOVERY and isinstance(mechanism, DiscoveryMechanism):
        return mechanism
    raise _not_a(mechanism, "DiscoveryMechanism")


# --- the entries the registry builds from -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MechanismEntry:
    """How the registry builds a mechanism from a use case's TOML.

    The parameters a use case may give are the constructor's dataclass fields: those without
    a default are required, the others optional; ``seed`` is never a parameter (a field named
    ``seed`` makes the mechanism *hashed*: it gets the use case's public seed), and neither is
    ``epsilon`` when ``epsilon_parameter`` is set (the use case's ``epsilon`` is passed).

    Attributes:
        name: the registry name (``mechanism = "..."``).
        build: the frozen dataclass of the mechanism's parameters (its device half).
        epsilon_parameter: the use case's ``epsilon`` is the constructor's ``epsilon``.
        converters: parameters whose TOML form differs from the constructor's (a table
            becomes a buckets object, an array a tuple), by parameter name.
        dictionary: the collector may configure a dictionary (or candidates) for it.
    """

    name: str
    build: Callable[..., Mechanism]
    epsilon_parameter: bool
    converters: Mapping[str, Callable[[object], object]] = field(default_factory=dict)
    dictionary: bool = False

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.build):
            raise TypeError(f"mechanism {self.name!r}: build must be a frozen dataclass of its parameters")

    def _fields(self) -> tuple[dataclasses.Field[object], ...]:
        assert isinstance(self.build, type)
        return dataclasses.fields(self.build)

    @property
    def hashed(self) -> bool:
        """The mechanism takes the use case's public hash seed."""
        return any(f.name == "seed" for f in self._fields())

    @property
    def required(self) -> frozenset[str]:
        """Parameters a use case must give."""
        return frozenset(
            f.name
            for f in self._fields()
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.init
            and not self._implicit(f.name)
        )

    @property
    def optional(self) -> frozenset[str]:
        """Parameters a use case may give."""
        return frozenset(f.name for f in self._fields() if f.init and not self._implicit(f.name)) - self.required

    def _implicit(self, key: str) -> bool:
        return key == "seed" or (key == "epsilon" and self.epsilon_parameter)


class _StatelessMechanism(Protocol):
    """What :class:`NoPermanentState` and :class:`EventLevelStrings` need from the mechanism they are mixed into."""

    @property
    def name(self) -> str: ...

    @property
    def epsilon_report(self) -> float: ...

    def check_value(self, value: object, /) -> Any: ...

    def privatize(self, value: Any, state: None, rng: RandomSource, /) -> tuple[object, None]: ...

    def encode_records(self, records: Sequence[Any], /) -> Sequence[object]: ...


class _Encoding(Protocol):
    """What :class:`PlainRecords` needs from the mechanism it is mixed into."""

    @property
    def name(self) -> str: ...

    @property
    def record_type(self) -> type[Any]: ...

    def encode_records(self, records: Sequence[Any], /) -> Sequence[object]: ...


class PlainRecords:
    """The record's plain form, once for every mechanism: typed records in wire form.

    A mechanism names its record class (``record_type``) and writes ``encode_records``; the
    type check that keeps one mechanism from encoding another's records is here.
    """

    __slots__ = ()

    def encode_plain(self: _Encoding, records: Sequence[object]) -> list[object]:
        """Typed records of this mechanism in wire form (``TypeError`` for another's records)."""
        return list(self.encode_records([own(r, self.record_type, f"{self.name} record") for r in records]))


class NoPermanentState(PlainRecords):
    """The plain-form state methods of a mechanism that keeps no state on the device
    (randomized response, and through :class:`EventLevelStrings` CMS, HCMS and SFP).

    Every report is privatized at once with fresh coins (003 §3.2.1 for the sketches), so
    there is nothing to set up and the only saved state that fits is ``None``.
    """

    __slots__ = ()

    def setup_plain(self, rng: RandomSource) -> None:
        """No permanent state."""
        return

    def check_state_plain(self: _StatelessMechanism, data: object) -> None:
        """Only ``None`` (no state) fits."""
        if data is not None:
            raise StateError(f"{self.name} keeps no permanent state")

    def privatize_plain(
        self: _StatelessMechanism, value: object, state: object, rng: RandomSource
    ) -> tuple[object, None]:
        """Privatize a value at once; the record's wire form."""
        record, _ = self.privatize(self.check_value(value), None, rng)
        return self.encode_records([record])[0], None


class EventLevelStrings(NoPermanentState):
    """The plain-form half of the contract shared by event-level string mechanisms (CMS, HCMS, SFP).

    They keep no permanent state (003 §3.2.1: every event is privatized at once with fresh
    coins), so a report costs its ε, a value is the text itself, a counter total is refused,
    and the only state that fits is ``None``. Each module still states its own record type,
    its kind of estimate and its value check.
    """

    __slots__ = ()
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None

    def privacy_figures(self: _StatelessMechanism) -> dict[str, float]:
        """ε of one report (event-level: every report spends it)."""
        return {"epsilon_report": self.epsilon_report}

    def parse_value(self, text: str) -> str:
        """The text itself."""
        return text

    def counter_input(self: _StatelessMechanism, total: float) -> str:
        """Not a counter: refused."""
        raise InputError(f"{self.name} is not a counter")


class _SavedState(Protocol):
    """A device's permanent state as :class:`MemoizedState` keeps it: saved in plain form."""

    def to_plain(self) -> PlainDoc: ...


class _StateClass(Protocol):
    """A state class: restores a saved state under a mechanism, or raises ``StateError``."""

    def from_plain(self, mechanism: Any, data: object, /) -> _SavedState: ...


class _MemoizingMechanism(Protocol):
    """What :class:`MemoizedState` needs from the mechanism it is mixed into."""

    @property
    def state_type(self) -> _StateClass: ...

    def setup(self, rng: RandomSource, /) -> _SavedState: ...

    def check_value(self, value: object, /) -> Any: ...

    def privatize(self, value: Any, state: Any, rng: RandomSource, /) -> tuple[object, _SavedState]: ...

    def encode_records(self, records: Sequence[Any], /) -> Sequence[object]: ...


class MemoizedState(PlainRecords):
    """The plain-form half of the contract shared by mechanisms with permanent per-device state
    (dBitFlip, RAPPOR, 1BitMean).

    Each draws part of its randomness once per device and reuses it for every report (1BitMean:
    α and the memoized bits, 000 §3.1 steps 2-3; dBitFlip: the device's ``d`` buckets, 000
    §2.2, and with dBitFlipPM their memoized bits, 000 §3.4; RAPPOR: the cohort and the
    permanent randomized response ``B'`` per value, 004 §2), so the state is drawn once,
    saved in plain form and restored for every report: a device that lost it would draw anew,
    and averaging its reports would wear the privacy down. A mechanism names its
    state class as ``state_type`` (with ``from_plain(mechanism, data)``, ``StateError`` when
    the data is not this mechanism's, and ``to_plain()``); privacy figures, value checks and
    the record, batch and aggregate types stay in its own module.

    A saved state is one memo (1BitMean's α and memo bits, dBitFlipPM's buckets and ``f_d``),
    unless the mechanism memoizes per value, in which case it keeps those memos as a mapping
    under ``"memo"`` (RAPPOR's ``B'`` per keyed hash), one memo per entry:
    :func:`memos_in_plain` counts them without knowing the mechanism.
    """

    __slots__ = ()

    def setup_plain(self: _MemoizingMechanism, rng: RandomSource) -> PlainDoc:
        """Draw a device's permanent state, in plain form."""
        return self.setup(rng).to_plain()

    def check_state_plain(self: _MemoizingMechanism, data: object) -> None:
        """Raise ``StateError`` unless ``data`` is this mechanism's saved state."""
        self.state_type.from_plain(self, data)

    def privatize_plain(
        self: _MemoizingMechanism, value: object, state: object, rng: RandomSource
    ) -> tuple[object, object]:
        """Answer ``value`` from the saved state; the record's wire form and the state to save
        (grown where the mechanism memoizes per value, as RAPPOR does)."""
        record, saved = self.privatize(self.check_value(value), self.state_type.from_plain(self, state), rng)
        return self.encode_records([record])[0], saved.to_plain()


def memos_in_plain(state: object) -> int:
    """How many memos a saved permanent state holds: one per entry of a per-value memo table
    (a mapping under ``"memo"``, RAPPOR's ``B'`` per keyed hash, 004 §2), else one.

    Read from the plain form's layout alone (:class:`MemoizedState`), never checked against a
    mechanism's parameters: the agent counts the memos of a state drawn under parameters the
    registry has since changed, or of a use case the registry no longer has, to charge each
    memo that must be drawn anew (docs/privacy-accounting.md, "Registry changes"). A state of
    a mechanism that memoizes nothing (dBitFlip with ``memoize=False``) counts one too; its
    mechanism charges nothing for a new memo.
    """
    if state is None:
        return 0
    table = state.get("memo") if isinstance(state, Mapping) else None
    return len(table) if isinstance(table, Mapping) else 1
