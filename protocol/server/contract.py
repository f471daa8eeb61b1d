"""The server half's contract: decode, fold, estimate; and the base that holds its plumbing once.

What the collector's store, its estimation and the planner, the fleet simulator and the
benchmarks ask of a mechanism's server half (:class:`ServerMechanism`): strictly decode the
records' wire form into a columnar batch, make, restore, fold and merge aggregates, plan
(the standard error at ``n`` reports from the paper's formula), and the estimate its kind
gives, through one small protocol per kind (:class:`MeanServer`, :class:`HistogramServer`,
:class:`FrequencyServer`, :class:`CandidateServer`, :class:`DiscoveryServer`), narrowed by
:func:`mean_server` and its siblings so mypy sees the types through the seam.

:class:`PlainServer` is the generic base every server half derives from: given its batch and
aggregate classes it provides the plain-form plumbing (an empty batch, restoring a saved
aggregate, folding a batch into an aggregate) with the type checks of :func:`own`, so that no
mechanism module writes them again.

:func:`server_of` gives the server half of a mechanism (the device half's ``server``
attribute names it, as an import path that is resolved only when a server asks for it, so a
device never imports this package).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from protocol.interfaces import EstimateKind, Mechanism, own
from protocol.server.estimate import BitEstimates, Estimate, VectorEstimate
from protocol.server.parallel import Threads

__all__ = [
    "Aggregate",
    "Batch",
    "BatchPrivatizer",
    "CandidateServer",
    "DiscoveredItem",
    "DiscoveryServer",
    "FrequencyServer",
    "HistogramServer",
    "MeanServer",
    "PlainServer",
    "PlanFigures",
    "ServerMechanism",
    "candidate_server",
    "discovery_server",
    "frequency_server",
    "histogram_server",
    "mean_server",
    "server_of",
]

MechanismT = TypeVar("MechanismT", bound=Mechanism)


@dataclass(frozen=True, kw_only=True)
class PlanFigures:
    """What the planner prints for a mechanism at ``n`` reports, from closed forms only.

    Attributes:
        n: the number of reports.
        standard_error: the standard error of the headline estimate (``unit`` says of what).
        unit: what the standard error is of (``"proportion"``, ``"mean"``, ``"bucket share"``,
            ``"count"``).
        figures: further named figures (ε, bandwidth, bounds).
        formulas: the formulas used, each naming the paper and theorem.
    """

    n: float
    standard_error: float
    unit: str
    figures: Mapping[str, float] = field(default_factory=dict)
    formulas: tuple[str, ...] = ()


class Batch(Protocol):
    """Records in a mechanism's columnar form (a frozen dataclass of numpy arrays)."""

    def __len__(self) -> int:
        """The number of records."""
        ...


class Aggregate(Protocol):
    """A mergeable server-side aggregate of one mechanism's records (folded via the server half)."""

    @property
    def n(self) -> int:
        """Number of records folded in."""
        ...

    def merge(self, other: Self) -> Self:
        """A new aggregate equal to folding both inputs' records."""
        ...

    def to_plain(self) -> object:
        """Plain, msgpack-ready data (restored by :meth:`ServerMechanism.restore_aggregate`)."""
        ...


