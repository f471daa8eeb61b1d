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

Aggregates are keyed by the use case's name *and* its definition hash (schema 3): each
definition a report can be made under (``protocol.catalog``) folds into aggregates of its own,
never mixed with another's, and every definition the collector is given stays readable.

Opening the file, the schema versions and their migration (``ldp-collector migrate``), the
use-case rows and the integrity checks (checksums, ``integrity_check``, the ``<file>.id``
marker) are in :mod:`collector.store.sqlite_setup`.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Mapping, Sequence

from collector.store.admission import (
    Claims,
    Slot,
    Verdict,
    claim_allowance,
    senders_by_report,
    within_room,
)
from collector.store.integrity import counters_key
from collector.store.interface import CommitResult, FoldedReport, KeyInfo
from collector.store.row_format import UseCaseRow, group_by_key, rid_tag, segment_rows
from collector.store.sqlite_setup import SCHEMA_VERSION, SQLiteSetup, end_read, rollback
from protocol.server.contract import Aggregate

__all__ = ["SCHEMA_VERSION", "CheckpointStore"]

_IN_CHUNK = 500  # SQLite host parameters per "IN (...)" query

_UPSERT_ROWS = 500  # allowance slots per multi-row upsert (4 host parameters each)

_SeenRow = tuple[int, int, bytes]
"""A remembered report id: use case id, period, the id with its tag (row_format.rid_tag)."""


