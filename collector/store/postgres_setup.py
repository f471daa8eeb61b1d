"""Opening the PostgreSQL checkpoint store: its connection, schema versions, use-case rows and integrity.

:class:`PostgresSetup` is the base of :class:`~collector.store.postgres.PostgresStore`: it
holds the connection (and what a failure on it means, :mod:`collector.store.postgres_session`),
makes or migrates the schema (:mod:`collector.store.postgres_schema`), registers the accepted
definitions and verifies the checksums. The commits, reads and maintenance are in
:mod:`collector.store.postgres`.

**Integrity.** The same checksums as SQLite schema 2 (:mod:`collector.store.row_format`,
:mod:`collector.store.integrity`): sealed
aggregates and segments, tagged report ids, and the checksums of each use case's row and
each instance's counters in ``meta``; opening for writing verifies them all. PostgreSQL's
own page checksums (``initdb --data-checksums``) cover the rest of what SQLite's
``integrity_check`` does. SQLite's ``<db>.id`` marker does not apply: it guards against a
database *file* vanishing from the collector's own file system, after which the collector
would create an empty one in its place. Here the collector never creates a database
(connecting to one that does not exist fails; the schema is made only in a database the
operator created and named, when it has no ``meta`` table), keeping the data is the
server's job (its WAL and backups), and a marker on one member's disk would say nothing to
the other members, on other hosts, nor to a member that joins the group later.

**Schema versions.** ``meta.schema`` holds :data:`SCHEMA_VERSION`; opening for writing
migrates an older schema step by step under an advisory lock (several members may start at
once) and refuses a newer one, naming both versions: a collector must never write into a
layout it does not know. Schema 1 (the previous release) keyed use-case rows by the
mechanism's fingerprint and the period; 2 keys them by the definition hash, and registering
the definitions re-keys each old row to the definition that maps to it. Opening only for
reading never migrates: an older schema is refused with the command that does
(``ldp-collector migrate``).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import msgpack
import psycopg

from collector.config import StoreConfig, read_store_password
from collector.errors import StoreDamaged, StoreError
from collector.store.integrity import (
    check_aggregates,
    check_digests,
    check_seen,
    check_segments,
    counters_digest,
)
from collector.store.interface import MIGRATE_COMMAND
from collector.store.postgres_schema import LOCK_SCHEMA, MIGRATIONS, SCHEMA_VERSION, TABLES
from collector.store.postgres_session import connect, unavailable
from collector.store.reads import SegmentReads
from collector.store.row_format import UseCaseRow
from collector.store.use_case_rows import adopt_or_insert, put_digest, reseal_use_case, row_digest, stored_rows
from protocol.catalog import Catalog, catalog_of
from protocol.errors import StateError
from protocol.registry import Registry

__all__ = ["PostgresSetup"]


class PostgresSetup(SegmentReads):
    """Connection, schema, use-case rows and integrity of the PostgreSQL checkpoint database.

    Opened with the arguments of :class:`~collector.store.postgres.PostgresStore`, and raises what it says.
    """

    mark: ClassVar[str] = "%s"

    def __init__(
        self, config: StoreConfig, catalog: Catalog | Registry, *, instance: str = "collector", readonly: bool = False
    ):
        if config.url is None:
            raise ValueError("a PostgreSQL store needs store.url")
        self.config = config
        self.url = config.url
        self.catalog = catalog_of(catalog)
        self.instance = instance
        self.readonly = readonly
        self._password = read_store_password(config)
        self._conn: psycopg.Connection[Any] | None = None
        self._partitions: set[tuple[int, int]] = set()
        self._use_cases: dict[str, UseCaseRow] = {}
        try:
            with self._failures():
                self._open_schema()
                self._use_cases = self._register_use_cases()
                if not readonly:
                    self.verify()
        except BaseException:
            self.close()
            raise

    @property
    def location(self) -> str:
        """The database URL (it holds no password)."""
        return self.url  # config refuses URLs with a password

    # -- connection and failures ----------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._conn = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        conn = connect(self.url, password=self._password, instance=self.instance, readonly=self.readonly)
        self._conn = conn
        return conn

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """Map psycopg failures to StoreUnavailable (can pass) or StoreError (cannot); end the transaction."""
        try:
            yield
        except psycopg.Error as exc:
            self._abandon()
            transient = unavailable(exc, self.location)
            if transient is not None:
                raise transient from exc
            raise StoreError(f"{self.location}: {exc}") from exc
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Roll back whatever transaction is open; drop a connection that is no longer usable."""
        conn = self._conn
        if conn is None:
            return
        if conn.closed or conn.broken:
            self._conn = None
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
                self._conn = None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def _damaged(self, what: str) -> StoreError:
        return StoreDamaged(
            f"the checkpoint database {self.location} is damaged: {what}. Stop every collector using it "
            "and restore it from a backup"
        )

    def _unrestorable(self, row: UseCaseRow, exc: StateError) -> StoreError:
        return self._damaged(f"the {row.use_case.name} base aggregate cannot be restored ({exc})")

    # -- set-up ----------------------------------------------------------------------------

    def _schema_version(self, cur: psycopg.Cursor[Any]) -> int | None:
        if cur.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone() != (True,):
            return None
        row = cur.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            raise self._damaged("table meta has no schema version")
        try:
            return int(bytes(row[0]).decode())
        except ValueError as exc:
            raise self._damaged(f"table meta: schema version {bytes(row[0])!r}") from exc

    def _refuse_newer(self, found: int) -> None:
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"{self.location} has checkpoint schema {found}, newer than the {SCHEMA_VERSION} this collector "
                "knows: run a collector of the version that created it (upgrade this one); it will not write "
                "into a layout it does not know"
            )

    def _open_schema(self) -> None:
        conn = self._connection()
        with conn.cursor() as cur:
            if self.readonly:
                found = self._schema_version(cur)
                if found is None:
                    raise StoreError(f"no checkpoint schema in {self.location} (no collector has written to it)")
                self._refuse_newer(found)
                if found < SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.location} has checkpoint schema {found}, written by an earlier release; this release "
                        f"reads {SCHEMA_VERSION}. Migrate it with `{MIGRATE_COMMAND}` (stop every member of the group "
                        "first; starting the service migrates it too)"
                    )
                return
            cur.execute("BEGIN")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_SCHEMA,))
            found = self._schema_version(cur)
            if found is None:
                for statement in TABLES:
                    cur.execute(statement)
                cur.execute("INSERT INTO meta (key, value) VALUES ('schema', %s)", (str(SCHEMA_VERSION).encode(),))
            else:
                self._refuse_newer(found)
                for version in range(found, SCHEMA_VERSION):
                    for statement in MIGRATIONS[version]:
                        cur.execute(statement)
                cur.execute("UPDATE meta SET value = %s WHERE key = 'schema'", (str(SCHEMA_VERSION).encode(),))
            cur.execute("COMMIT")

    def _register_use_cases(self) -> dict[str, UseCaseRow]:
        """A row per accepted definition (made, or re-keyed from a previous release's row, when
        writable), keyed by ref; one transaction under the schema lock, as members may start at once."""
        conn = self._connection()
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            if not self.readonly:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_SCHEMA,))
                # A row keyed by the previous release's fingerprint is schema 1's.
                for uc in self.catalog.use_cases.values():
                    adopt_or_insert(cur, uc, mark=self.mark)
            rows = stored_rows(cur, self.catalog.use_cases, mark=self.mark)
            cur.execute("COMMIT")
        return rows

    def use_case_names(self) -> Iterable[str]:
        """Refs of the accepted definitions that have a row in this database."""
        return self._use_cases.keys()

    # -- checksums -------------------------------------------------------------------------

    def _use_case_digest(self, cur: psycopg.Cursor[Any], uc: int) -> bytes:
        return row_digest(cur, uc, mark=self.mark)

    def _put_digest(self, cur: psycopg.Cursor[Any], key: str, value: bytes) -> None:
        put_digest(cur, key, value, mark=self.mark)

    def _reseal_use_case(self, cur: psycopg.Cursor[Any], uc: int) -> None:
        """Store the checksum of the use case's row as it is now (after the row changed)."""
        reseal_use_case(cur, uc, mark=self.mark)

    def check(self, *, report_ids: bool = True) -> None:
        """Check every checksum again, as the open did (the report ids' tags only with
        ``report_ids``); the server guards its own pages and indexes (docs/deploy.md).

        Raises:
            StoreError: naming the database, the table and the row at fault, and what to do.
        """
        with self._failures():
            self._verify(report_ids=report_ids)

    def verify(self) -> None:
        """Check every checksum.

        Raises:
            StoreError: naming the database, the table and the row at fault, and what to do.
        """
        with self._failures():
            self._verify()

    def _verify(self, *, report_ids: bool = True) -> None:
        conn = self._connection()
        with conn.cursor(binary=True) as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                self._verify_digests(cur)
                self._verify_blobs(conn, cur, report_ids=report_ids)
            except (TypeError, ValueError, OverflowError, AttributeError, msgpack.UnpackException) as exc:
                raise self._damaged(f"a row has a value of the wrong type ({exc})") from exc
            finally:
                if not conn.broken:
                    cur.execute("COMMIT")

    def _verify_digests(self, cur: psycopg.Cursor[Any]) -> None:
        """The rows checksummed in ``meta`` (use cases, counters) and the commit clock."""
        digests = {str(k): bytes(v) for k, v in cur.execute("SELECT key, value FROM meta WHERE key LIKE 'digest:%%'")}
        use_cases = [
            (uc, self._use_case_digest(cur, uc)) for (uc,) in cur.execute("SELECT id FROM use_cases").fetchall()
        ]
        by_instance: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for instance, name, value in cur.execute("SELECT instance, name, value FROM counters ORDER BY instance, name"):
            by_instance[str(instance)].append((str(name), int(value)))
        counters = ((instance, counters_digest(instance, rows)) for instance, rows in by_instance.items())
        check_digests(digests, use_cases, counters, self._damaged)
        newest, clock = cur.execute(
            "SELECT (SELECT max(version) FROM segments), (SELECT version FROM clock)"
        ).fetchone() or (None, None)
        if newest is not None and (clock is None or clock < newest):
            raise self._damaged(f"table clock: segments go up to version {newest}, the clock says {clock!r}")

    def _verify_blobs(self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], *, report_ids: bool) -> None:
        """The sealed aggregates and segments, and the tags of the report ids (with ``report_ids``)."""
        check_aggregates(cur.execute("SELECT uc, period, reports, records, data FROM aggregates"), self._open)
        check_segments(cur.execute("SELECT uc, period, kind, reports, records, data FROM segments"), self._open)
        if not report_ids:
            return
        with conn.cursor("verify_seen", binary=True) as seen:
            seen.itersize = 20000
            seen.execute("SELECT rid, uc, period FROM seen")
            check_seen(((bytes(stored), uc, period) for stored, uc, period in seen), self._damaged)