@runtime_checkable
class ServerMechanism(Protocol):
    """What every mechanism's server half answers."""

    @property
    def mechanism(self) -> Mechanism:
        """The parameters (and device half) this server half inverts."""
        ...

    @property
    def kind(self) -> EstimateKind:
        """What is estimated from the aggregate (and which kind protocol the half meets)."""
        ...

    def decode_records(self, raw: object) -> Batch:
        """Strictly decode the records' wire form; ``MalformedReportError`` on anything malformed."""
        ...

    def empty_batch(self) -> Batch:
        """A batch of no records (the template stored batches are rebuilt from)."""
        ...

    def new_aggregate(self) -> Aggregate:
        """An empty aggregate."""
        ...

    def restore_aggregate(self, data: object) -> Aggregate:
        """An aggregate saved with ``to_plain``; ``StateError`` if it does not fit."""
        ...

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch of records into an aggregate of this mechanism, in place."""
        ...

    def plan(self, n: float) -> PlanFigures:
        """The planner's figures at ``n`` reports, from the paper's variance formula."""
        ...


@runtime_checkable
class MeanServer(ServerMechanism, Protocol):
    """A proportion (randomized response) or a mean (1BitMean)."""

    def estimate_mean(self, aggregate: Aggregate) -> Estimate:
        """The proportion or mean with its standard error."""
        ...

    def estimate_count(self, aggregate: Aggregate) -> Estimate | None:
        """The number of devices whose bit is 1, for proportions (``None`` for means)."""
        ...


@runtime_checkable
class HistogramServer(ServerMechanism, Protocol):
    """A histogram over fixed buckets (dBitFlip)."""

    def estimate_histogram(self, aggregate: Aggregate) -> VectorEstimate:
        """The share of devices per bucket with standard errors."""
        ...


@runtime_checkable
class FrequencyServer(ServerMechanism, Protocol):
    """Frequencies of strings: over a dictionary (CMS, HCMS) or a fixed set of categories."""

    def estimate_frequencies(
        self, aggregate: Aggregate, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """The estimated count of each candidate (each category, in order, for ``CATEGORIES``);
        a half whose query splits into parts (the sketches' gather) hands them to the caller's
        ``threads``, the others need none."""
        ...


@runtime_checkable
class CandidateServer(ServerMechanism, Protocol):
    """Frequencies over candidate strings decoded jointly (RAPPOR, 004 §4: the collector's
    decoder regresses the per-cohort bit estimates on the candidates' design matrix)."""

    def candidate_bits(self, candidates: Sequence[str | bytes]) -> object:
        """The candidates' design matrix (see the mechanism module)."""
        ...

    def candidate_positions(self, candidates: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        """The design matrix in sparse form: ``(len, cohorts, h)`` bit numbers per candidate."""
        ...

    @property
    def bit_probabilities(self) -> tuple[float, float]:
        """``(q*, p*)``: the chance that a reported bit is set where a value's bit is, and where
        it is not (the variance model of the regression)."""
        ...

    def estimate_bits(self, aggregate: Aggregate) -> BitEstimates:
        """The per-cohort bit estimates the candidates are regressed on (``TypeError`` for
        another mechanism's aggregate)."""
        ...


class DiscoveredItem(Protocol):
    """One string found by a discovery mechanism."""

    @property
    def word(self) -> str:
        """The string found (padding removed)."""
        ...

    @property
    def count(self) -> float:
        """Its estimated count."""
        ...

    @property
    def standard_error(self) -> float:
        """The count's standard error."""
        ...


@runtime_checkable
class DiscoveryServer(ServerMechanism, Protocol):
    """Strings found without a dictionary (SFP, 003 §4.3)."""

    def discover(
        self, aggregate: Aggregate, *, alphabet: str, top_t: int, threshold: float, threads: Threads | None = None
    ) -> Sequence[DiscoveredItem]:
        """The strings found, each with its count and standard error (the queries split between
        the caller's ``threads``, if any)."""
        ...


@runtime_checkable
class BatchPrivatizer(Protocol):
    """A server half that privatizes many values of an event mechanism at once, each with the
    device's coins in the device's layout, in wire form (the fleet's scale mode and the
    benchmarks use it; the frequency oracles at the local-privacy limit have it)."""

    def privatize_records(self, values: Sequence[str], rng: Any) -> list[object]:
        """One record per value, in the mechanism's wire form."""
        ...


def _checked(server: ServerMechanism, kinds: tuple[EstimateKind, ...], protocol: type) -> ServerMechanism:
    """``server`` if its kind is one of ``kinds`` and it has ``protocol``'s methods; a
    ``TypeError`` naming the mechanism otherwise."""
    # ``protocol`` is a plain ``type``: mypy accepts no protocol class where ``type[T]`` is
    # expected, so each caller casts to the protocol it has just checked.
    if server.kind in kinds and isinstance(server, protocol):
        return server
    raise TypeError(f"mechanism {server.mechanism.name!r} (kind {server.kind.value}) has no {protocol.__name__}")


def mean_server(server: ServerMechanism) -> MeanServer:
    """``server`` as a :class:`MeanServer` (kinds ``PROPORTION`` and ``MEAN``)."""
    return cast(MeanServer, _checked(server, (EstimateKind.PROPORTION, EstimateKind.MEAN), MeanServer))


def histogram_server(server: ServerMechanism) -> HistogramServer:
    """``server`` as a :class:`HistogramServer`."""
    return cast(HistogramServer, _checked(server, (EstimateKind.HISTOGRAM,), HistogramServer))


def frequency_server(server: ServerMechanism) -> FrequencyServer:
    """``server`` as a :class:`FrequencyServer` (kinds ``DICTIONARY`` and ``CATEGORIES``)."""
    return cast(FrequencyServer, _checked(server, (EstimateKind.DICTIONARY, EstimateKind.CATEGORIES), FrequencyServer))


def candidate_server(server: ServerMechanism) -> CandidateServer:
    """``server`` as a :class:`CandidateServer`."""
    return cast(CandidateServer, _checked(server, (EstimateKind.CANDIDATES,), CandidateServer))


def discovery_server(server: ServerMechanism) -> DiscoveryServer:
    """``server`` as a :class:`DiscoveryServer`."""
    return cast(DiscoveryServer, _checked(server, (EstimateKind.DISCOVERY,), DiscoveryServer))


# --- the generic base --------------------------------------------------------------------------


class _Folds(Protocol):
    """What :class:`PlainServer` needs of an aggregate class's instances."""

    def add(self, batch: Any, /) -> None: ...


BatchT = TypeVar("BatchT")
AggT = TypeVar("AggT", bound=_Folds)


class PlainServer(Generic[MechanismT, BatchT, AggT]):
    """The server half's plain-form plumbing, once for every mechanism.

    A subclass names its batch and aggregate classes (``batch_type``, ``aggregate_type``; the
    aggregate class is built as ``aggregate_type(mechanism)`` and restored by
    ``aggregate_type.from_plain(mechanism, data)``) and implements :meth:`decode_records`; the
    empty batch, restoring, folding (with :func:`own`'s type checks, so one mechanism's
    aggregate never folds another's batch) and ``kind`` come from here.

    Args:
        mechanism: the parameters (and device half) this server half inverts.
    """

    batch_type: ClassVar[type[Any]]
    aggregate_type: ClassVar[type[Any]]

    def __init__(self, mechanism: MechanismT) -> None:
        self.mechanism = mechanism

    @property
    def kind(self) -> EstimateKind:
        """The mechanism's kind of estimate."""
        return self.mechanism.kind

    def decode_records(self, raw: object) -> BatchT:
        """Strictly decode the records' wire form (each mechanism's own)."""
        raise NotImplementedError

    def empty_batch(self) -> BatchT:
        """No records: the wire form of none, decoded."""
        return self.decode_records([])

    def new_aggregate(self) -> AggT:
        """An empty aggregate."""
        aggregate: AggT = self.aggregate_type(self.mechanism)
        return aggregate

    def restore_aggregate(self, data: object) -> AggT:
        """An aggregate saved with ``to_plain``; ``StateError`` if it does not fit."""
        aggregate: AggT = self.aggregate_type.from_plain(self.mechanism, data)
        return aggregate

    def own_aggregate(self, aggregate: object) -> AggT:
        """``aggregate`` as this mechanism's own (``TypeError`` for another's)."""
        mine: AggT = own(aggregate, self.aggregate_type, f"{self.mechanism.name} aggregate")
        return mine

    def fold(self, aggregate: object, batch: object) -> None:
        """Fold a batch into an aggregate of this mechanism, in place."""
        self.own_aggregate(aggregate).add(own(batch, self.batch_type, f"{self.mechanism.name} batch"))


def server_of(mechanism: Mechanism) -> ServerMechanism:
    """The server half of ``mechanism``: the class its ``server`` attribute names (an import
    path ``"module:Class"``, resolved now, or the class itself), built on the mechanism.

    Raises:
        TypeError: the mechanism names no server half, or the name does not resolve to one.
    """
    named: object = getattr(type(mechanism), "server", None)
    if isinstance(named, str):
        module, _, attribute = named.partition(":")
        named = getattr(importlib.import_module(module), attribute)
    if not callable(named):
        raise TypeError(f"mechanism {mechanism.name!r} names no server half")
    server = named(mechanism)
    if not isinstance(server, ServerMechanism):
        raise TypeError(f"the server half of {mechanism.name!r} does not meet protocol.server.contract")
    return server
