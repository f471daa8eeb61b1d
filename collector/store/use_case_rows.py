"""The ``use_cases`` table's rows, made and looked up alike by both store backends.

Each accepted definition has a row keyed by its name and its definition hash
(:func:`~collector.store.interface.use_case_fingerprint`); a row the previous release keyed by
the mechanism's fingerprint and the period (:func:`~collector.store.interface.legacy_fingerprint`)
is re-keyed to the first definition that maps to it, keeping its aggregates and report ids.
The SQL is the same for SQLite and PostgreSQL but for the parameter marker (``?`` or ``%s``),
so it is written here once with ``?`` and each backend passes its own marker; the caller holds
the transaction. A row made or re-keyed is resealed: its checksum in ``meta`` is stored anew
(:mod:`collector.store.integrity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from collector.store.integrity import USE_CASE_COLUMNS, use_case_digest, use_case_key
from collector.store.interface import legacy_fingerprint, use_case_fingerprint
from collector.store.row_format import UseCaseRow
from protocol.registry import UseCase

__all__ = ["Executes", "adopt_or_insert", "put_digest", "reseal_use_case", "row_digest", "stored_rows"]

_SELECT = "SELECT id FROM use_cases WHERE name = ? AND fingerprint = ?"
_REKEY = "UPDATE use_cases SET fingerprint = ? WHERE id = ?"
_INSERT = "INSERT INTO use_cases (name, fingerprint, mechanism, period_seconds) VALUES (?, ?, ?, ?)"
_ROW = f"SELECT {USE_CASE_COLUMNS} FROM use_cases WHERE id = ?"
_PUT_DIGEST = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


class _Fetches(Protocol):
    def fetchone(self) -> Any: ...


class Executes(Protocol):
    """A SQLite connection or a PostgreSQL cursor: runs one statement with its parameters."""

    def execute(self, query: str, params: tuple[object, ...], /) -> _Fetches: ...


def _row_id(db: Executes, mark: str, name: str, fingerprint: bytes) -> int | None:
    row = db.execute(_SELECT.replace("?", mark), (name, fingerprint)).fetchone()
    return None if row is None else int(row[0])


def row_digest(db: Executes, uc: int, *, mark: str) -> bytes:
    """The checksum of use case ``uc``'s row as it is now."""
    return use_case_digest(db.execute(_ROW.replace("?", mark), (uc,)).fetchone())


def put_digest(db: Executes, key: str, digest: bytes, *, mark: str) -> None:
    """Store a checksum in ``meta`` under ``key``."""
    db.execute(_PUT_DIGEST.replace("?", mark), (key, digest))


def reseal_use_case(db: Executes, uc: int, *, mark: str) -> None:
    """Store the checksum of the use case's row as it is now (after the row changed)."""
    put_digest(db, use_case_key(uc), row_digest(db, uc, mark=mark), mark=mark)


def adopt_or_insert(db: Executes, uc: UseCase, *, mark: str) -> None:
    """Make the definition's row; a row the previous release keyed by the mechanism's
    fingerprint becomes this definition's, with its aggregates and report ids; either is
    resealed."""
    fp = use_case_fingerprint(uc)
    if _row_id(db, mark, uc.name, fp) is not None:
        return
    legacy = _row_id(db, mark, uc.name, legacy_fingerprint(uc))
    if legacy is not None:
        db.execute(_REKEY.replace("?", mark), (fp, legacy))
        reseal_use_case(db, legacy, mark=mark)
        return
    db.execute(_INSERT.replace("?", mark), (uc.name, fp, uc.mechanism.name, uc.period.seconds))
    made = _row_id(db, mark, uc.name, fp)
    if made is not None:
        reseal_use_case(db, made, mark=mark)


def stored_rows(db: Executes, use_cases: Mapping[str, UseCase], *, mark: str) -> dict[str, UseCaseRow]:
    """The row of each definition that has one, keyed by ref (a store opened only for reading
    has none for a definition never collected)."""
    rows: dict[str, UseCaseRow] = {}
    for ref, uc in use_cases.items():
        row_id = _row_id(db, mark, uc.name, use_case_fingerprint(uc))
        if row_id is not None:
            rows[ref] = UseCaseRow.of(row_id, uc)
    return rows
