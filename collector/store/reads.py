"""What both store backends do alike around reading: kept once, beside the SQL that differs.

:class:`SegmentReads` is the base of :class:`~collector.store.sqlite.CheckpointStore` and
:class:`~collector.store.postgres.PostgresStore`. Each backend reads its base aggregates and
segments with its own SQL and snapshot; this class holds what is the same around that: how a
definition the catalog holds but no collector has stored yet reads (empty), how an unknown one
fails (``KeyError``), how a sealed blob is opened, a base restored and segments folded, how
per-key totals from the base and the segments add up, which keys are worth compacting and
what a compaction writes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final

from collector.errors import StoreError
from collector.store.interface import KeyInfo
from collector.store.row_format import BIG_SEGMENTS, UseCaseRow, fold_segment, pack, seal, unseal
from collector.store.use_case_rows import Executes
from protocol.catalog import Catalog
from protocol.errors import StateError
from protocol.server.contract import Aggregate

__all__ = ["SegmentReads"]

_WRITE_BASE: Final = (
    "INSERT INTO aggregates (uc, period, reports, records, data) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (uc, period) DO UPDATE SET reports = excluded.reports, records = excluded.records, "
    "data = excluded.data"
)
"""Compaction's write of a key's base, with ``?`` for the backend's :attr:`SegmentReads.mark`."""


