"""Opening the SQLite checkpoint store: its tables, schema versions, use-case rows and integrity.

:class:`SQLiteSetup` is the base of :class:`~collector.store.sqlite.CheckpointStore`: it opens
the file (WAL, ``secure_delete``), makes or migrates the schema, registers the accepted
definitions and checks that what it opened is the database that was there, undamaged. The
commits, reads and maintenance are in :mod:`collector.store.sqlite`.

**Integrity.** Every stored aggregate and segment carries a 16-byte keyed BLAKE2b checksum
over its key, its totals and its data (inside the ``data`` column: ``b"s" + digest +
payload``); every remembered report id carries a 4-byte tag over the id, its use case and its
period (the last bytes of ``rid``); each use case's row (fingerprint, low-water mark) and each
instance's counters have a checksum in ``meta``. Every open, for writing (the service) or for
reading only (``ldp-collector status``, ``estimate``, the live view of the HTTP API), runs
``PRAGMA integrity_check`` and verifies every checksum, so a flipped bit stops the collector at
start, or the command, with a message naming the file, the table and what to do, instead of
reading as a silently wrong number; reads verify the blobs they fold. A marker file next to the
database (``<file>.id``) remembers that a database was created there: if the database goes missing,
the collector refuses to start a fresh one in its place.

**Schema versions.** ``meta.schema`` says what the file holds: 1 (no checksums), 2 (use-case
rows keyed by the mechanism's fingerprint and the period, the previous release) and 3 (keyed
by the definition hash), 4 (report ids keyed by use case, period and id) and 5 (recent
report ids and allowance tags in append-only runs, collector/store/sqlite_ids.py). Opening for
writing migrates an older file in place, each step in one transaction: 1 -> 2 seals every row,
2 -> 3 re-keys each use-case row to the definition that maps to it
(``collector.store.interface.legacy_fingerprint``), 4 -> 5 only adds the empty table of runs
(what schema 4 stored is read as settled; tests/compat/test_store_v4.py). A file opened only for reading
(``ldp-collector status``, ``estimate``) is never changed: an older schema is refused with the
command that migrates it (``ldp-collector migrate``), a newer one with the versions named.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import msgpack

from collector.errors import StoreDamaged, StoreError, StoreUnavailable
from collector.store.integrity import (
    check_aggregates,
    check_digests,
    check_seen,
    check_segments,
    counters_digest,
    counters_key,
)
from collector.store.interface import MIGRATE_COMMAND
from collector.store.reads import SegmentReads
from collector.store.row_format import UseCaseRow, rid_tag, seal
from collector.store.sqlite_ids import LIMIT, SQLiteIds, check_runs
from collector.store.use_case_rows import adopt_or_insert, put_digest, reseal_use_case, row_digest, stored_rows
from protocol.catalog import Catalog, catalog_of
from protocol.errors import StateError
from protocol.registry import Registry

__all__ = ["SCHEMA_VERSION", "SQLiteSetup"]

SCHEMA_VERSION = 5
"""5: the report ids and allowance tags of recent commits in append-only runs (``id_runs``),
settled into ``seen`` and ``allowance`` in bulk (collector/store/sqlite_ids.py). (4: report ids
keyed by (use case, period, id), with no second index; 3: use-case rows keyed by the definition
hash; 2: checksums on aggregates, segments, report ids, use-case rows and counters, rows keyed
by the mechanism's fingerprint; 1: no checksums.)"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS use_cases (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    mechanism TEXT NOT NULL,
    period_seconds INTEGER NOT NULL,
    low_water INTEGER NOT NULL DEFAULT 0,
    UNIQUE (name, fingerprint)
);
CREATE TABLE IF NOT EXISTS aggregates (
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    records INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (uc, period)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS segments (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    kind TEXT NOT NULL,
    reports INTEGER NOT NULL,
    records INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS segments_key ON segments (uc, period, seq);
CREATE TABLE IF NOT EXISTS seen (
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    rid BLOB NOT NULL,
    PRIMARY KEY (uc, period, rid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS allowance_keys (
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    key BLOB NOT NULL,
    PRIMARY KEY (uc, period)
);
CREATE TABLE IF NOT EXISTS allowance (
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    tag BLOB NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (uc, period, tag)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS id_runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS id_runs_key ON id_runs (uc, period);
CREATE TABLE IF NOT EXISTS counters (
    instance TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (instance, name)
) WITHOUT ROWID;
"""


# SQLite's primary result codes of failures that can pass (sqlite3.h), and what they mean to
# an operator. Anything else (SQLITE_CORRUPT, SQLITE_NOTADB, a schema problem) is a StoreError
# that stops the collector.
_TRANSIENT: dict[int, tuple[str, str]] = {
    13: ("disk-full", "the disk is full (SQLITE_FULL); free space on its file system"),
    5: ("locked", "the database is locked by another process (SQLITE_BUSY)"),
    6: ("locked", "a table is locked (SQLITE_LOCKED)"),
    8: ("read-only", "the database is read-only (SQLITE_READONLY); check its permissions and mount"),
    10: ("io-error", "an I/O error occurred (SQLITE_IOERR); check the disk"),
    14: ("cannot-open", "the database file cannot be opened (SQLITE_CANTOPEN)"),
}


def _transient(path: Path, exc: sqlite3.Error) -> StoreUnavailable | None:
    """The StoreUnavailable for a SQLite failure that can pass, or None for one that cannot."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    known = _TRANSIENT.get(code & 0xFF)
    if known is None:
        return None
    cause, text = known
    return StoreUnavailable(cause, str(path), f"{text}: {exc}")


def end_read(db: sqlite3.Connection) -> None:
    """End a read transaction, whatever state a failed read left it in."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("COMMIT")


def rollback(db: sqlite3.Connection) -> None:
    """Roll back if a transaction is open; SQLite may already have rolled it back itself
    (after SQLITE_FULL or an I/O error), and a failing ROLLBACK must not hide the cause."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


_READ_TABLES = ("meta", "use_cases", "aggregates", "segments", "counters", "sqlite_sequence")
"""What the live view reads (:meth:`SQLiteSetup.check` with ``report_ids=False``): every
table but the remembered report ids and the allowance, which only commits use."""


class SQLiteSetup(SegmentReads):
    """Opening, schema, use-case rows and integrity of the SQLite checkpoint database.

    Opened with the arguments of :class:`~collector.store.sqlite.CheckpointStore`.
    """

    mark: ClassVar[str] = "?"

    def __init__(
        self,
        path: str | Path,
        catalog: Catalog | Registry,
        *,
        instance: str = "collector",
        readonly: bool = False,
        synchronous: str = "FULL",
        ids_in_memory: int = LIMIT,
    ) -> None:
        self.path = Path(path)
        self.catalog = catalog_of(catalog)
        self.instance = instance
        self.readonly = readonly
        try:
            self._db = self._connect_readonly() if readonly else self._connect(synchronous)
            self._identity = self._file_identity()
            self._db.execute("PRAGMA busy_timeout=30000")
            if readonly:
                # The same checks as the service's open (docs/deploy.md, "When the store is
                # damaged"): a flip in an index or in sqlite_sequence is covered by no row
                # checksum and would otherwise read as a silently missing row.
                self._check_structure()
            self._check_schema()
            self._use_cases = self._register_use_cases()
            if not readonly:
                self._check_marker()
            self.verify()
            self._ids = SQLiteIds(self._db, self._damaged, limit=ids_in_memory)
            if not readonly:
                self._ids.load()
        except sqlite3.DatabaseError as exc:
            transient = _transient(self.path, exc)
            if transient is not None:  # a full disk or a lock at start: a restart may succeed
                raise transient from exc
            raise self._damaged(f"SQLite reports: {exc}") from exc
        except (UnicodeDecodeError, TypeError, ValueError) as exc:  # a damaged schema text or value
            raise self._damaged(f"{type(exc).__name__}: {exc}") from exc

    @property
    def location(self) -> str:
        """The database file, for messages."""
        return str(self.path)

    def _connect_readonly(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise StoreError(f"no checkpoint database at {self.path}")
        return sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        """Open (or create) the file for writing, check an existing one's structure, make the tables."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._refuse_missing()
        existed = self.path.exists() and self.path.stat().st_size > 0
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        if existed:
            self._check_structure()
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: cannot switch the database to WAL mode (got {mode})")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        # Deleted content is overwritten with zeros, freed pages included: a pruned
        # allowance key or tag must not linger in free space ("FAST", which skips freed
        # pages, left whole leaf pages of tags behind). The cost is the zeroing writes when
        # compaction deletes segments.
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.executescript(_SCHEMA)
        return self._db

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """Map SQLite failures of a write to StoreUnavailable (can pass) or StoreError (cannot)."""
        try:
            yield
        except sqlite3.Error as exc:
            transient = _transient(self.path, exc)
            if transient is None:
                raise StoreError(f"{self.path}: {exc}") from exc
            raise transient from exc

    # -- schema ------------------------------------------------------------------------

    @property
    def schema(self) -> int:
        """The schema version of the file (:data:`SCHEMA_VERSION` once opened for writing)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        return 0 if row is None else int(row[0])

    def _check_schema(self) -> None:
        found = self.schema
        if found == 0:
            if self.readonly:
                raise StoreError(f"{self.path} is not a collector checkpoint database")
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
            return
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has checkpoint schema {found}, newer than the {SCHEMA_VERSION} this collector reads: "
                "run a collector of the release that wrote it; this one will not write into a layout it does not know"
            )
        if found < SCHEMA_VERSION and self.readonly:
            raise StoreError(
                f"{self.path} has checkpoint schema {found}, written by an earlier release; this release reads "
                f"{SCHEMA_VERSION}. Migrate it in place with `{MIGRATE_COMMAND}` (stop the service first; starting "
                "the service migrates it too)"
            )
        if found == 1:
            self._upgrade_from_1()
        if found <= 3:
            self._rekey_seen()
        if found <= 4:
            # 4 -> 5 adds the table of runs (made with the others at connect), empty: every report id
            # and allowance tag the file holds is settled. Only the version changes.
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))

    def _upgrade_from_1(self) -> None:
        """Schema 1 had no checksums: seal every row as it stands, in one transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for uc, period, reports, records, data in db.execute(
                "SELECT uc, period, reports, records, data FROM aggregates"
            ).fetchall():
                db.execute(
                    "UPDATE aggregates SET data = ? WHERE uc = ? AND period = ?",
                    (seal("aggregates", (uc, period, "", reports, records), data), uc, period),
                )
            for seq, uc, period, kind, reports, records, data in db.execute(
                "SELECT seq, uc, period, kind, reports, records, data FROM segments"
            ).fetchall():
                db.execute(
                    "UPDATE segments SET data = ? WHERE seq = ?",
                    (seal("segments", (uc, period, kind, reports, records), data), seq),
                )
            rows = db.execute("SELECT rid, uc, period FROM seen").fetchall()
            db.executemany("UPDATE seen SET rid = ? WHERE rid = ?", [(rid_tag(r, uc, p), r) for r, uc, p in rows])
            for (uc,) in db.execute("SELECT id FROM use_cases").fetchall():
                self._reseal_use_case(uc)
            for (instance,) in db.execute("SELECT DISTINCT instance FROM counters").fetchall():
                self._put_digest(counters_key(instance), self._counters_digest(instance))
            db.execute("UPDATE meta SET value = 2 WHERE key = 'schema'")
            db.execute("COMMIT")
        except BaseException:
            rollback(db)
            raise

    def _rekey_seen(self) -> None:
        """Schemas 1-3 kept report ids keyed by id, with a second index by (use case, period) for
        pruning: every remembered id was two random B-tree inserts, and a commit dirtied about
        twice the pages (docs/deploy.md, "The store's cost per report"). Schema 4 keys them by
        (use case, period, id), which both lookups and pruning use. One transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "CREATE TABLE seen_by_period (uc INTEGER NOT NULL, period INTEGER NOT NULL, rid BLOB NOT NULL, "
                "PRIMARY KEY (uc, period, rid)) WITHOUT ROWID"
            )
            db.execute(
                "INSERT INTO seen_by_period (uc, period, rid) SELECT uc, period, rid FROM seen ORDER BY uc, period, rid"
            )
            db.execute("DROP TABLE seen")  # its index seen_period goes with it
            db.execute("ALTER TABLE seen_by_period RENAME TO seen")
            db.execute("UPDATE meta SET value = 4 WHERE key = 'schema'")
            db.execute("COMMIT")
        except BaseException:
            rollback(db)
            raise

    # -- use cases ---------------------------------------------------------------------

    def _register_use_cases(self) -> dict[str, UseCaseRow]:
        """A row per accepted definition (made, or re-keyed from a previous release's row, when
        writable), keyed by ref; one transaction, so a row and its checksum change together."""
        db = self._db
        if not self.readonly:
            db.execute("BEGIN IMMEDIATE")
            try:
                # A row keyed by the previous release's fingerprint is schema 2's.
                for uc in self.catalog.use_cases.values():
                    adopt_or_insert(db, uc, mark=self.mark)
                db.execute("COMMIT")
            except BaseException:
                rollback(db)
                raise
        return stored_rows(db, self.catalog.use_cases, mark=self.mark)

    def use_case_names(self) -> Iterable[str]:
        """Refs of the accepted definitions that have a row in this database."""
        return self._use_cases.keys()

    # -- the file ----------------------------------------------------------------------

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check_file(self) -> None:
        """Raise StoreUnavailable if the database file was removed or replaced since it was opened.

        SQLite goes on writing to an unlinked file without an error: every commit after
        that would be acknowledged and then lost with the file.
        """
        if not self.readonly and self._file_identity() != self._identity:
            raise StoreUnavailable(
                "vanished",
                str(self.path),
                "the database file was removed or replaced while the collector had it open; "
                "restore it (or move the replacement away) and the collector resumes, or restart it",
            )

    @property
    def marker(self) -> Path:
        """The file next to the database that remembers it was created (``<file>.id``)."""
        return self.path.with_name(self.path.name + ".id")

    def _refuse_missing(self) -> None:
        if self.marker.exists() and not self.path.exists():
            raise StoreError(
                f"the checkpoint database {self.path} is missing, but {self.marker} records that one was "
                f"created there (store id {self.marker.read_text(encoding='utf-8').strip()}). Restore it from a "
                f"backup; to start an empty store on purpose, delete {self.marker}"
            )

    def _check_marker(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        if row is None:
            store_id = os.urandom(8).hex()
            self._db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (store_id,))
        else:
            store_id = str(row[0])
        try:
            recorded = self.marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            recorded = None
        if recorded is None:
            tmp = self.marker.with_name(self.marker.name + ".tmp")
            tmp.write_text(store_id + "\n", encoding="utf-8")
            os.replace(tmp, self.marker)
        elif recorded != store_id:
            raise StoreError(
                f"{self.path} is not the database {self.marker} records (store id {recorded}, found {store_id}): "
                f"restore the right file, or delete {self.marker} to adopt this one"
            )

    # -- integrity ---------------------------------------------------------------------

    def _damaged(self, what: str) -> StoreError:
        return StoreDamaged(
            f"{self.path} is damaged: {what}. Stop every collector using it and restore it from a "
            f"backup; or move it (and {self.marker.name}) aside to start an empty store, losing "
            "what it counted and the memory of folded report ids"
        )

    def _unrestorable(self, row: UseCaseRow, exc: StateError) -> StoreError:
        return StoreError(f"{self.path}: the {row.use_case.name} base aggregate is damaged ({exc})")

    def _use_case_digest(self, uc: int) -> bytes:
        return row_digest(self._db, uc, mark=self.mark)

    def _counters_digest(self, instance: str) -> bytes:
        rows = self._db.execute(
            "SELECT name, value FROM counters WHERE instance = ? ORDER BY name", (instance,)
        ).fetchall()
        return counters_digest(instance, rows)

    def _put_digest(self, key: str, digest: bytes) -> None:
        put_digest(self._db, key, digest, mark=self.mark)

    def _reseal_use_case(self, uc: int) -> None:
        """Store the checksum of the use case's row as it is now (after the row changed)."""
        reseal_use_case(self._db, uc, mark=self.mark)

    def check(self, *, report_ids: bool = True) -> None:
        """Run the open's checks again on the file as it is now: the structure and every checksum.

        A running reader (the live view) calls it after it has read from the file and before it
        answers, so damage that lands after the open is refused like damage found at the open
        (docs/deploy.md, "When the store is damaged"). ``report_ids=False`` leaves out the
        remembered report ids (the ``seen`` table, most of the file), which no
        read of the live view touches; the service's periodic check includes them.

        Raises:
            StoreDamaged: naming the file and what is wrong.
            StoreUnavailable: the file cannot be read now (a lock, an I/O error).
        """
        with self._reading():
            self._check_structure(None if report_ids else _READ_TABLES)
            self.verify(report_ids=report_ids)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Map a SQLite failure of a read: one that can pass to StoreUnavailable, any other (a
        malformed page, say) to StoreDamaged naming the file, never a bare sqlite3 error."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            transient = _transient(self.path, exc)
            if transient is not None:
                raise transient from exc
            raise self._damaged(f"SQLite reports: {exc}") from exc

    def _check_structure(self, tables: Iterable[str] | None = None) -> None:
        """SQLite's ``integrity_check``: pages, b-trees, and every index against its table
        (of ``tables`` only, with their indexes, when given).

        ``quick_check`` is cheaper but does not compare indexes with their tables, and a bit
        flipped in an index entry then reads as a silently missing segment or use case (the
        index on ``use_cases (name, fingerprint)`` finds nothing, a fresh row is made, and a
        use case's whole history reads as zero). Its cost grows with the database (mostly the
        report ids); it runs once per open: at the service's start, once per read-only command,
        and when the live view opens its connection (its cost: docs/deploy.md, "When the store
        is damaged").
        """
        pragmas = ["integrity_check(20)"] if tables is None else [f"integrity_check({t})" for t in tables]
        for pragma in pragmas:
            problems = [str(r[0]) for r in self._db.execute(f"PRAGMA {pragma}")]
            if problems != ["ok"]:
                raise self._damaged(f"PRAGMA {pragma}: " + "; ".join(problems[:3]))

    def verify(self, *, report_ids: bool = True) -> None:
        """Check every checksum (``integrity_check`` has run at open); the report ids' tags
        only with ``report_ids``.

        Raises:
            StoreError: naming the file, the table and the row at fault, and what to do.
        """
        db = self._db
        db.execute("BEGIN")
        try:
            digests = {str(k): v for k, v in db.execute("SELECT key, value FROM meta WHERE key LIKE 'digest:%'")}
            check_digests(
                digests,
                ((uc, self._use_case_digest(uc)) for (uc,) in db.execute("SELECT id FROM use_cases").fetchall()),
                (
                    (instance, self._counters_digest(instance))
                    for (instance,) in db.execute("SELECT DISTINCT instance FROM counters").fetchall()
                ),
                self._damaged,
            )
            # Readers fold the segments up to the last sequence number (last_seq): one below the
            # newest segment would silently leave segments out.
            newest, last = db.execute(
                "SELECT (SELECT max(seq) FROM segments), (SELECT seq FROM sqlite_sequence WHERE name = 'segments')"
            ).fetchone()
            if newest is not None and (type(last) is not int or last < newest):
                raise self._damaged(f"table sqlite_sequence: segments go up to {newest}, the sequence says {last!r}")
            check_aggregates(db.execute("SELECT uc, period, reports, records, data FROM aggregates"), self._open)
            check_segments(db.execute("SELECT uc, period, kind, reports, records, data FROM segments"), self._open)
            if report_ids:
                check_seen(db.execute("SELECT rid, uc, period FROM seen"), self._damaged)
                check_runs(db, self._damaged)
        except (TypeError, ValueError, OverflowError, AttributeError, msgpack.UnpackException) as exc:
            raise self._damaged(f"a row has a value of the wrong type ({exc})") from exc
        finally:
            end_read(db)
