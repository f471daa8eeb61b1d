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
from collector.store.keyset import Key
from collector.store.row_format import UseCaseRow, group_by_key, segment_rows
from collector.store.sqlite_ids import by_key
from collector.store.sqlite_setup import SCHEMA_VERSION, SQLiteSetup, end_read, rollback
from protocol.server.contract import Aggregate

__all__ = ["SCHEMA_VERSION", "CheckpointStore"]


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
        ids_in_memory: report ids and allowance tags of recent commits held in memory before
            the least recently written are settled (collector/store/sqlite_ids.py).
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
            self._ids.sync()
            verdict = Verdict.of(reports, dict(db.execute("SELECT id, low_water FROM use_cases").fetchall()), uc_of)
            verdict.fresh = self._unheld(verdict.current, uc_of)
            tags: dict[Key, list[bytes]] = {}
            new_tags: set[Key] = set()
            if sender_of:
                # A report over the allowance is not remembered: a copy sent again is judged again.
                kept, over, tags, new_tags = self._within_allowance(verdict.fresh, sender_of, uc_of)
                verdict.refuse_over(kept, over)
            ids = by_key(((uc_of[r.use_case.ref], r.period), r.report_id) for r in verdict.fresh)
            written = self._ids.append(ids, tags, new_tags)
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
        self._ids.committed(written)
        return verdict.result(records, start, list(groups))

    def _unheld(self, reports: Sequence[FoldedReport], uc_of: Mapping[str, int]) -> list[FoldedReport]:
        """The reports whose id the store does not hold (the first of repeats within ``reports``), in
        order within each (use case, period)."""
        groups: dict[Key, list[FoldedReport]] = {}
        for r in reports:
            key = (uc_of[r.use_case.ref], r.period)
            members = groups.get(key)
            if members is None:
                members = groups[key] = []
            members.append(r)
        fresh: list[FoldedReport] = []
        for key, group in groups.items():
            members, rids = group, [r.report_id for r in group]
            if len(set(rids)) < len(rids):  # a repeat within the commit: its first copy stands for it
                firsts: dict[bytes, FoldedReport] = {}
                for r in group:
                    firsts.setdefault(r.report_id, r)
                members, rids = list(firsts.values()), list(firsts)
            held = self._ids.held(key, rids)
            if any(held):
                fresh.extend(r for r, h in zip(members, held, strict=True) if not h)
            else:
                fresh.extend(members)
        return fresh

    def _within_allowance(
        self, fresh: Sequence[FoldedReport], sender_of: Mapping[bytes, bytes], uc_of: Mapping[str, int]
    ) -> tuple[list[FoldedReport], int, dict[Key, list[bytes]], set[Key]]:
        """The reports within their device's allowance, how many were beyond it, the tags to count
        for the kept ones by (use case, period), and the keys whose tags are all new and single
        (inside the transaction)."""
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
        room, tags, new = self._room(claims)
        kept, over = within_room(fresh, claims.slots, room)
        return kept, over, tags, new

    def _room(self, claims: Claims) -> tuple[dict[Slot, int], dict[Key, list[bytes]], set[Key]]:
        """How many of each slot's claims still fit its allowance, the tags that count them (each
        once per report it admits), and the keys whose slots were all unused and claimed once."""
        want, cap = claims.want, claims.cap
        slots: dict[Key, list[Slot]] = {}
        for slot in want:
            key = (slot[0], slot[1])
            members = slots.get(key)
            if members is None:
                members = slots[key] = []
            members.append(slot)
        room: dict[Slot, int] = {}
        tags: dict[Key, list[bytes]] = {}
        new: set[Key] = set()
        for key, members in slots.items():
            used = self._ids.used(key, [slot[2] for slot in members])
            if not any(used) and all(want[slot] == 1 <= cap[slot] for slot in members):
                # The usual commit: each device's first report for the key, one each.
                room.update(dict.fromkeys(members, 1))
                tags[key] = [slot[2] for slot in members]
                new.add(key)
                continue
            counted = tags[key] = []
            for slot, n in zip(members, used, strict=True):
                fits = room[slot] = min(want[slot], max(0, cap[slot] - n))
                counted.extend([slot[2]] * fits)
        return room, tags, new

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
            return self._ids.count()

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
                removed += cur.rowcount + self._ids.forget_below(row.id)
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
        self._ids.forgotten({int(uc): int(mark) for uc, mark in db.execute("SELECT id, low_water FROM use_cases")})
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
            self._write_compacted(db, row, period, (agg, reports, records), (s[1:] for s in segs))
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