class SegmentReads(ABC):
    """The backends' shared reading logic; subclasses set ``catalog``, ``_use_cases`` and their
    SQL's parameter ``mark``."""

    catalog: Catalog
    _use_cases: dict[str, UseCaseRow]
    mark: ClassVar[str]
    """The backend's SQL parameter marker (``?`` SQLite, ``%s`` PostgreSQL)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """The database, for messages."""

    @abstractmethod
    def last_seq(self) -> int:
        """The version of the latest segment committed (0 before the first)."""

    @abstractmethod
    def _read_at(self, row: UseCaseRow, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """:meth:`aggregate_at` of a use case with a stored row: one snapshot of base and segments."""

    @abstractmethod
    def _catch_up_from(
        self, row: UseCaseRow, aggregate: Aggregate, info: KeyInfo, seq: int
    ) -> tuple[Aggregate, KeyInfo, int] | None:
        """:meth:`catch_up` of a use case with a stored row."""

    @abstractmethod
    def _damaged(self, what: str) -> StoreError:
        """The error that stops the collector: the database is damaged (``what`` says how)."""

    @abstractmethod
    def _unrestorable(self, row: UseCaseRow, exc: StateError) -> StoreError:
        """The error for a stored base aggregate its mechanism cannot restore."""

    def aggregate(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo]:
        """The aggregate of one (use case, period): its base with every segment folded in.

        Raises:
            KeyError: no accepted definition has this ref.
        """
        agg, info, _seq = self.aggregate_at(use_case, period)
        return agg, info

    def _stored_row(self, use_case: str) -> UseCaseRow | None:
        """The use case's stored row; None for an accepted definition nothing was stored for yet.

        Raises:
            KeyError: no accepted definition has this ref.
        """
        row = self._use_cases.get(use_case)
        if row is None and use_case not in self.catalog.use_cases:
            raise KeyError(use_case)
        return row

    def aggregate_at(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """:meth:`aggregate`, with the version it is current to (for :meth:`catch_up`): the
        segments' sequence number in SQLite, the commit-ordered version in PostgreSQL.

        A definition nothing was stored for yet reads as empty, current now.

        Raises:
            KeyError: no accepted definition has this ref.
        """
        row = self._stored_row(use_case)
        if row is None:
            empty = self.catalog.use_cases[use_case].server.new_aggregate()
            return empty, KeyInfo(use_case, period, 0, 0), self.last_seq()
        return self._read_at(row, use_case, period)

    def catch_up(self, aggregate: Aggregate, info: KeyInfo, seq: int) -> tuple[Aggregate, KeyInfo, int] | None:
        """Fold into ``aggregate`` (current to ``seq``) the segments committed since, by any
        collector sharing the database.

        Only the new segments are read, so keeping an aggregate current costs what was added,
        not the whole key. ``aggregate`` may be changed in place; the caller keeps the returned
        one.

        Returns:
            The aggregate, its totals and the new version; None when a compaction has folded
            segments after ``seq`` into the base, so the key must be read afresh with
            :meth:`aggregate_at` (rare: a compaction rewrites the base at most about once per
            quarter of its size).

        Raises:
            KeyError: no accepted definition has this ref.
        """
        row = self._stored_row(info.use_case)
        if row is None:
            return (aggregate, info, self.last_seq()) if info.reports == 0 else None
        return self._catch_up_from(row, aggregate, info, seq)

    def _open(self, table: str, key: tuple[object, ...], data: object) -> Any:
        """The unpacked payload of a sealed row (see :func:`~collector.store.row_format.seal`), checked."""
        return unseal(table, key, data, self._damaged)

    def _restored_base(self, row: UseCaseRow, period: int, base: Sequence[Any] | None) -> tuple[Aggregate, int, int]:
        """The key's base aggregate from its stored ``(reports, records, data)`` (None: empty and zeros).

        Raises:
            StoreError: the stored base cannot be restored (the database is damaged).
        """
        if base is None:
            return row.use_case.server.new_aggregate(), 0, 0
        plain = self._open("aggregates", (row.id, period, "", base[0], base[1]), base[2])
        try:
            agg = row.use_case.server.restore_aggregate(plain)
        except StateError as exc:
            raise self._unrestorable(row, exc) from exc
        return agg, int(base[0]), int(base[1])

    def _write_compacted(
        self,
        db: Executes,
        row: UseCaseRow,
        period: int,
        start: tuple[Aggregate, int, int],
        segments: Iterable[Sequence[Any]],
    ) -> None:
        """Write what compaction makes the key's base: ``start`` with ``segments`` folded in,
        sealed, with its report and record totals (the caller deletes the segments folded, in
        the same transaction)."""
        agg, reports, records = self._fold_segments(row, period, start, segments)
        sealed = seal("aggregates", (row.id, period, "", reports, records), pack(agg.to_plain()))
        db.execute(_WRITE_BASE.replace("?", self.mark), (row.id, period, reports, records, sealed))

    def _fold_segments(
        self,
        row: UseCaseRow,
        period: int,
        start: tuple[Aggregate, int, int],
        segments: Iterable[Sequence[Any]],
    ) -> tuple[Aggregate, int, int]:
        """Fold stored segments ``(kind, reports, records, data)`` into ``start = (aggregate, reports, records)``.

        Each segment's blob is checked against its key and totals before it is folded.
        """
        agg, reports, records = start
        for kind, seg_reports, seg_records, blob in segments:
            data = self._open("segments", (row.id, period, kind, seg_reports, seg_records), blob)
            agg = fold_segment(row, agg, kind, data, self.location)
            reports += int(seg_reports)
            records += int(seg_records)
        return agg, reports, records

    @staticmethod
    def _add_totals(rows: Iterable[tuple[Any, ...]], names: dict[int, str]) -> list[KeyInfo]:
        """Per-key totals from ``(uc, period, reports, records)`` rows of bases and segment sums, oldest first."""
        totals: dict[tuple[str, int], list[int]] = {}
        for uc, period, reports, records in rows:
            t = totals.setdefault((names[uc], int(period)), [0, 0])
            t[0] += int(reports)
            t[1] += int(records)
        return [KeyInfo(name, period, t[0], t[1]) for (name, period), t in sorted(totals.items())]

    def _worth_compacting(
        self, rows: Iterable[tuple[Any, ...]], compact_after: int, lows: Mapping[str, int]
    ) -> list[tuple[str, int]]:
        """The keys to fold into their base now, from ``(uc, period, segments, segment bytes,
        base bytes)`` rows: enough segments, a lot of segment data, or a period already closed."""
        names = {row.id: name for name, row in self._use_cases.items()}
        out = []
        for uc, period, count, size, base_size in rows:
            name = names.get(int(uc))
            if name is None:
                continue
            closed = int(period) < lows.get(name, 0)
            # Folding rewrites the whole base: wait until the segments are worth a quarter of it,
            # so a large sketch is rewritten at most about once per quarter of its own size.
            if (int(count) >= compact_after and int(size) * 4 >= int(base_size)) or int(size) >= BIG_SEGMENTS or closed:
                out.append((name, int(period)))
        return out
