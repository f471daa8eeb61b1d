"""The SQLite backend of the checkpoint store (WAL): aggregates, the report ids folded into them, counters.

One commit is one SQLite transaction holding, together:

* a **segment** per touched (use case, period): the contribution of the commit's reports,
  either as a small partial aggregate (``to_plain`` of an aggregate holding just those
  reports) or, for mechanisms whose aggregate is large (a Count Mean Sketch table of
  ``k x m`` counters is up to hundreds of MiB), as the commit's records in columnar form,
  already shuffled (003 §3.2.2) - whichever is smaller for that mechanism;
* the **report ids** of those reports, so a redelivered message is recognised after a crash;
* the ingest **counters** (messages, rejections by reason, duplicates).

A message is acknowledged to the broker only after that transaction commits, so a crash
loses nothing acknowledged and counts nothing twice. The report-id check runs inside the
same write transaction (``BEGIN IMMEDIATE`` holds SQLite's write lock), so several collector
processes sharing one database file (an MQTT shared-subscription group on one host) never
fold the same report twice either, even when a device's retry reaches a different member.

**Per-device allowance**: a report that arrived under a device identity (the topic level the
broker's ACL ties to the authenticated user) is folded only while that identity has sent
fewer than :func:`report_allowance` reports for its (use case, period); the rest are counted
as ``rejected:over-allowance``. The identity itself is never stored: it is replaced by a
keyed BLAKE2b tag under a random key drawn per (use case, period), and the count is kept per
tag in the same transaction as the fold, so a redelivery after a crash is judged as before.
When a period leaves the accepted window, :meth:`CheckpointStore.prune` deletes its key and
its tags (with SQLite's ``secure_delete`` on, so the freed cells are zeroed, and a WAL
checkpoint after), which leaves nothing that links a report or a count to a device
(docs/device-identity.md).

**Compaction** folds a key's segments into its **base** aggregate, in one transaction, when
they are numerous or large relative to the base; reading an aggregate is base + segments.
**Pruning** forgets report ids of periods the collector no longer accepts; the lowest
accepted period per use case (the low-water mark) is stored and only moves forward, so a
clock set back can never reopen a pruned period to replays.

**Integrity.** Every stored aggregate and segment carries a 16-byte keyed BLAKE2b checksum
over its key, its totals and its data (inside the ``data`` column: ``b"s" + digest +
payload``); every remembered report id carries a 4-byte tag over the id, its use case and its
period (the last bytes of ``rid``); each use case's row (fingerprint, low-water mark) and each
instance's counters have a checksum in ``meta``. Opening the store for writing runs
``PRAGMA integrity_check`` and verifies every checksum, so a flipped bit stops the collector at
start with a message naming the file, the table and what to do, instead of reading as a
silently wrong number; reads verify the blobs they fold. A marker file next to the database
(``<file>.id``) remembers that a database was created there: if the database goes missing,
the collector refuses to start a fresh one in its place.

Aggregates are keyed by the use case's name *and* its definition hash (schema 3): each
definition a report can be made under (``protocol.catalog``) folds into aggregates of its own,
never mixed with another's, and every definition the collector is given stays readable.

**Schema versions.** ``meta.schema`` says what the file holds: 1 (no checksums), 2 (use-case
rows keyed by the mechanism's fingerprint and the period, the previous release) and 3 (keyed
by the definition hash). Opening for writing migrates an older file in place, each step in one
transaction: 1 -> 2 seals every row, 2 -> 3 re-keys each use-case row to the definition that
maps to it (``collector.store.interface.legacy_fingerprint``). A file opened only for reading
(``ldp-collector status``, ``estimate``) is never changed: an older schema is refused with the
command that migrates it (``ldp-collector migrate``), a newer one with the versions named.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import msgpack

from collector.errors import StoreError, StoreUnavailable
from collector.store.codec import (
    RID_BYTES,
    TAG_BYTES,
    UseCaseRow,
    allowance_tag,
    digest,
    group_by_key,
    make_segment,
    pack,
    rid_tag,
    seal,
    total_counters,
)
from collector.store.interface import (
    MIGRATE_COMMAND,
    CommitResult,
    FoldedReport,
    KeyInfo,
    legacy_fingerprint,
    report_allowance,
    use_case_fingerprint,
)
from collector.store.reads import SegmentReads
from protocol.catalog import Catalog, catalog_of
from protocol.errors import StateError
from protocol.registry import Registry, UseCase
from protocol.server.contract import Aggregate

__all__ = ["SCHEMA_VERSION", "CheckpointStore"]

SCHEMA_VERSION = 3
"""3: use-case rows keyed by the definition hash. (2: checksums on aggregates, segments, report
ids, use-case rows and counters, rows keyed by the mechanism's fingerprint; 1: no checksums.)"""

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
    rid BLOB PRIMARY KEY,
    uc INTEGER NOT NULL,
    period INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS seen_period ON seen (uc, period);
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
CREATE TABLE IF NOT EXISTS counters (
    instance TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (instance, name)
) WITHOUT ROWID;
"""

_IN_CHUNK = 500  # SQLite host parameters per "IN (...)" query


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


def _end(db: sqlite3.Connection) -> None:
    """End a read transaction, whatever state a failed read left it in."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("COMMIT")


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back if a transaction is open; SQLite may already have rolled it back itself
    (after SQLITE_FULL or an I/O error), and a failing ROLLBACK must not hide the cause."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


class CheckpointStore(SegmentReads):
    """The SQLite checkpoint database of one or several collectors.

    Not thread-safe: the service drives it from one dedicated thread.

    Args:
        path: the database file (created if missing, unless ``readonly``).
        catalog: the use-case definitions accepted (aggregates are keyed by each one's ref).
        instance: this collector's name (its counters are kept under it).
        readonly: open for reading only (the CLI and the materialised aggregates of ``collector.live``).
        synchronous: SQLite's ``synchronous`` setting; ``FULL`` survives power loss after an
            acknowledged commit, ``NORMAL`` only process crashes.
    """

    def __init__(
        self,
        path: str | Path,
        catalog: Catalog | Registry,
        *,
        instance: str = "collector",
        readonly: bool = False,
        synchronous: str = "FULL",
    ) -> None:
        self.path = Path(path)
        self.catalog = catalog_of(catalog)
        self.instance = instance
        self.readonly = readonly
        try:
            if readonly:
                if not self.path.exists():
                    raise StoreError(f"no checkpoint database at {self.path}")
                self._db = sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
                )
            else:
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
            self._identity = self._file_identity()
            self._db.execute("PRAGMA busy_timeout=30000")
            self._check_schema()
            self._use_cases = self._register_use_cases()
            if not readonly:
                self._check_marker()
                self.verify()
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

    # -- set-up ------------------------------------------------------------------------

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
        if found <= 2:
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
                self._put_digest(f"digest:use_cases:{uc}", self._use_case_digest(uc))
            for (instance,) in db.execute("SELECT DISTINCT instance FROM counters").fetchall():
                self._put_digest(f"digest:counters:{instance}", self._counters_digest(instance))
            db.execute("UPDATE meta SET value = 2 WHERE key = 'schema'")
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    def _register_use_cases(self) -> dict[str, UseCaseRow]:
        """A row per accepted definition (made, or re-keyed from a previous release's row, when
        writable), keyed by ref; one transaction, so a row and its checksum change together."""
        db = self._db
        if not self.readonly:
            db.execute("BEGIN IMMEDIATE")
            try:
                for uc in self.catalog.use_cases.values():
                    self._adopt_or_insert(uc)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        rows: dict[str, UseCaseRow] = {}
        for ref, uc in self.catalog.use_cases.items():
            fp = use_case_fingerprint(uc)
            row = db.execute("SELECT id FROM use_cases WHERE name = ? AND fingerprint = ?", (uc.name, fp)).fetchone()
            if row is None:
                continue  # read-only and never collected
            rows[ref] = UseCaseRow.of(int(row[0]), uc)
        return rows

    def _adopt_or_insert(self, uc: UseCase) -> None:
        """Make the definition's row; a row the previous release keyed by the mechanism's
        fingerprint (schema 2) becomes this definition's, with its aggregates and report ids."""
        db = self._db
        fp = use_case_fingerprint(uc)
        if db.execute("SELECT 1 FROM use_cases WHERE name = ? AND fingerprint = ?", (uc.name, fp)).fetchone():
            return
        legacy = db.execute(
            "SELECT id FROM use_cases WHERE name = ? AND fingerprint = ?", (uc.name, legacy_fingerprint(uc))
        ).fetchone()
        if legacy is not None:
            db.execute("UPDATE use_cases SET fingerprint = ? WHERE id = ?", (fp, legacy[0]))
            self._put_digest(f"digest:use_cases:{legacy[0]}", self._use_case_digest(legacy[0]))
            return
        cur = db.execute(
            "INSERT INTO use_cases (name, fingerprint, mechanism, period_seconds) VALUES (?, ?, ?, ?)",
            (uc.name, fp, uc.mechanism.name, uc.period.seconds),
        )
        if cur.lastrowid is not None:
            self._put_digest(f"digest:use_cases:{cur.lastrowid}", self._use_case_digest(cur.lastrowid))

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

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

    # -- integrity ---------------------------------------------------------------------

    @property
    def marker(self) -> Path:
        """The file next to the database that remembers it was created (``<file>.id``)."""
        return self.path.with_name(self.path.name + ".id")

    def _damaged(self, what: str) -> StoreError:
        return StoreError(
            f"{self.path} is damaged: {what}. Stop every collector using it and restore it from a "
            f"backup; or move it (and {self.marker.name}) aside to start an empty store, losing "
            "what it counted and the memory of folded report ids"
        )

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

    def _use_case_digest(self, uc: int) -> bytes:
        row = self._db.execute(
            "SELECT id, name, fingerprint, mechanism, period_seconds, low_water FROM use_cases WHERE id = ?", (uc,)
        ).fetchone()
        return digest("use_cases", *row) if row is not None else b""

    def _counters_digest(self, instance: str) -> bytes:
        rows = self._db.execute(
            "SELECT name, value FROM counters WHERE instance = ? ORDER BY name", (instance,)
        ).fetchall()
        return digest("counters", instance, rows)

    def _put_digest(self, key: str, digest: bytes) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, digest),
        )

    def _check_structure(self) -> None:
        """SQLite's ``integrity_check``: pages, b-trees, and every index against its table.

        ``quick_check`` is cheaper but does not compare indexes with their tables, and a bit
        flipped in an index entry then reads as a silently missing segment or use case (the
        index on ``use_cases (name, fingerprint)`` finds nothing, a fresh row is made, and a
        use case's whole history reads as zero). Its cost grows with the database (mostly the
        report ids); it runs once, at start.
        """
        problems = [str(r[0]) for r in self._db.execute("PRAGMA integrity_check(20)")]
        if problems != ["ok"]:
            raise self._damaged("PRAGMA integrity_check: " + "; ".join(problems[:3]))

    def verify(self) -> None:
        """Check every checksum (``integrity_check`` has run at open).

        Raises:
            StoreError: naming the file, the table and the row at fault, and what to do.
        """
        db = self._db
        db.execute("BEGIN")
        try:
            digests = {str(k): v for k, v in db.execute("SELECT key, value FROM meta WHERE key LIKE 'digest:%'")}
            for (uc,) in db.execute("SELECT id FROM use_cases").fetchall():
                if digests.pop(f"digest:use_cases:{uc}", None) != self._use_case_digest(uc):
                    raise self._damaged(f"table use_cases, id {uc}: the checksum does not match the row")
            for (instance,) in db.execute("SELECT DISTINCT instance FROM counters").fetchall():
                if digests.pop(f"digest:counters:{instance}", None) != self._counters_digest(instance):
                    raise self._damaged(f"table counters, instance {instance!r}: the checksum does not match")
            if digests:
                raise self._damaged(f"table meta: checksums of rows that do not exist ({', '.join(sorted(digests))})")
            # Readers fold the segments up to the last sequence number (last_seq): one below the
            # newest segment would silently leave segments out.
            newest, last = db.execute(
                "SELECT (SELECT max(seq) FROM segments), (SELECT seq FROM sqlite_sequence WHERE name = 'segments')"
            ).fetchone()
            if newest is not None and (type(last) is not int or last < newest):
                raise self._damaged(f"table sqlite_sequence: segments go up to {newest}, the sequence says {last!r}")
            for uc, period, reports, records, data in db.execute(
                "SELECT uc, period, reports, records, data FROM aggregates"
            ):
                self._open("aggregates", (uc, period, "", reports, records), data)
            for uc, period, kind, reports, records, data in db.execute(
                "SELECT uc, period, kind, reports, records, data FROM segments"
            ):
                self._open("segments", (uc, period, kind, reports, records), data)
            for rid, uc, period in db.execute("SELECT rid, uc, period FROM seen"):
                if (
                    not isinstance(rid, bytes)
                    or len(rid) != RID_BYTES + TAG_BYTES
                    or rid_tag(rid[:RID_BYTES], uc, period) != rid
                ):
                    raise self._damaged(f"table seen: report id {rid!r} does not match its tag")
        except (TypeError, ValueError, OverflowError, AttributeError, msgpack.UnpackException) as exc:
            raise self._damaged(f"a row has a value of the wrong type ({exc})") from exc
        finally:
            _end(db)

    # -- commit ------------------------------------------------------------------------

    def commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None = None
    ) -> CommitResult:
        """Fold ``reports`` (already shuffled) and add ``counters``, in one transaction.

        Reports whose id is already in the database (or repeated within ``reports``) are not
        folded; they are counted in ``duplicates``. ``senders`` (parallel to ``reports``; empty
        bytes for none) are the device identities the reports arrived under: a report beyond
        its device's :func:`report_allowance` is not folded and is counted in
        ``over_allowance``. Identities are used here and never stored.
        """
        with self._failures():
            return self._commit(reports, counters, senders)

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

    def _commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None
    ) -> CommitResult:
        self.check_file()
        start = time.perf_counter()
        db = self._db
        sender_of: dict[bytes, bytes] = {}
        if senders is not None:
            if len(senders) != len(reports):
                raise ValueError(f"{len(senders)} senders for {len(reports)} reports")
            for r, sender in zip(reports, senders, strict=True):
                if sender:
                    sender_of.setdefault(r.report_id, sender)
        db.execute("BEGIN IMMEDIATE")
        try:
            lows = dict(db.execute("SELECT id, low_water FROM use_cases").fetchall())
            current = [r for r in reports if r.period >= lows[self._use_cases[r.use_case.ref].id]]
            expired = len(reports) - len(current)
            expired_ids = (
                frozenset(r.report_id for r in reports if r.period < lows[self._use_cases[r.use_case.ref].id])
                if expired
                else frozenset()
            )
            fresh = self._fresh(current)
            over = 0
            over_ids: frozenset[bytes] = frozenset()
            if sender_of:
                before = fresh
                fresh, over = self._within_allowance(fresh, sender_of)
                if over:
                    kept = {r.report_id for r in fresh}
                    over_ids = frozenset(r.report_id for r in before if r.report_id not in kept)
            groups = group_by_key(fresh)
            records = 0
            for (name, period), members in groups.items():
                row = self._use_cases[name]
                kind, blob, count = make_segment(row, members)
                records += count
                db.execute(
                    "INSERT INTO segments (uc, period, kind, reports, records, data) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        row.id,
                        period,
                        kind,
                        len(members),
                        count,
                        seal("segments", (row.id, period, kind, len(members), count), blob),
                    ),
                )
            db.executemany(
                "INSERT INTO seen (rid, uc, period) VALUES (?, ?, ?)",
                [(self._tagged(r), self._use_cases[r.use_case.ref].id, r.period) for r in fresh],
            )
            duplicates = len(current) - len(fresh) - over
            all_counters = total_counters(
                counters, fresh=len(fresh), records=records, expired=expired, duplicates=duplicates, over=over
            )
            db.executemany(
                "INSERT INTO counters (instance, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (instance, name) DO UPDATE SET value = value + excluded.value",
                [(self.instance, k, v) for k, v in all_counters.items() if v],
            )
            self._put_digest(f"digest:counters:{self.instance}", self._counters_digest(self.instance))
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return CommitResult(
            len(fresh),
            records,
            duplicates,
            expired,
            time.perf_counter() - start,
            tuple(groups),
            over,
            expired_ids,
            over_ids,
        )

    def _within_allowance(
        self, fresh: Sequence[FoldedReport], sender_of: Mapping[bytes, bytes]
    ) -> tuple[list[FoldedReport], int]:
        """The reports within their device's allowance, and how many were beyond it (inside the transaction)."""
        db = self._db
        keys: dict[tuple[int, int], bytes] = {}
        counts: dict[tuple[int, int, bytes], int] = {}
        touched: set[tuple[int, int, bytes]] = set()
        kept: list[FoldedReport] = []
        over = 0
        for r in fresh:
            sender = sender_of.get(r.report_id)
            if sender is None:
                kept.append(r)
                continue
            uc = self._use_cases[r.use_case.ref].id
            key = keys.get((uc, r.period))
            if key is None:
                # One random key per (use case, period), drawn when the period's first identified
                # report arrives and deleted with the period (prune): the tags are unlinkable across
                # periods, and once the key is gone, to anyone.
                db.execute(
                    "INSERT OR IGNORE INTO allowance_keys (uc, period, key) VALUES (?, ?, ?)",
                    (uc, r.period, secrets.token_bytes(32)),
                )
                row = db.execute("SELECT key FROM allowance_keys WHERE uc = ? AND period = ?", (uc, r.period))
                key = keys[(uc, r.period)] = bytes(row.fetchone()[0])
            tag = allowance_tag(sender, key)
            slot = (uc, r.period, tag)
            used = counts.get(slot)
            if used is None:
                found = db.execute(
                    "SELECT reports FROM allowance WHERE uc = ? AND period = ? AND tag = ?", slot
                ).fetchone()
                used = 0 if found is None else int(found[0])
            if used >= report_allowance(r.use_case):
                counts[slot] = used
                over += 1
                continue
            counts[slot] = used + 1
            touched.add(slot)
            kept.append(r)
        db.executemany(
            "INSERT INTO allowance (uc, period, tag, reports) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uc, period, tag) DO UPDATE SET reports = excluded.reports",
            [(*slot, counts[slot]) for slot in touched],
        )
        return kept, over

    def _tagged(self, report: FoldedReport) -> bytes:
        return rid_tag(report.report_id, self._use_cases[report.use_case.ref].id, report.period)

    def _fresh(self, reports: Sequence[FoldedReport]) -> list[FoldedReport]:
        ids = [self._tagged(r) for r in reports]
        known: set[bytes] = set()
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i : i + _IN_CHUNK]
            q = f"SELECT rid FROM seen WHERE rid IN ({','.join('?' * len(chunk))})"
            known.update(row[0] for row in self._db.execute(q, chunk))
        fresh = []
        for r, rid in zip(reports, ids, strict=True):
            if rid in known:
                continue
            known.add(rid)
            fresh.append(r)
        return fresh

    # -- reading -----------------------------------------------------------------------

    def _base(self, row: UseCaseRow, period: int) -> tuple[Aggregate, int, int]:
        """The key's base aggregate with its report and record totals (empty and zeros if none).

        Runs inside the caller's transaction, so the base and the segments folded onto it
        are one snapshot.

        Raises:
            StoreError: the stored base cannot be restored (the database is damaged).
        """
        base = self._db.execute(
            "SELECT reports, records, data FROM aggregates WHERE uc = ? AND period = ?", (row.id, period)
        ).fetchone()
        if base is None:
            return row.use_case.server.new_aggregate(), 0, 0
        plain = self._open("aggregates", (row.id, period, "", base[0], base[1]), base[2])
        try:
            agg = row.use_case.server.restore_aggregate(plain)
        except StateError as exc:
            raise StoreError(f"{self.path}: the {row.use_case.name} base aggregate is damaged ({exc})") from exc
        return agg, int(base[0]), int(base[1])

    def aggregate_at(self, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """:meth:`aggregate`, with the sequence number it is current to (for :meth:`catch_up`).

        Raises:
            KeyError: no accepted definition has this ref.
        """
        row = self._stored_row(use_case)
        if row is None:
            return self._empty_at(use_case, period)
        db = self._db
        db.execute("BEGIN")  # one snapshot for base and segments
        try:
            seq = self.last_seq()
            agg, reports, records = self._base(row, period)
            segments = db.execute(
                "SELECT kind, reports, records, data FROM segments WHERE uc = ? AND period = ? AND seq <= ? "
                "ORDER BY seq",
                (row.id, period, seq),
            )
            agg, reports, records = self._fold_segments(row, period, (agg, reports, records), segments)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(f"SQLite reports: {exc}") from exc
        finally:
            _end(db)
        return agg, KeyInfo(use_case, period, reports, records), seq

    def catch_up(self, aggregate: Aggregate, info: KeyInfo, seq: int) -> tuple[Aggregate, KeyInfo, int] | None:
        """Fold into ``aggregate`` (current to ``seq``) the segments committed since.

        Only the new segments are read, so keeping an aggregate current costs what was added,
        not the whole key. ``aggregate`` may be changed in place; the caller keeps the returned
        one. Any collector sharing the database may have committed them.

        Returns:
            The aggregate, its totals and the new sequence number; None when a compaction has
            folded segments after ``seq`` into the base, so the key must be read afresh with
            :meth:`aggregate_at` (rare: a compaction rewrites the base at most about once per
            quarter of its size).

        Raises:
            KeyError: no accepted definition has this ref.
        """
        row = self._stored_row(info.use_case)
        if row is None:
            return (aggregate, info, self.last_seq()) if info.reports == 0 else None
        db = self._db
        db.execute("BEGIN")
        try:
            last = self.last_seq()
            if last == seq:
                return aggregate, info, seq
            # Every report is in exactly one place (the base or one segment), so the reports
            # in the base and in the segments up to ``seq`` add up to what the caller holds
            # unless a compaction moved later segments into the base.
            held = db.execute(
                "SELECT coalesce((SELECT reports FROM aggregates WHERE uc = ?1 AND period = ?2), 0) + "
                "coalesce((SELECT sum(reports) FROM segments WHERE uc = ?1 AND period = ?2 AND seq <= ?3), 0)",
                (row.id, info.period, seq),
            ).fetchone()[0]
            if int(held) != info.reports:
                return None
            segments = db.execute(
                "SELECT kind, reports, records, data FROM segments WHERE uc = ? AND period = ? AND seq > ? "
                "AND seq <= ? ORDER BY seq",
                (row.id, info.period, seq, last),
            )
            aggregate, reports, records = self._fold_segments(
                row, info.period, (aggregate, info.reports, info.records), segments
            )
        except sqlite3.DatabaseError as exc:
            raise self._damaged(f"SQLite reports: {exc}") from exc
        finally:
            _end(db)
        return aggregate, KeyInfo(info.use_case, info.period, reports, records), last

    def last_seq(self) -> int:
        """The sequence number of the latest segment ever committed (0 before the first)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'segments'").fetchone()
        return int(row[0]) if row else 0

    def totals(self, use_case: str | None = None) -> list[KeyInfo]:
        """Every (use case, period) with data, with its report and record totals, oldest first."""
        ids = {row.id: name for name, row in self._use_cases.items() if use_case is None or name == use_case}
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        query = (
            f"SELECT uc, period, reports, records FROM aggregates WHERE uc IN ({marks}) "
            f"UNION ALL SELECT uc, period, sum(reports), sum(records) FROM segments WHERE uc IN ({marks}) "
            "GROUP BY uc, period"
        )
        return self._add_totals(self._db.execute(query, [*ids, *ids]), ids)

    def counters(self, instance: str | None = None) -> dict[str, int]:
        """Persisted ingest counters (of one instance, or summed over all)."""
        if instance is None:
            rows = self._db.execute("SELECT name, sum(value) FROM counters GROUP BY name")
        else:
            rows = self._db.execute("SELECT name, value FROM counters WHERE instance = ?", (instance,))
        return {str(name): int(value) for name, value in rows}

    def instances(self) -> list[str]:
        """Names of the collectors that have committed to this database."""
        return [str(row[0]) for row in self._db.execute("SELECT DISTINCT instance FROM counters ORDER BY instance")]

    def data_version(self) -> tuple[int, int]:
        """A pair that changes whenever committed data changes (for caching estimates)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'segments'").fetchone()
        compactions = self._db.execute("SELECT value FROM meta WHERE key = 'compactions'").fetchone()
        return (int(row[0]) if row else 0, int(compactions[0]) if compactions else 0)

    def seen_count(self) -> int:
        """Report ids currently remembered."""
        return int(self._db.execute("SELECT count(*) FROM seen").fetchone()[0])

    # -- maintenance -------------------------------------------------------------------

    def low_water(self) -> dict[str, int]:
        """The lowest period still accepted, per use case (0 if never set)."""
        out = {}
        for name, row in self._use_cases.items():
            r = self._db.execute("SELECT low_water FROM use_cases WHERE id = ?", (row.id,)).fetchone()
            out[name] = int(r[0])
        return out

    def prune(self, low_water: Mapping[str, int]) -> int:
        """Raise low-water marks (never lower them) and forget report ids below them.

        Returns:
            The number of report ids forgotten.
        """
        with self._failures():
            return self._prune(low_water)

    def _prune(self, low_water: Mapping[str, int]) -> int:
        self.check_file()
        removed = forgotten = 0
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for name, mark in low_water.items():
                row = self._use_cases.get(name)
                if row is None:
                    continue
                db.execute("UPDATE use_cases SET low_water = max(low_water, ?) WHERE id = ?", (mark, row.id))
                self._put_digest(f"digest:use_cases:{row.id}", self._use_case_digest(row.id))
                cur = db.execute(
                    "DELETE FROM seen WHERE uc = ? AND period < (SELECT low_water FROM use_cases WHERE id = ?)",
                    (row.id, row.id),
                )
                removed += cur.rowcount
                # The period is closed to reports: its allowance key and tags go (zeroed in place,
                # secure_delete), and with the key any link from a tag to a device.
                for table in ("allowance", "allowance_keys"):
                    cur = db.execute(
                        f"DELETE FROM {table} WHERE uc = ? AND period < (SELECT low_water FROM use_cases WHERE id = ?)",
                        (row.id, row.id),
                    )
                    forgotten += cur.rowcount
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        if forgotten:
            # The WAL still holds earlier images of those pages: copy the zeroed pages into the
            # database and empty the log. Best effort: a reader that is open keeps the log,
            # and the next prune tries again.
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return removed

    def compaction_candidates(self, compact_after: int) -> list[tuple[str, int]]:
        """Keys whose segments should be folded into their base now."""
        rows = self._db.execute(
            "SELECT s.uc, s.period, s.n, s.size, coalesce(length(a.data), 0) FROM "
            "(SELECT uc, period, count(*) AS n, sum(length(data)) AS size FROM segments "
            "GROUP BY uc, period) s LEFT JOIN aggregates a ON a.uc = s.uc AND a.period = s.period"
        ).fetchall()
        return self._worth_compacting(rows, compact_after, self.low_water())

    def compact(self, use_case: str, period: int) -> int:
        """Fold the key's segments into its base, in one transaction; return segments folded."""
        with self._failures():
            return self._compact(use_case, period)

    def _compact(self, use_case: str, period: int) -> int:
        self.check_file()
        row = self._use_cases[use_case]
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            agg, reports, records = self._base(row, period)
            segs = db.execute(
                "SELECT seq, kind, reports, records, data FROM segments WHERE uc = ? AND period = ? ORDER BY seq",
                (row.id, period),
            ).fetchall()
            if not segs:
                _rollback(db)
                return 0
            agg, reports, records = self._fold_segments(row, period, (agg, reports, records), (s[1:] for s in segs))
            sealed = seal("aggregates", (row.id, period, "", reports, records), pack(agg.to_plain()))
            db.execute(
                "INSERT INTO aggregates (uc, period, reports, records, data) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (uc, period) DO UPDATE SET reports = excluded.reports, records = excluded.records, "
                "data = excluded.data",
                (row.id, period, reports, records, sealed),
            )
            db.execute(
                "DELETE FROM segments WHERE uc = ? AND period = ? AND seq <= ?", (row.id, period, int(segs[-1][0]))
            )
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('compactions', 1) "
                "ON CONFLICT (key) DO UPDATE SET value = value + 1"
            )
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return len(segs)

    def use_case_names(self) -> Iterable[str]:
        """Refs of the accepted definitions that have a row in this database."""
        return self._use_cases.keys()
