"""The PostgreSQL store's tables, their versions, and the partitions of report ids and allowances.

What the tables hold and why they are laid out so is in :mod:`collector.store.postgres`; this
module is the DDL and the few statements that change the layout at run time (creating a
(use case, period)'s partitions, finding those below a low-water mark).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "LOCK_PARTITIONS",
    "LOCK_PRUNE",
    "LOCK_SCHEMA",
    "MIGRATIONS",
    "PARTITIONED",
    "SCHEMA_VERSION",
    "TABLES",
    "create_partitions",
    "drop_partitions",
    "partition",
    "partitions_below",
]

SCHEMA_VERSION = 2
"""2: use-case rows keyed by the definition hash (SQLite schema 3). 1: the same tables, rows
keyed by the mechanism's fingerprint and the period (the previous release)."""

TABLES = (
    "CREATE TABLE meta (key text PRIMARY KEY, value bytea NOT NULL)",
    # The commit-ordered version (see the module docstring) and the number of compactions.
    "CREATE TABLE clock (one boolean PRIMARY KEY DEFAULT true CHECK (one), version bigint NOT NULL, "
    "compactions bigint NOT NULL)",
    "INSERT INTO clock (one, version, compactions) VALUES (true, 0, 0)",
    "CREATE TABLE use_cases (id serial PRIMARY KEY, name text NOT NULL, fingerprint bytea NOT NULL, "
    "mechanism text NOT NULL, period_seconds bigint NOT NULL, low_water bigint NOT NULL DEFAULT 0, "
    "UNIQUE (name, fingerprint))",
    "CREATE TABLE aggregates (uc integer NOT NULL, period bigint NOT NULL, reports bigint NOT NULL, "
    "records bigint NOT NULL, data bytea NOT NULL, PRIMARY KEY (uc, period))",
    "CREATE TABLE segments (version bigint NOT NULL, uc integer NOT NULL, period bigint NOT NULL, "
    "kind text NOT NULL, reports bigint NOT NULL, records bigint NOT NULL, data bytea NOT NULL)",
    "CREATE INDEX segments_key ON segments (uc, period, version)",
    # The blobs are compressed already (row_format.pack): PostgreSQL's own compression would only cost.
    "ALTER TABLE aggregates ALTER COLUMN data SET STORAGE EXTERNAL",
    "ALTER TABLE segments ALTER COLUMN data SET STORAGE EXTERNAL",
    "CREATE TABLE seen (uc integer NOT NULL, period bigint NOT NULL, rid bytea NOT NULL, "
    "PRIMARY KEY (uc, period, rid)) PARTITION BY RANGE (uc, period)",
    "CREATE TABLE allowance_keys (uc integer NOT NULL, period bigint NOT NULL, key bytea NOT NULL, "
    "PRIMARY KEY (uc, period)) PARTITION BY RANGE (uc, period)",
    # reports: the tag's count; cap: the allowance it was judged against; added: how many the
    # last commit that touched the row added (what the upsert reports back).
    "CREATE TABLE allowance (uc integer NOT NULL, period bigint NOT NULL, tag bytea NOT NULL, "
    "reports integer NOT NULL, cap integer NOT NULL, added integer NOT NULL, "
    "PRIMARY KEY (uc, period, tag)) PARTITION BY RANGE (uc, period)",
    "CREATE TABLE counters (instance text NOT NULL, name text NOT NULL, value bigint NOT NULL, "
    "PRIMARY KEY (instance, name))",
)
PARTITIONED = ("seen", "allowance_keys", "allowance")  # also the order they are locked in
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 1 -> 2 changes what use_cases.fingerprint holds, not the layout: the store re-keys each
    # row when it registers the definitions (collector.store.interface.legacy_fingerprint).
    1: (),
}
"""Statements that take schema ``v`` to ``v + 1``, by ``v``."""

# Advisory lock keys (pg_advisory_xact_lock(bigint)): "ldp" in the high bytes, then a purpose.
LOCK_SCHEMA = 0x6C64700001
LOCK_PARTITIONS = 0x6C64700002
LOCK_PRUNE = 0x6C64700003
_PARTITION_NAME = re.compile(r"^seen_u(\d+)_p(m?\d+)$")


def partition(table: str, uc: int, period: int) -> sql.Identifier:
    """The name of ``table``'s partition for (use case id, period): ``seen_u3_p480123``."""
    return sql.Identifier(f"{table}_u{uc}_p{str(period).replace('-', 'm')}")


def create_partitions(cur: psycopg.Cursor[Any], keys: Iterable[tuple[int, int]]) -> None:
    """Create the partitions of every partitioned table for ``keys`` (inside the caller's transaction).

    ``IF NOT EXISTS`` finds a partition another member made without taking the parent's lock.
    """
    for uc, period in sorted(keys):
        for table in PARTITIONED:
            cur.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}, {}) TO ({}, {})").format(
                    partition(table, uc, period),
                    sql.Identifier(table),
                    sql.Literal(uc),
                    sql.Literal(period),
                    sql.Literal(uc),
                    sql.Literal(period + 1),
                )
            )


def partitions_below(cur: psycopg.Cursor[Any], marks: Mapping[int, int]) -> list[tuple[int, int]]:
    """(use case id, period) of the ``seen`` partitions below their use case's mark."""
    out = []
    for (name,) in cur.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'seen'::regclass"
    ).fetchall():
        match = _PARTITION_NAME.match(str(name))
        if match is None:
            continue
        uc, period = int(match[1]), int(match[2].replace("m", "-"))
        if uc in marks and period < marks[uc]:
            out.append((uc, period))
    return sorted(out)


def drop_partitions(cur: psycopg.Cursor[Any], uc: int, period: int) -> int:
    """Drop the key's partitions (inside the caller's transaction); return the report ids they held."""
    count = cur.execute(sql.SQL("SELECT count(*) FROM {}").format(partition("seen", uc, period))).fetchone()
    cur.execute(
        sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(partition(t, uc, period) for t in PARTITIONED))
    )
    return int(count[0]) if count else 0
