"""The checksums both store backends keep beside the rows, and how ``verify`` checks them.

Each use case's row and each instance's counters have a checksum in ``meta`` under
``digest:use_cases:<id>`` and ``digest:counters:<instance>``; the sealed blobs of the
aggregates and segments and the tags of the report ids are in :mod:`collector.store.row_format`.
The backends read the rows with their own SQL; what a row's checksum is, and what a mismatch
is reported as, is the same in SQLite and in PostgreSQL and lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from collector.errors import StoreError
from collector.store.row_format import RID_BYTES, TAG_BYTES, digest, rid_tag

__all__ = [
    "USE_CASE_COLUMNS",
    "check_aggregates",
    "check_digests",
    "check_seen",
    "check_segments",
    "counters_digest",
    "counters_key",
    "use_case_digest",
    "use_case_key",
]

_Open = Callable[[str, tuple[object, ...], object], object]
"""Checks one sealed row: its table, its key and totals, its ``data`` (``SegmentReads._open``)."""

USE_CASE_COLUMNS = "id, name, fingerprint, mechanism, period_seconds, low_water"
"""The columns of a ``use_cases`` row its checksum covers, in order."""


def use_case_key(uc: object) -> str:
    """The ``meta`` key of a use case row's checksum."""
    return f"digest:use_cases:{uc}"


def counters_key(instance: str) -> str:
    """The ``meta`` key of an instance's counters' checksum."""
    return f"digest:counters:{instance}"


def use_case_digest(row: Sequence[Any] | None) -> bytes:
    """The checksum of a ``use_cases`` row (its :data:`USE_CASE_COLUMNS`); empty for no row."""
    return digest("use_cases", *row) if row is not None else b""


def counters_digest(instance: str, rows: Sequence[Sequence[Any]]) -> bytes:
    """The checksum of an instance's counters, ``(name, value)`` rows ordered by name."""
    return digest("counters", instance, rows)


def check_digests(
    stored: dict[str, bytes],
    use_cases: Iterable[tuple[object, bytes]],
    counters: Iterable[tuple[str, bytes]],
    damaged: Callable[[str], StoreError],
) -> None:
    """Match the checksums in ``meta`` (``stored``, by key; consumed) with the rows.

    ``use_cases`` and ``counters`` give each row's key and the checksum it has now, and are
    read one at a time, so the first row at fault is the one reported.

    Raises:
        StoreError: made by ``damaged``, naming the table and the row at fault.
    """
    for uc, now in use_cases:
        if stored.pop(use_case_key(uc), None) != now:
            raise damaged(f"table use_cases, id {uc}: the checksum does not match the row")
    for instance, now in counters:
        if stored.pop(counters_key(instance), None) != now:
            raise damaged(f"table counters, instance {instance!r}: the checksum does not match")
    if stored:
        raise damaged(f"table meta: checksums of rows that do not exist ({', '.join(sorted(stored))})")


def check_aggregates(
    rows: Iterable[Sequence[Any]], open_row: Callable[[str, tuple[object, ...], object], object]
) -> None:
    """Open every sealed base aggregate, ``(uc, period, reports, records, data)`` rows; ``open_row`` checks one."""
    for uc, period, reports, records, data in rows:
        open_row("aggregates", (uc, period, "", reports, records), data)


def check_segments(
    rows: Iterable[Sequence[Any]], open_row: Callable[[str, tuple[object, ...], object], object]
) -> None:
    """Open every sealed segment, ``(uc, period, kind, reports, records, data)`` rows; ``open_row`` checks one."""
    for uc, period, kind, reports, records, data in rows:
        open_row("segments", (uc, period, kind, reports, records), data)


def check_seen(rows: Iterable[Sequence[Any]], damaged: Callable[[str], StoreError]) -> None:
    """Check the tag of every remembered report id, ``(rid, uc, period)`` rows.

    Raises:
        StoreError: made by ``damaged``, naming the report id at fault.
    """
    width = RID_BYTES + TAG_BYTES
    for rid, uc, period in rows:
        if not isinstance(rid, bytes) or len(rid) != width or rid_tag(rid[:RID_BYTES], uc, period) != rid:
            raise damaged(f"table seen: report id {rid!r} does not match its tag")
