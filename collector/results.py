"""What the collector tells a person, as typed values: estimates, series and status.

Every number the HTTP API, the CLI and the dashboard show is built once as one of these
values (by :mod:`collector.estimation` and :mod:`collector.status`) and turned into JSON or
text only at the edge (:func:`to_json`, :mod:`collector.rendering`). The fleet simulator
reads the API's JSON back into the same types (:func:`from_json`), and the dashboard's
script reads the JSON Schema generated from them (:func:`json_schema`): a field that is
renamed here is renamed for every reader, or a test fails.

The types are msgspec ``Struct`` s rather than dataclasses: msgspec encodes, decodes with
type checks and generates the JSON Schema from the one declaration (docs/design.md,
"Typed results", has the measurement). JSON has no NaN or infinity: a number that is not
finite is carried as ``None`` (``null``) from the moment it is built (:func:`finite`), so
that two results compare equal exactly when their JSON does.

The shapes are the API's (``/api/v1/schema`` serves their JSON Schema): an estimate's
``estimate`` is one of three forms, told apart by its ``form`` field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import msgspec

from collector.transport import BrokerStatistics, TransportStatistics

__all__ = [
    "CentralGuarantee",
    "CollectorStatus",
    "CountFigure",
    "DefinitionBrief",
    "DefinitionStatus",
    "EstimateForm",
    "EstimateResult",
    "FitFigures",
    "FrequencyEntry",
    "Health",
    "HistogramBucket",
    "HistogramEstimate",
    "IngestSnapshot",
    "Interval",
    "MaterialisedStatus",
    "PeriodTotals",
    "RegistrySource",
    "ReleaseDecision",
    "ScalarEstimate",
    "Series",
    "SeriesPoint",
    "ServiceStatus",
    "UseCaseBrief",
    "UseCaseStatus",
    "finite",
    "from_json",
    "json_schema",
    "named",
    "to_json",
]

Number = float | None
"""A finite number, or ``None`` where the value is undefined (NaN) or unbounded."""

Interval = tuple[Number, Number]
"""A confidence interval ``[low, high]``."""


def finite(x: float) -> Number:
    """``x`` as a float, or ``None`` when it is NaN or infinite."""
    value = float(x)
    return value if math.isfinite(value) else None


class _Value(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Base of the result types: frozen, compared field by field."""


# -- estimates ----------------------------------------------------------------------------------


class CountFigure(_Value, frozen=True):
    """A count with its standard error."""

    value: Number
    standard_error: Number


class ScalarEstimate(_Value, frozen=True, omit_defaults=True, tag="scalar", tag_field="form"):
    """A proportion (randomized response) or a mean (1BitMean) with its interval.

    Attributes:
        count: the number of devices whose bit is 1 (proportions only).
        range: the counter's range ``[0, m]`` (means only).
    """

    value: Number
    standard_error: Number
    ci: Interval
    count: CountFigure | None = None
    range: tuple[float, float] | None = None


class HistogramBucket(_Value, frozen=True):
    """One bucket ``[low, high)`` of a histogram: the share of devices, and the share after the
    consistency projection (non-negative, summing to 1). ``high`` is ``None`` for an open bucket."""

    low: Number
    high: Number
    value: Number
    standard_error: Number
    ci: Interval
    consistent: Number


class HistogramEstimate(_Value, frozen=True, tag="histogram", tag_field="form"):
    """Every bucket of a histogram (dBitFlip), and the number of reports."""

    buckets: tuple[HistogramBucket, ...]
    n: int


class FrequencyEntry(_Value, frozen=True, omit_defaults=True):
    """One entry of a frequency output (dictionary entry, discovered word, RAPPOR candidate or
    category): its estimated count, interval and test, and whether it is released.

    Attributes:
        value: the entry (bytes are written in hex).
        z: the test statistic against the release threshold.
        p_value: the one-sided p-value of ``count > threshold``.
        withheld_reason: why it is withheld (``None`` when released).
        interval: what ``ci`` means: for a released entry, the interval conditional on
            release (it covers the true count at the stated level among released entries;
            docs/estimation.md); for a withheld one, ``count ± z SE``.
        median_unbiased: a released entry's conditionally median-unbiased count (the
            winner's curse removed); ``count`` is the unconditional estimate.
        selection_standard_error: the spread to read with a released entry's ``count``: its
            conditional interval's width over ``2 z``; ``standard_error`` far above the
            cutoff, larger near it (``standard_error`` stays the one the test used).
        near_cutoff: a released entry whose estimate barely crossed the release cutoff (less
            than 2 SE above it): its conditional interval is no longer ``count ± z spread``,
            so it is shown by ``ci`` alone, with the words "near the cutoff"
            (docs/estimation.md, "What is shown").
    """

    value: str
    count: Number
    standard_error: Number
    ci: Interval
    z: Number
    p_value: Number
    released: bool
    withheld_reason: str | None = None
    interval: str | None = None
    median_unbiased: Number = None
    selection_standard_error: Number = None
    near_cutoff: bool = False