class CheckpointStore(SQLiteSetup):
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

    def _commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None
    ) -> CommitResult:
        self.check_file()
        start = time.perf_counter()
        db = self._db
        sender_of = senders_by_report(reports, senders)
        uc_of = {name: row.id for name, row in self._use_cases.items()}
        db.execute("BEGIN IMMEDIATE")
        try:
            verdict = Verdict.of(reports, dict(db.execute("SELECT id, low_water FROM use_cases").fetchall()), uc_of)
            fresh, rows = self._remember(verdict.current, uc_of)
            verdict.fresh = fresh
            if sender_of:
                refused = verdict.refuse_over(*self._within_allowance(fresh, sender_of, uc_of))
                if refused:
                    # A report over the allowance is not remembered: a copy sent again is judged again.
                    ids = {r.report_id for r in refused}
                    db.executemany(
                        "DELETE FROM seen WHERE uc = ? AND period = ? AND rid = ?",
                        [row for row, r in zip(rows, fresh, strict=True) if r.report_id in ids],
                    )
            groups = group_by_key(verdict.fresh)
            segments, records = segment_rows(self._use_cases, groups)
            db.executemany(
                "INSERT INTO segments (uc, period, kind, reports, records, data) VALUES (?, ?, ?, ?, ?, ?)", segments
            )
            db.executemany(
                "INSERT INTO counters (instance, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (instance, name) DO UPDATE SET value = value + excluded.value",
                [(self.instance, k, v) for k, v in verdict.counters(counters, records).items() if v],
            )
            self._put_digest(counters_key(self.instance), self._counters_digest(self.instance))
            db.execute("COMMIT")
        except BaseException:
            rollback(db)
            raise
        return verdict.result(records, start, list(groups))

    def _within_allowance(
        self, fresh: Sequence[FoldedReport], sender_of: Mapping[bytes, bytes], uc_of: Mapping[str, int]
    ) -> tuple[list[FoldedReport], int]:
        """The reports within their device's allowance, and how many were beyond it (inside the transaction)."""
        db = self._db
        keys: dict[tuple[int, int], bytes] = {}

        def key_of(uc: int, period: int) -> bytes:
            key = keys.get((uc, period))
            if key is None:
                # One random key per (use case, period), drawn when the period's first identified
                # report arrives and deleted with the period (prune): the tags are unlinkable across
                # periods, and once the key is gone, to anyone.
                db.execute(
                    "INSERT OR IGNORE INTO allowance_keys (uc, period, key) VALUES (?, ?, ?)",
                    (uc, period, secrets.token_bytes(32)),
                )
                row = db.execute("SELECT key FROM allowance_keys WHERE uc = ? AND period = ?", (uc, period))
                key = keys[(uc, period)] = bytes(row.fetchone()[0])
            return key

        claims = claim_allowance(fresh, sender_of, uc_of, key_of)
        room = self._take_room(claims)
        return within_room(fresh, claims.slots, room)

    def _take_room(self, claims: Claims) -> dict[Slot, int]:
        """How many of each slot's claims still fit its allowance; count them as used (inside the transaction).

        An upsert adds the claims of up to :data:`_UPSERT_ROWS` slots and returns their new
        counts: a slot is usually new or far from its cap, reading it first would walk the same
        B-tree twice, and one statement per slot cost a step, a bind and a reset each. The rare
        slot that went past its cap is set back to what fits.
        """
        db = self._db
        want = claims.want
        slots = list(want)
        totals: dict[Slot, int] = {}
        for i in range(0, len(slots), _UPSERT_ROWS):
            chunk = slots[i : i + _UPSERT_ROWS]
            values = ",".join(("(?, ?, ?, ?)",) * len(chunk))
            rows = db.execute(
                f"INSERT INTO allowance (uc, period, tag, reports) VALUES {values} ON CONFLICT (uc, period, tag) "
                "DO UPDATE SET reports = reports + excluded.reports RETURNING uc, period, tag, reports",
                [v for slot in chunk for v in (*slot, want[slot])],
            ).fetchall()
            totals.update(((uc, period, bytes(tag)), int(total)) for uc, period, tag, total in rows)
        room: dict[Slot, int] = {}
        for slot, n in want.items():
            used = totals[slot] - n
            room[slot] = min(n, max(0, claims.cap[slot] - used))
            if room[slot] < n:
                if used + room[slot]:
                    db.execute(
                        "UPDATE allowance SET reports = ? WHERE uc = ? AND period = ? AND tag = ?",
                        (used + room[slot], *slot),
                    )
                else:
                    db.execute("DELETE FROM allowance WHERE uc = ? AND period = ? AND tag = ?", slot)
        return room

    def _remember(
        self, reports: Sequence[FoldedReport], uc_of: Mapping[str, int]
    ) -> tuple[list[FoldedReport], list[_SeenRow]]:
        """The reports whose id the store did not hold (the first of repeats within ``reports``),
        and their ``seen`` rows, now stored (inside the transaction).

        Usually none is held, and one ``INSERT OR IGNORE`` per id both checks and stores it: a
        lookup first would walk the same B-tree twice. When the insert count shows that some
        were held (a redelivery), the inserts are undone and the held ones looked up.
        """
        db = self._db
        fresh: list[FoldedReport] = []
        rows: list[_SeenRow] = []
        repeated: set[_SeenRow] = set()
        for r in reports:
            uc = uc_of[r.use_case.ref]
            row = (uc, r.period, rid_tag(r.report_id, uc, r.period))
            if row not in repeated:
                repeated.add(row)
                fresh.append(r)
                rows.append(row)
        db.execute("SAVEPOINT remember")
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO seen (uc, period, rid) VALUES (?, ?, ?)", rows)
        if db.total_changes - before == len(rows):
            db.execute("RELEASE remember")
            return fresh, rows
        db.execute("ROLLBACK TO remember")
        db.execute("RELEASE remember")
        held = self._held(rows)
        kept = [i for i, row in enumerate(rows) if row not in held]
        fresh, rows = [fresh[i] for i in kept], [rows[i] for i in kept]
        db.executemany("INSERT INTO seen (uc, period, rid) VALUES (?, ?, ?)", rows)
        return fresh, rows

    def _held(self, rows: Sequence[_SeenRow]) -> set[_SeenRow]:
        """Those of ``rows`` that ``seen`` holds, looked up by (use case, period)."""
        by_key: dict[tuple[int, int], list[bytes]] = {}
        for uc, period, rid in rows:
            by_key.setdefault((uc, period), []).append(rid)
        held: set[_SeenRow] = set()
        for (uc, period), rids in by_key.items():
            for i in range(0, len(rids), _IN_CHUNK):
                chunk = rids[i : i + _IN_CHUNK]
                q = f"SELECT rid FROM seen WHERE uc = ? AND period = ? AND rid IN ({','.join('?' * len(chunk))})"
                held.update((uc, period, bytes(rid)) for (rid,) in self._db.execute(q, (uc, period, *chunk)))
        return held

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
        return self._restored_base(row, period, base)

    def _read_at(self, row: UseCaseRow, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """The base and the segments up to the latest sequence number, in one read transaction."""
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
            end_read(db)
        return agg, KeyInfo(use_case, period, reports, records), seq

    def _catch_up_from(
        self, row: UseCaseRow, aggregate: Aggregate, info: KeyInfo, seq: int
    ) -> tuple[Aggregate, KeyInfo, int] | None:
        """The segments after ``seq``, in one read transaction, unless a compaction moved some into the base."""
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
            end_read(db)
        return aggregate, KeyInfo(info.use_case, info.period, reports, records), last

    def last_seq(self) -> int:
        """The sequence number of the latest segment ever committed (0 before the first)."""
        with self._reading():
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
        with self._reading():
            return self._add_totals(self._db.execute(query, [*ids, *ids]), ids)

    def counters(self, instance: str | None = None) -> dict[str, int]:
        """Persisted ingest counters (of one instance, or summed over all)."""
        with self._reading():
            if instance is None:
                rows = self._db.execute("SELECT name, sum(value) FROM counters GROUP BY name")
            else:
                rows = self._db.execute("SELECT name, value FROM counters WHERE instance = ?", (instance,))
            return {str(name): int(value) for name, value in rows}

    def instances(self) -> list[str]:
        """Names of the collectors that have committed to this database."""
        with self._reading():
            rows = self._db.execute("SELECT DISTINCT instance FROM counters ORDER BY instance").fetchall()
        return [str(row[0]) for row in rows]

    def data_version(self) -> tuple[int, int]:
        """A pair that changes whenever committed data changes (for caching estimates)."""
        with self._reading():
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'segments'").fetchone()
            compactions = self._db.execute("SELECT value FROM meta WHERE key = 'compactions'").fetchone()
        return (int(row[0]) if row else 0, int(compactions[0]) if compactions else 0)

    def seen_count(self) -> int:
        """Report ids currently remembered."""
        with self._reading():
            return int(self._db.execute("SELECT count(*) FROM seen").fetchone()[0])

    # -- maintenance -------------------------------------------------------------------

    def low_water(self) -> dict[str, int]:
        """The lowest period still accepted, per use case (0 if never set)."""
        out = {}
        with self._reading():
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
                self._reseal_use_case(row.id)
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
            rollback(db)
            raise
        if forgotten:
            # The WAL still holds earlier images of those pages: copy the zeroed pages into the
            # database and empty the log. Best effort: a reader that is open keeps the log,
            # and the next prune tries again.
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return removed

    def compaction_candidates(self, compact_after: int) -> list[tuple[str, int]]:
        """Keys whose segments should be folded into their base now."""
        with self._reading():
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
                rollback(db)
                return 0
            sealed, reports, records = self._compacted(row, period, (agg, reports, records), (s[1:] for s in segs))
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
            rollback(db)
            raise
        return len(segs)
