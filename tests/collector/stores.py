"""Where a test's checkpoint store lives: a SQLite file or a PostgreSQL database, one interface.

The store tests take the ``site`` fixture (``tests/collector/conftest.py``), parametrised over
both backends, and open stores through it, so the same assertions hold for each.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from collector.config import StoreConfig
from collector.store import CheckpointStore, Store
from collector.store.keyset import KEY_BYTES
from collector.store.postgres import PostgresStore
from collector.store.row_format import DIGEST_BYTES
from protocol.registry import Registry
from tests.support.postgres import PostgresServer

__all__ = ["BACKENDS", "StoreSite", "fresh_database", "sqlite_allowance"]

BACKENDS = ("sqlite", "postgres")
_names = itertools.count()


def fresh_database(server: PostgresServer, prefix: str = "db") -> PostgresServer:
    """A new empty database on ``server`` (for tests that need more than one)."""
    name = f"{prefix}_{next(_names)}_{id(server) % 10000}"
    server.run_sql(f"CREATE DATABASE {name} OWNER {server.user}")
    return server.with_database(name)


def sqlite_allowance(db: sqlite3.Connection) -> Counter[bytes]:
    """A SQLite store's allowance slots by tag: its settled rows and the tags in the runs of recent
    commits (a tag once per report counted; collector/store/sqlite_ids.py)."""
    counts: Counter[bytes] = Counter(
        {bytes(tag): int(n) for tag, n in db.execute("SELECT tag, reports FROM allowance")}
    )
    for (data,) in db.execute("SELECT data FROM id_runs WHERE kind = 't'"):
        payload = bytes(data)[1 + DIGEST_BYTES :]
        counts.update(payload[i : i + KEY_BYTES] for i in range(0, len(payload), KEY_BYTES))
    return counts


@dataclass(frozen=True)
class StoreSite:
    """A test's store location on one backend.

    Attributes:
        backend: ``sqlite`` or ``postgres``.
        path: the SQLite file (also used for SQLite when the backend is postgres: unused).
        server: the PostgreSQL server and database, for ``postgres``.
    """

    backend: str
    path: Path
    server: PostgresServer | None = None

    @property
    def url(self) -> str:
        """The PostgreSQL URL."""
        assert self.server is not None
        return self.server.url

    def store_config(self) -> StoreConfig:
        """``[store]`` as decoded."""
        if self.backend == "postgres":
            return StoreConfig(url=self.url)
        return StoreConfig(path=self.path)

    def toml(self) -> str:
        """The ``[store]`` table's keys, as TOML lines."""
        if self.backend == "postgres":
            return f'url = "{self.url}"\n'
        return f'path = "{self.path}"\n'

    def table(self) -> dict[str, Any]:
        """The ``[store]`` table, for ``parse_config``."""
        return {"url": self.url} if self.backend == "postgres" else {"path": str(self.path)}

    def open(self, registry: Registry, *, instance: str = "test", readonly: bool = False) -> Store:
        """Open the store (created on first open for writing)."""
        if self.backend == "postgres":
            return PostgresStore(self.store_config(), registry, instance=instance, readonly=readonly)
        return CheckpointStore(self.path, registry, instance=instance, readonly=readonly)

    def query(self, text: str) -> list[tuple[Any, ...]]:
        """Rows of a read-only SQL query, outside the store (to look at what it wrote)."""
        if self.backend == "postgres":
            with psycopg.connect(self.url, autocommit=True) as conn:
                return list(conn.execute(text.encode()).fetchall())
        db = sqlite3.connect(self.path)
        try:
            return list(db.execute(text).fetchall())
        finally:
            db.close()

    def allowance_counts(self) -> Counter[bytes]:
        """Each allowance slot's count by its tag, wherever the backend keeps it."""
        if self.backend == "postgres":
            return Counter({bytes(tag): int(n) for tag, n in self.query("SELECT tag, reports FROM allowance")})
        db = sqlite3.connect(self.path)
        try:
            return sqlite_allowance(db)
        finally:
            db.close()

    def fresh(self, tag: str) -> StoreSite:
        """Another, empty store on the same backend."""
        if self.server is not None:
            return StoreSite(self.backend, self.path.with_name(f"{tag}.sqlite3"), fresh_database(self.server, tag))
        return StoreSite(self.backend, self.path.with_name(f"{tag}.sqlite3"))
