"""What ingest, the live view, the CLI, HTTP and maintenance use of a checkpoint store.

:class:`Store` is the one contract; :class:`collector.store.sqlite.CheckpointStore` (one
SQLite file, the embedded default) and :class:`collector.store.postgres.PostgresStore` (a
PostgreSQL database shared by a group of collectors) both fulfil it, and
:func:`collector.store.open_store` picks one from ``[store]`` of the config. The values
that cross the seam (:class:`CommitResult`, :class:`KeyInfo`) and the rules both backends
apply alike (:func:`report_allowance`, :func:`use_case_fingerprint`,
:func:`legacy_fingerprint`) live here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol.catalog import Catalog
from protocol.registry import UseCase
from protocol.server.contract import Aggregate, Batch

__all__ = [
    "MIGRATE_COMMAND",
    "CommitResult",
    "FoldedReport",
    "KeyInfo",
    "Store",
    "legacy_fingerprint",
    "report_allowance",
    "use_case_fingerprint",
]


MIGRATE_COMMAND = "ldp-collector migrate"
"""What an operator runs to migrate a store that a read-only command refuses as older."""


def report_allowance(use_case: UseCase) -> int:
    """Reports one device may contribute to one (use case, period): 1.

    An agent closes each period of a use case once and stages one report for it, carrying at
    most ``daily_limit`` records (the decoder refuses more), whatever the period's length; a
    retry resends the same bytes and report id, which the report-id table absorbs before the
    allowance is consulted. So one report per period is what an honest device sends, and a
    device that sends more gains nothing (RAPPOR §6: bound each client's contribution).
    """
    del use_case  # the same for every mechanism and period length; kept for a per-use-case rule
    return 1


def use_case_fingerprint(use_case: UseCase) -> bytes:
    """What a use case's row is keyed by next to its name (schema 3 on SQLite, 2 on
    PostgreSQL): its definition hash, so each definition's reports fold into aggregates of
    their own, the definition they were made with."""
    return use_case.definition


def legacy_fingerprint(use_case: UseCase) -> bytes:
    """What the previous release keyed a use case's row by: the mechanism's fingerprint and the
    period. Opening an older store for writing re-keys such a row to the definition hash of
    the first definition (the current registry's first) that maps to it."""
    return hashlib.sha256(use_case.fingerprint + use_case.period.value.encode()).digest()[:16]


class FoldedReport(Protocol):
    """What the store needs of a decoded report (``protocol.wire.DecodedReport`` has it)."""

    @property
    def use_case(self) -> UseCase:
        """The report's use case."""
        ...

    @property
    def period(self) -> int:
        """The slot index."""
        ...

    @property
    def report_id(self) -> bytes:
        """The 16-byte report id."""
        ...

    @property
    def batch(self) -> Batch:
        """The records, columnar."""
        ...


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What one commit folded.

    Attributes:
        reports: reports folded (new report ids).
        records: records in those reports.
        duplicates: reports refused because their id was already committed.
        expired: reports refused because their period is below the stored low-water mark
            (another collector sharing the database may have moved it).
        seconds: time the transaction took.
        keys: the (use case, period) keys the commit added to.
        over_allowance: reports refused because their device had used its allowance.
        expired_ids: the report ids refused as expired (their receipts say so).
        over_allowance_ids: the report ids refused as over the allowance (their receipts say
            so; every other report of the commit is counted, fresh or duplicate).
    """

    reports: int
    records: int
    duplicates: int
    expired: int
    seconds: float
    keys: tuple[tuple[str, int], ...] = ()
    over_allowance: int = 0
    expired_ids: frozenset[bytes] = frozenset()
    over_allowance_ids: frozenset[bytes] = frozenset()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """Totals of one (use case, period) aggregate."""

    use_case: str
    period: int
    reports: int
    records: int


class Store(Protocol):
    """A checkpoint store: aggregates, the report ids folded into them, counters.

    Not thread-safe: each user drives its store object from one thread (the service's
    ``StoreThread``, the live view's aggregates thread). Every method that writes raises
    :class:`~collector.errors.StoreUnavailable` for a failure that can pass (the caller
    retries; nothing of the failed transaction is stored) and
    :class:`~collector.errors.StoreError` for one that cannot.

    Attributes:
        catalog: the use-case definitions accepted; aggregates, totals and low-water marks
            are keyed by each definition's ref (``name@hex``).
        instance: this collector's name (its counters are kept under it).
        readonly: opened for reading only.
        location: where the store is, for messages (a file path or a URL without password).
    """

    catalog: Catalog
    instance: str
    readonly: bool

    @property
    def location(self) -> str:
        """Where the store is, for messages and the status document."""
        ...

    def commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None = None
    ) -> CommitResult:
        """Fold ``reports`` (already shuffled) and add ``counters``, in one transaction.

        Reports whose id is already stored (or repeated within ``reports``) are counted in
        ``duplicates``; reports beyond their sender's :func:`report_allowance` (``senders``
        parallel to ``reports``, empty bytes for none) in ``over_allowance``; reports below the
        low-water mark in ``expired``.
        """
        ...

    def aggregate(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo]:
        """The aggregate of one (use case, period) and its totals."""
        ...

    def aggregate_at(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """:meth:`aggregate`, with the sequence number it is current to (for :meth:`catch_up`)."""
        ...

    def catch_up(self, aggregate: Aggregate, info: KeyInfo, seq: int) -> tuple[Aggregate, KeyInfo, int] | None:
        """Fold into ``aggregate`` (current to ``seq``) what was committed since; None: read afresh."""
        ...

    def last_seq(self) -> int:
        """The sequence number of the latest committed segment (0 before the first)."""
        ...

    def totals(self, use_case: str | None = None) -> list[KeyInfo]:
        """Every (use case, period) with data, with its totals, oldest first."""
        ...

    def counters(self, instance: str | None = None) -> dict[str, int]:
        """Persisted ingest counters (of one instance, or summed over all)."""
        ...

    def instances(self) -> list[str]:
        """Names of the collectors that have committed to this store."""
        ...

    def data_version(self) -> tuple[int, int]:
        """A pair that changes whenever committed data changes."""
        ...

    def seen_count(self) -> int:
        """Report ids currently remembered."""
        ...

    def low_water(self) -> dict[str, int]:
        """The lowest period still accepted, per use case (0 if never set)."""
        ...

    def prune(self, low_water: Mapping[str, int]) -> int:
        """Raise low-water marks (never lower them) and forget what lies below; ids forgotten."""
        ...

    def compaction_candidates(self, compact_after: int) -> list[tuple[str, int]]:
        """Keys whose segments should be folded into their base now."""
        ...

    def compact(self, use_case: str, period: int) -> int:
        """Fold the key's segments into its base, in one transaction; segments folded."""
        ...

    def use_case_names(self) -> Iterable[str]:
        """Refs of the accepted definitions that have a row in this store."""
        ...

    def verify(self) -> None:
        """Check every checksum; raise StoreError naming the table and row at fault."""
        ...

    def check(self, *, report_ids: bool = True) -> None:
        """Check the store as it is now, as its open did; raise StoreDamaged naming what is
        wrong (``report_ids=False``: leave out the remembered report ids, which reads never use)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