class FitFigures(_Value, frozen=True, omit_defaults=True):
    """How much of a period's reports the entries fitted to them explain: the goodness of fit of
    a frequency estimate that fits its entries jointly to the aggregate (RAPPOR regresses its
    Bloom bits on the candidates, 004 §4; any decoder that fits a model can carry the same
    figures). docs/estimation.md, "RAPPOR: what the candidates do not explain".

    Attributes:
        unexplained_share: the share of the period's reports the fitted entries do not explain
            (reports of values outside the list, and of listed values too rare to be fitted;
            the bits cannot tell the two apart), with ``unexplained_share_standard_error``.
        fitted: how many entries the model holds.
        dispersion: Pearson χ² per degree of freedom of the fit: 1 when what the fitted entries
            leave behaves like the mechanism's own noise, more when it does not.
        widened: how many entries' standard errors are the variance the residuals show at
            their own bits, where a one-sided test found it larger than the model's.
        standard_errors: what the entries' standard errors are, in words.
    """

    unexplained_share: Number
    unexplained_share_standard_error: Number
    fitted: int
    dispersion: Number = None
    widened: int = 0
    standard_errors: str | None = None


class ReleaseDecision(_Value, frozen=True, omit_defaults=True, tag="frequencies", tag_field="form"):
    """The release rule applied to every entry of a frequency output.

    Attributes:
        items: the released entries, largest first.
        withheld: how many entries are withheld.
        threshold: the release threshold ``T``.
        tested: how many entries entered the multiple-testing correction.
        correction: the correction (``bh``, ``storey``, ``bonferroni``, ``pfer``).
        alpha: its level (``None``: the count threshold only).
        test: the test in words.
        withheld_items: the withheld entries, when asked for.
        discovered, top_t, alphabet: set for discovered strings (SFP): the ``T`` and the
            alphabet the words were assembled with.
        selected, unexplained: set for RAPPOR candidates: how many candidates the Lasso
            selected, and the count the candidates do not explain.
        fit: set where the entries are fitted jointly (RAPPOR): the share of the reports the
            fit does not explain and what the standard errors are (:class:`FitFigures`).
        note: why there is nothing to test (no candidate dictionary).
        interval: what the released entries' ``ci`` means (``"95 % interval conditional on
            release"``).
        near_cutoff: what a released entry shown "near cutoff" means, when one is.
    """

    items: tuple[FrequencyEntry, ...]
    withheld: int
    threshold: float
    tested: int
    correction: str
    alpha: float | None
    test: str
    withheld_items: tuple[FrequencyEntry, ...] | None = None
    discovered: bool | None = None
    top_t: int | None = None
    alphabet: str | None = None
    selected: int | None = None
    unexplained: CountFigure | None = None
    note: str | None = None
    interval: str | None = None
    near_cutoff: str | None = None
    fit: FitFigures | None = None


class CentralGuarantee(_Value, frozen=True, omit_defaults=True):
    """The (ε, δ) the period's shuffled batch enjoys for whoever sees only what the collector
    keeps and releases (docs/privacy-accounting.md, "The central guarantee").

    Attributes:
        epsilon: the amplified ε (``None`` when no amplified figure is stated; ``note`` says why).
        delta: its δ.
        epsilon_local: the ε of one record on the device, the ε0 the bound starts from.
        n: the reports it is computed for (the period's reports, rounded down to two
            significant figures).
        bound: the published bound it comes from.
        unit: what one changed input is: one record of the period.
        note: what the figure does not cover.
    """

    epsilon: Number
    delta: float
    epsilon_local: float
    n: int
    bound: str
    unit: str
    note: str | None = None


EstimateForm = ScalarEstimate | HistogramEstimate | ReleaseDecision
"""What an estimate holds, by the mechanism's kind."""


