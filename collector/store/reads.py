"""What both store backends do alike around reading: kept once, beside the SQL that differs.

:class:`SegmentReads` is the base of :class:`~collector.store.sqlite.CheckpointStore` and
:class:`~collector.store.postgres.PostgresStore`. Each backend reads its base aggregates and
segments with its own SQL and snapshot; this class holds what is the same around that: how a
definition the catalog holds but no collector has stored yet reads (empty), how an unknown one
fails (``KeyError``), how a sealed blob is opened and segments folded, how per-key totals
from the base and the segments add up, and which keys are worth compacting.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from collector.errors import StoreError
from collector.store.codec import BIG_SEGMENTS, UseCaseRow, fold_segment, unseal
from collector.store.interface import KeyInfo
from protocol.catalog import Catalog
from protocol.server.contract import Aggregate

__all__ = ["SegmentReads"]


class SegmentReads(ABC):
    """The backends' shared reading logic; subclasses set ``catalog`` and ``_use_cases``."""

    catalog: Catalog
    _use_cases: dict[str, UseCaseRow]

    @property
    @abstractmethod
    def location(self) -> str:
        """The database, for messages."""

    @abstractmethod
    def last_seq(self) -> int:
        """The version of the latest segment committed (0 before the first)."""

    @abstractmethod
    def aggregate_at(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """The aggregate of one key with the version it is current to."""

    @abstractmethod
    def _damaged(self, what: str) -> StoreError:
        """The error that stops the collector: the database is damaged (``what`` says how)."""

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

    def _empty_at(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """What :meth:`aggregate_at` gives for a use case nothing was stored for: empty, current now."""
        empty = self.catalog.use_cases[use_case].server.new_aggregate()
        return empty, KeyInfo(use_case, period, 0, 0), self.last_seq()

    def _open(self, table: str, key: tuple[object, ...], data: object) -> Any:
        """The unpacked payload of a sealed row (see :func:`~collector.store.codec.seal`), checked."""
        return unseal(table, key, data, self._damaged)

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