class EstimateResult(_Value, frozen=True):
    """The estimate of one definition for one period, with the release rules applied.

    ``estimate`` is ``None`` and ``withheld_reason`` says why when nothing is released (fewer
    than ``min_reports`` reports, no dictionary configured). ``epsilon`` is the declared ε of
    the use case, ``epsilon_report`` the ε charged per record, and ``central`` the (ε, δ) of
    the period's shuffled batch (``None`` for a period without reports).
    """

    use_case: str
    definition: str
    description: str
    mechanism: str
    kind: str
    period: int
    period_length: str
    period_start: str
    period_end: str
    reports: int
    records: int
    min_reports: int
    release_threshold: float
    confidence: float
    epsilon: float
    epsilon_report: float
    released: bool
    withheld_reason: str | None
    estimate: EstimateForm | None
    central: CentralGuarantee | None = None


# -- series -------------------------------------------------------------------------------------


class SeriesPoint(_Value, frozen=True, omit_defaults=True):
    """One period of a series: its report counts, and for proportions and means the estimate."""

    period: int
    period_start: str
    period_end: str
    reports: int
    records: int
    released: bool
    value: Number = None
    standard_error: Number = None
    ci: Interval | None = None


class Series(_Value, frozen=True):
    """Per-period points of one definition, oldest first."""

    use_case: str
    definition: str
    mechanism: str
    kind: str
    confidence: float
    points: tuple[SeriesPoint, ...]


# -- status -------------------------------------------------------------------------------------


class PeriodTotals(_Value, frozen=True):
    """A period of a definition with data: its start and its report and record counts."""

    period: int
    period_start: str
    reports: int
    records: int


class _DefinitionFields(_Value, frozen=True):
    """What a definition is, where it comes from, whether it is current or retired, and who answers
    for it until when (its registry's metadata, protocol/metadata.py).

    Attributes:
        owner: who answers for the use case (``None``: its registry names nobody).
        expires: the day it stops collecting, ISO 8601 (``None``: no end date).
        expired: the end date has passed: agents record nothing more; the data is kept.
        data_review: the review that approved the collection (a URL), if given.
        notification_emails: who is told about it.
    """

    definition: str
    hash: str
    current: bool
    registries: tuple[str, ...]
    retired_from: str | None
    mechanism: str
    kind: str
    description: str
    epsilon: float
    epsilon_report: float
    period: str
    daily_limit: int
    lifetime_epsilon: float | None
    min_reports: int
    release_threshold: float
    owner: str | None
    expires: str | None
    expired: bool
    data_review: str | None
    notification_emails: tuple[str, ...]


class DefinitionStatus(_DefinitionFields, frozen=True):
    """One accepted definition of a use case, with its periods with data."""

    periods: tuple[PeriodTotals, ...]


class UseCaseStatus(DefinitionStatus, frozen=True):
    """A use case: the fields of its current definition (its newest one when the current
    registry no longer has it) and every accepted definition, current first."""

    in_current_registry: bool
    definitions: tuple[DefinitionStatus, ...]


class DefinitionBrief(_DefinitionFields, frozen=True):
    """A definition in a list: its fields, with its number of periods."""

    periods: int


class UseCaseBrief(DefinitionBrief, frozen=True):
    """A use case in a list (``/api/v1/use-cases``): its current definition's fields, its name,
    and each of its definitions briefly."""

    in_current_registry: bool
    name: str
    definitions: tuple[DefinitionBrief, ...]

    @classmethod
    def of(cls, name: str, status: UseCaseStatus) -> UseCaseBrief:
        """The brief of one use case's status."""
        fields = _brief_fields(status)
        fields.update(
            in_current_registry=status.in_current_registry,
            name=name,
            definitions=tuple(msgspec.convert(_brief_fields(d), DefinitionBrief) for d in status.definitions),
        )
        return msgspec.convert(fields, cls)


def _brief_fields(status: DefinitionStatus) -> dict[str, object]:
    # The definition's own fields, its periods counted (converted, and so checked, by msgspec).
    fields: dict[str, object] = {name: getattr(status, name) for name in _DefinitionFields.__struct_fields__}
    fields["periods"] = len(status.periods)
    return fields


class RegistrySource(_Value, frozen=True):
    """A registry file the collector accepts, with its whole-registry hash."""

    source: str
    hash: str


class CollectorStatus(_Value, frozen=True):
    """Every use case with its definitions and their periods, and the store's lifetime counters
    (of all the collectors sharing the store, and of each one under ``instances``)."""

    registry_hash: str
    registries: tuple[RegistrySource, ...]
    store: str
    use_cases: dict[str, UseCaseStatus]
    counters: dict[str, int]
    instances: dict[str, dict[str, int]]


class MaterialisedStatus(_Value, frozen=True):
    """The running service's materialised aggregates (``collector.live``)."""

    resident: int
    bytes: int
    bound: int
    loads: int
    catch_ups: int
    evictions: int
    estimates: int
    reused: int
    checks: int = 0
    """Checks of the store after a read (``collector.live``), passed."""


class IngestSnapshot(_Value, frozen=True):
    """The ingest counters of a running collector (``collector.metrics``)."""

    messages: int
    rejected: dict[str, int]
    duplicates: int
    reports: int
    records: int
    commits: int
    commit_seconds: float
    checkpoint_age_seconds: float | None
    aggregation_lag_seconds: float
    buffer_fill: float
    compactions: int
    pruned: int
    store_available: bool
    store_error: str | None
    store_failures: dict[str, int]
    receipt_requests_invalid: int
    uptime_seconds: float


class ServiceStatus(CollectorStatus, frozen=True, omit_defaults=True):
    """:class:`CollectorStatus` as a running service answers it: with its instance name, its
    materialised aggregates, and (when it ingests) its ingest counters and transport.

    ``brokers`` is what ``ldp-collector status`` adds when the service answers on its HTTP
    address: each broker connection, as ``/healthz`` lists them (the API's own answer has
    them under ``transport.brokers``)."""

    instance: str = ""
    materialised: MaterialisedStatus | None = None
    live: IngestSnapshot | None = None
    transport: TransportStatistics | None = None
    brokers: tuple[BrokerStatistics, ...] | None = None

    @classmethod
    def of(
        cls,
        status: CollectorStatus,
        *,
        instance: str,
        materialised: MaterialisedStatus | None = None,
        live: IngestSnapshot | None = None,
        transport: TransportStatistics | None = None,
        brokers: tuple[BrokerStatistics, ...] | None = None,
    ) -> ServiceStatus:
        """``status`` with what a running service adds."""
        return cls(
            **msgspec.structs.asdict(status),
            instance=instance,
            materialised=materialised,
            live=live,
            transport=transport,
            brokers=brokers,
        )


class Health(_Value, frozen=True):
    """What ``/healthz`` answers: ``ok``, ``degraded`` (one of several brokers unreachable) or
    ``unhealthy`` (the store takes no commits, with its ``cause`` and ``detail``).

    A read-only API (no running service) answers ``status`` and ``instance`` alone: the other
    fields are then left out, not ``null``, as ``checkpoint_age_seconds`` is before the first
    commit.
    """

    status: str
    instance: str
    connected: bool | msgspec.UnsetType = msgspec.UNSET
    checkpoint_age_seconds: float | msgspec.UnsetType | None = msgspec.UNSET
    brokers: tuple[BrokerStatistics, ...] | msgspec.UnsetType = msgspec.UNSET
    cause: str | msgspec.UnsetType = msgspec.UNSET
    detail: str | msgspec.UnsetType = msgspec.UNSET


# -- the edge -----------------------------------------------------------------------------------

_ENCODER: Final = msgspec.json.Encoder(order="sorted")

ResultT = TypeVar("ResultT")


def to_json(value: object, *, indent: int = 0) -> bytes:
    """``value`` (a result, or plain data holding results) as JSON with sorted keys."""
    data = _ENCODER.encode(value)
    return msgspec.json.format(data, indent=indent) if indent else data


def named(name: str, value: msgspec.Struct) -> dict[str, object]:
    """``value``'s fields with ``name`` added (one use case or definition of the API)."""
    return {"name": name} | msgspec.structs.asdict(value)


def from_json(data: bytes | str, kind: type[ResultT]) -> ResultT:
    """JSON read back into a result type; ``msgspec.ValidationError`` when it does not fit."""
    return msgspec.json.decode(data, type=kind)


SCHEMA_TYPES: Final[Mapping[str, Any]] = {
    "estimate": EstimateResult,
    "series": Series,
    "status": ServiceStatus,
}
"""The responses the dashboard reads, by name."""


def json_schema() -> dict[str, object]:
    """The JSON Schema of every response the dashboard reads (``SCHEMA_TYPES``), with shared
    definitions under ``$defs``."""
    names = list(SCHEMA_TYPES)
    refs, defs = msgspec.json.schema_components([SCHEMA_TYPES[n] for n in names])
    return {"responses": dict(zip(names, refs, strict=True)), "$defs": defs}
