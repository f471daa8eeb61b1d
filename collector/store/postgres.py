"""The PostgreSQL backend of the checkpoint store: one database, any number of collectors.

Several collectors in an MQTT shared-subscription group (``[mqtt] shared_group``, each with
its own ``instance`` and ``client_id``) fold into one database. Aggregates are sums, so the
members' contributions merge exactly; what must stay atomic across the group is "fold +
remember the report id", and a message is acknowledged only after that transaction commits.

**One commit is one transaction** (READ COMMITTED), in this order, which is also the order in
which every writer takes its locks (so no two writers wait on each other in a cycle):

1. ``use_cases`` rows of the batch ``FOR SHARE``: the low-water marks, held so that a
   concurrent prune cannot move a mark (and drop the period's partitions) under the commit;
   this instance's ``counters`` rows ``FOR UPDATE``.
2. ``INSERT INTO seen ... ON CONFLICT DO NOTHING RETURNING rid`` of every report id: the ids
   returned are the fresh ones. A report redelivered to another member after a crash (or
   sent twice and taken by two members at once) conflicts on the primary key: the second
   inserter waits for the first to commit or roll back, so each id is folded exactly once
   group-wide, never by two members, and never lost if the first aborts.
3. For reports that came under a device identity: the period's random key (inserted if
   missing, then read, so racing members agree on one), and one additive upsert per keyed
   tag capped at :func:`~collector.store.interface.report_allowance`, whose ``added`` column
   says how many of this commit's reports the tag still had room for (the row lock makes
   racing members take turns). Report ids refused as over the allowance are taken out of
   ``seen`` again, as the SQLite backend never puts them there.
4. The counters (with their checksum), then - last, in the same pipeline as ``COMMIT`` -
   the segments, stamped with a **commit-ordered version** (below).

**Layout for concurrency: append-only segments.** Each commit inserts one new row per
(use case, period) it touched (a partial aggregate or its shuffled records, as in SQLite);
no member ever updates a row another member writes, so commits do not contend on hot rows.
Compaction later folds a key's segments into its base (under an advisory lock per key, so
two members never compact the same key at once), and a reader folds base + segments. The
alternative, an additive upsert of one aggregate row per key, reads, unpacks, merges and
rewrites the key's aggregate inside every transaction and holds its row lock until the
commit is durable. For a large aggregate that is not an option at all (a Count Mean Sketch
of 256 MiB rewritten per commit), and the live view could no longer fold only what was
added. For a small one it costs no more: the commit rates of the two overlap from run to run
(``benchmarks/bench_store.py``; docs/benchmarks.md, "The PostgreSQL store's layout", has the
figures, SQLite's in the same runs and the collector's CPU end to end): at ingest's commit
rate (a few commits a second per member) a row lock held for a millisecond is not where the
time goes. So the segments stay for the one reason that holds for every mechanism: a commit
and a catch-up cost what was added, never the size of the aggregate.

**Coherence of the live view across members.** A ``bigserial`` is not commit-ordered: a
transaction holding sequence 99 may commit after another holding 100 has been read, and a
reader that then asks "what is after 100?" would miss 99 forever. So the version a segment
carries is taken at the very end of its transaction from the one-row ``clock`` table
(``UPDATE clock SET version = version + 1 RETURNING version``, in the same statement as the
segment insert, pipelined with ``COMMIT``): the row lock is held only for that statement
and the commit, and a transaction can take version v + 1 only after the holder of v has
committed. Hence whoever reads ``clock.version = V`` can see every segment of version
<= V, and :meth:`PostgresStore.catch_up` from ``seq`` reads exactly the segments with
``seq < version <= V`` - whichever member committed them. Reads run in one REPEATABLE READ
snapshot, so a base and the segments folded onto it are consistent with a concurrent
compaction (which moves segments into the base in one transaction; ``catch_up`` detects it
as in SQLite, by the report totals, and asks for a fresh read). A member learns that others
committed by polling: the live view compares ``last_seq()`` (one indexed read of ``clock``)
with the version it holds on every request, and catches up when they differ.

**Retention by partition.** ``seen``, ``allowance_keys`` and ``allowance`` are partitioned by
(use case, period) range, one partition per key (``seen_u<id>_p<period>``), created before
the first commit that needs it, with the next period's (under an advisory lock; ``IF NOT
EXISTS``). Pruning a period
raises its low-water mark and drops its partitions in one transaction: the cost is a catalog
change, not a DELETE that grows with the fleet, and the dropped tables' files are unlinked
(the keyed tags and the period's key leave the database; PostgreSQL has no equivalent of
SQLite's ``secure_delete``, so the freed file system blocks and the WAL segments until they
are recycled are what remains - keep the database on an encrypted volume). Segments are not
partitioned: compaction deletes them within minutes, whatever the period.

**Failures.** A lost connection, a server shutting down or restarting, a full disk, a
read-only server (a standby after fail-over), a lock or deadlock timeout raise
:class:`~collector.errors.StoreUnavailable` with a cause (``connection``, ``disk-full``,
``read-only``, ``locked``, ``io-error``, ``resources``): nothing of the transaction is
stored, ingest keeps the batch unacknowledged, ``/healthz`` answers 503, and the next attempt
reconnects. A commit whose ``COMMIT`` was sent but whose answer was lost may have committed:
the retry finds its report ids in ``seen`` and counts them as duplicates, never twice.

The connection, the schema versions and their migration (``ldp-collector migrate``), the
use-case rows and the checksums are in :mod:`collector.store.postgres_setup`.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg

from collector.errors import StoreError
from collector.store.admission import Claims, Slot, Verdict, claim_allowance, senders_by_report, within_room
from collector.store.integrity import counters_digest, counters_key
from collector.store.interface import CommitResult, FoldedReport, KeyInfo
from collector.store.postgres_schema import (
    LOCK_PARTITIONS,
    LOCK_PRUNE,
    SCHEMA_VERSION,
    create_partitions,
    drop_partitions,
    partitions_below,
)
from collector.store.postgres_session import DDL_LOCK_TIMEOUT
from collector.store.postgres_setup import PostgresSetup
from collector.store.row_format import (
    RID_BYTES,
    TAG_BYTES,
    Segment,
    UseCaseRow,
    group_by_key,
    rid_tag,
    segment_rows,
)
from protocol.server.contract import Aggregate

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

_Segment = Segment
"""A segment row to insert (what :meth:`PostgresStore._write_segments` takes)."""


class PostgresStore(PostgresSetup):
    """The PostgreSQL checkpoint database of a group of collectors.

    Not thread-safe: each user drives its store from one thread (one connection each).

    Args:
        config: ``[store]`` (``url``, ``password_file``).
        catalog: the use-case definitions accepted (aggregates are keyed by each one's ref).
        instance: this collector's name (its counters are kept under it; unique in the group).
        readonly: open for reading only (the CLI and the materialised aggregates of ``collector.live``).

    Raises:
        ConfigError: the password file cannot be read.
        StoreUnavailable: the server cannot be reached now.
        StoreError: the database holds a newer schema, or is damaged.
    """

    # -- commit ----------------------------------------------------------------------------

    def commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None = None
    ) -> CommitResult:
        """Fold ``reports`` (already shuffled) and add ``counters``, in one transaction.

        See :meth:`collector.store.interface.Store.commit`; the module docstring says how it
        stays exactly once across a group.
        """
        with self._failures():
            try:
                return self._commit(reports, counters, senders)
            except psycopg.errors.CheckViolation:
                # "no partition of relation seen found for row": a partition this store had
                # made is gone (a database restored from an older backup). Forget what it knew
                # and make them again, once.
                self._abandon()
                self._partitions.clear()
                return self._commit(reports, counters, senders)

    def _ensure_partitions(self, keys: set[tuple[int, int]]) -> None:
        """Create the partitions of ``keys`` that this store has not seen to exist, in their own transaction.

        The next period's too: creating a partition takes an exclusive lock on its parent,
        which waits for every commit in flight; done while the period before is still
        current, the members do not all meet at that lock in the first second of a period.
        """
        missing = keys - self._partitions
        if not missing:
            return
        missing |= {(uc, period + 1) for uc, period in missing} - self._partitions
        conn = self._connection()
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            # Creating a partition locks its parent: rather than queue every commit behind a
            # long reader of the parent (a member verifying at start), give up and let ingest retry.
            cur.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_PARTITIONS,))
            create_partitions(cur, missing)
            cur.execute("COMMIT")
        self._partitions |= missing

    def _commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None
    ) -> CommitResult:
        if self.readonly:
            raise StoreError(f"{self.location}: opened read-only")
        start = time.perf_counter()
        sender_of = senders_by_report(reports, senders)
        uc_of = {name: row.id for name, row in self._use_cases.items()}
        ids = sorted({uc_of[r.use_case.ref] for r in reports})
        self._ensure_partitions({(uc_of[r.use_case.ref], r.period) for r in reports})
        conn = self._connection()
        with conn.cursor() as cur:
            lows, stored = self._begin(conn, cur, ids)
            verdict = Verdict.of(reports, lows, uc_of)
            tagged: dict[bytes, FoldedReport] = {}
            for r in verdict.current:
                tagged.setdefault(rid_tag(r.report_id, uc_of[r.use_case.ref], r.period), r)
            unique = list(tagged.items())
            fresh_rids = self._remember(cur, unique, uc_of)
            verdict.fresh = [r for rid, r in unique if rid in fresh_rids]
            if sender_of and verdict.fresh:
                refused = verdict.refuse_over(*self._within_allowance(cur, verdict.fresh, sender_of, uc_of))
                if refused:
                    self._forget(cur, refused, uc_of)
            groups = group_by_key(verdict.fresh)
            segments, records = segment_rows(self._use_cases, groups)
            for name, value in verdict.counters(counters, records).items():
                if value:
                    stored[name] = stored.get(name, 0) + value
            self._end_commit(conn, cur, sorted(stored.items()), segments)
        return verdict.result(records, start, list(groups))

    def _begin(
        self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], ids: Sequence[int]
    ) -> tuple[dict[int, int], dict[str, int]]:
        """Open the commit's transaction and take its first locks (step 1 of the module docstring):
        the low-water marks of use cases ``ids`` and this instance's counters, as they stand."""
        with conn.pipeline():
            cur.execute("BEGIN")
            cur.execute(
                "SELECT id, low_water FROM use_cases WHERE id = ANY(%s) ORDER BY id FOR SHARE", (ids,), prepare=True
            )
            lows_cur = conn.cursor()
            lows_cur.execute(
                "SELECT name, value FROM counters WHERE instance = %s ORDER BY name FOR UPDATE",
                (self.instance,),
                prepare=True,
            )
        lows = {int(i): int(w) for i, w in cur.fetchall()}
        stored = {str(n): int(v) for n, v in lows_cur.fetchall()}
        lows_cur.close()
        return lows, stored

    def _end_commit(
        self,
        conn: psycopg.Connection[Any],
        cur: psycopg.Cursor[Any],
        rows: Sequence[tuple[str, int]],
        segments: Sequence[Segment],
    ) -> None:
        """Write this instance's counters (``rows``, their new totals by name) and the segments,
        and commit, in one pipeline (step 4 of the module docstring)."""
        with conn.pipeline():
            cur.execute(
                "INSERT INTO counters (instance, name, value) SELECT %s, * FROM unnest(%b::text[], %b::bigint[]) "
                "ON CONFLICT (instance, name) DO UPDATE SET value = excluded.value",
                (self.instance, [n for n, _ in rows], [v for _, v in rows]),
                prepare=True,
            )
            self._put_digest(cur, counters_key(self.instance), counters_digest(self.instance, rows))
            if segments:
                self._write_segments(cur, segments)
            cur.execute("COMMIT")

    def _remember(
        self, cur: psycopg.Cursor[Any], unique: Sequence[tuple[bytes, FoldedReport]], uc_of: Mapping[str, int]
    ) -> set[bytes]:
        """Insert the tagged report ids; return those that were not there (the fresh ones).

        One statement per (use case, period), pipelined, each carrying its ids as one
        concatenated ``bytea`` cut up on the server: dumping a 2,000-element ``bytea[]``
        element by element cost more client time than the insert itself.
        """
        by_key: dict[tuple[int, int], list[bytes]] = defaultdict(list)
        for rid, r in unique:
            by_key[(uc_of[r.use_case.ref], r.period)].append(rid)
        if not by_key:
            return set()
        width = RID_BYTES + TAG_BYTES
        cur.executemany(
            "INSERT INTO seen (uc, period, rid) SELECT %b::integer, %b::bigint, "
            f"substring(%b::bytea FROM i * {width} + 1 FOR {width}) FROM generate_series(0, %b::integer - 1) AS i "
            "ON CONFLICT DO NOTHING RETURNING rid",
            # Keys and ids in one global order, so two members inserting overlapping ids (a
            # redelivery taken by both) wait on each other's rows in the same order and never
            # deadlock (the allowance upsert below sorts its tags for the same reason).
            [(uc, period, b"".join(sorted(rids)), len(rids)) for (uc, period), rids in sorted(by_key.items())],
            returning=True,
        )
        fresh: set[bytes] = set()
        while True:
            fresh.update(bytes(row[0]) for row in cur.fetchall())
            if not cur.nextset():
                return fresh

    def _write_segments(self, cur: psycopg.Cursor[Any], segments: Sequence[_Segment]) -> None:
        """Append the commit's segments under the next commit-ordered version (the last statement before COMMIT).

        The clock's row lock is held from here to the end of COMMIT only.
        """
        cur.execute(
            "WITH v AS (UPDATE clock SET version = version + 1 RETURNING version) "
            "INSERT INTO segments (version, uc, period, kind, reports, records, data) "
            "SELECT v.version, s.* FROM v, unnest(%b::integer[], %b::bigint[], %b::text[], "
            "%b::bigint[], %b::bigint[], %b::bytea[]) AS s",
            tuple([s[i] for s in segments] for i in range(6)),
            prepare=True,
        )

    def _forget(self, cur: psycopg.Cursor[Any], refused: Sequence[FoldedReport], uc_of: Mapping[str, int]) -> None:
        """Take report ids refused as over the allowance out of ``seen`` again (SQLite never puts them there)."""
        cur.execute(
            "DELETE FROM seen WHERE (uc, period, rid) IN "
            "(SELECT * FROM unnest(%b::integer[], %b::bigint[], %b::bytea[]))",
            (
                [uc_of[r.use_case.ref] for r in refused],
                [r.period for r in refused],
                [rid_tag(r.report_id, uc_of[r.use_case.ref], r.period) for r in refused],
            ),
        )

    def _within_allowance(
        self,
        cur: psycopg.Cursor[Any],
        fresh: Sequence[FoldedReport],
        sender_of: Mapping[bytes, bytes],
        uc_of: Mapping[str, int],
    ) -> tuple[list[FoldedReport], int]:
        """The reports within their device's allowance, and how many were beyond it (inside the transaction)."""
        wanted = sorted({(uc_of[r.use_case.ref], r.period) for r in fresh if r.report_id in sender_of})
        if not wanted:
            return list(fresh), 0
        # One random key per (use case, period), drawn by whichever member sees the period's
        # first identified report (the others' inserts do nothing, then read the winner's);
        # dropped with the period's partition (prune).
        cur.execute(
            "INSERT INTO allowance_keys (uc, period, key) SELECT * FROM unnest(%b::integer[], %b::bigint[], "
            "%b::bytea[]) ON CONFLICT DO NOTHING",
            ([k[0] for k in wanted], [k[1] for k in wanted], [secrets.token_bytes(32) for _ in wanted]),
        )
        keys = {
            (int(uc), int(period)): bytes(key)
            for uc, period, key in cur.execute(
                "SELECT uc, period, key FROM allowance_keys WHERE (uc, period) IN "
                "(SELECT * FROM unnest(%b::integer[], %b::bigint[]))",
                ([k[0] for k in wanted], [k[1] for k in wanted]),
            ).fetchall()
        }
        claims = claim_allowance(fresh, sender_of, uc_of, lambda uc, period: keys[(uc, period)])
        return within_room(fresh, claims.slots, self._take_room(cur, claims))

    @staticmethod
    def _take_room(cur: psycopg.Cursor[Any], claims: Claims) -> dict[Slot, int]:
        """How many of each slot's claims still fit its allowance, counted as used in the same statement."""
        slots = sorted(claims.want)
        # Additive and capped in one statement: SET sees the row as it was, so ``added`` is
        # what this commit may still fold for the tag; the row lock makes racing members wait.
        cur.execute(
            "INSERT INTO allowance AS a (uc, period, tag, reports, cap, added) "
            "SELECT uc, period, tag, least(n, cap), cap, least(n, cap) FROM unnest(%b::integer[], %b::bigint[], "
            "%b::bytea[], %b::integer[], %b::integer[]) AS t(uc, period, tag, n, cap) "
            "ON CONFLICT (uc, period, tag) DO UPDATE SET "
            "reports = least(a.reports + excluded.reports, excluded.cap), cap = excluded.cap, "
            "added = least(a.reports + excluded.reports, excluded.cap) - a.reports "
            "RETURNING uc, period, tag, added",
            (
                [s[0] for s in slots],
                [s[1] for s in slots],
                [s[2] for s in slots],
                [claims.want[s] for s in slots],
                [claims.cap[s] for s in slots],
            ),
        )
        return {(int(uc), int(period), bytes(tag)): int(n) for uc, period, tag, n in cur.fetchall()}

    # -- reading ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in one read-only REPEATABLE READ transaction (binary: blobs come as they are)."""
        with self._failures():
            conn = self._connection()
            with conn.cursor(binary=True) as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield cur
                cur.execute("COMMIT")

    def _base(self, cur: psycopg.Cursor[Any], row: UseCaseRow, period: int) -> tuple[Aggregate, int, int]:
        base = cur.execute(
            "SELECT reports, records, data FROM aggregates WHERE uc = %s AND period = %s", (row.id, period)
        ).fetchone()
        return self._restored_base(row, period, base)

    def _read_at(self, row: UseCaseRow, use_case: str, period: int) -> tuple[Aggregate, KeyInfo, int]:
        """The base and the segments up to the clock's version, in one REPEATABLE READ snapshot."""
        with self._snapshot() as cur:
            seq = int(cur.execute("SELECT version FROM clock").fetchone()[0])  # type: ignore[index]
            agg, reports, records = self._base(cur, row, period)
            cur.execute(
                "SELECT kind, reports, records, data FROM segments WHERE uc = %s AND period = %s AND version <= %s "
                "ORDER BY version",
                (row.id, period, seq),
            )
            agg, reports, records = self._fold_segments(row, period, (agg, reports, records), cur)
        return agg, KeyInfo(use_case, period, reports, records), seq

    def _catch_up_from(
        self, row: UseCaseRow, aggregate: Aggregate, info: KeyInfo, seq: int
    ) -> tuple[Aggregate, KeyInfo, int] | None:
        """The segments any member committed after version ``seq``, in one snapshot, unless a compaction
        moved some into the base."""
        with self._snapshot() as cur:
            last = int(cur.execute("SELECT version FROM clock").fetchone()[0])  # type: ignore[index]
            if last == seq:
                return aggregate, info, seq
            # Every report is in exactly one place (the base or one segment): the totals up to
            # ``seq`` match what the caller holds unless a compaction moved later segments.
            held = cur.execute(
                "SELECT coalesce((SELECT reports FROM aggregates WHERE uc = %(uc)s AND period = %(p)s), 0) + "
                "coalesce((SELECT sum(reports) FROM segments WHERE uc = %(uc)s AND period = %(p)s "
                "AND version <= %(seq)s), 0)",
                {"uc": row.id, "p": info.period, "seq": seq},
            ).fetchone()
            if held is None or int(held[0]) != info.reports:
                return None
            cur.execute(
                "SELECT kind, reports, records, data FROM segments WHERE uc = %s AND period = %s AND version > %s "
                "AND version <= %s ORDER BY version",
                (row.id, info.period, seq, last),
            )
            aggregate, reports, records = self._fold_segments(
                row, info.period, (aggregate, info.reports, info.records), cur
            )
        return aggregate, KeyInfo(info.use_case, info.period, reports, records), last

    def _scalar(self, query: str, params: Sequence[Any] = ()) -> Any:
        with self._failures():
            row = self._connection().execute(query, params).fetchone()
        return None if row is None else row[0]

    def last_seq(self) -> int:
        """The commit-ordered version of the latest committed segment (0 before the first)."""
        return int(self._scalar("SELECT version FROM clock"))

    def data_version(self) -> tuple[int, int]:
        """A pair that changes whenever committed data changes (for caching estimates)."""
        with self._failures():
            row = self._connection().execute("SELECT version, compactions FROM clock").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def totals(self, use_case: str | None = None) -> list[KeyInfo]:
        """Every (use case, period) with data, with its report and record totals, oldest first."""
        ids = {row.id: name for name, row in self._use_cases.items() if use_case is None or name == use_case}
        if not ids:
            return []
        with self._failures():
            rows = (
                self._connection()
                .execute(
                    "SELECT uc, period, reports, records FROM aggregates WHERE uc = ANY(%(ids)s) UNION ALL "
                    "SELECT uc, period, sum(reports), sum(records) FROM segments WHERE uc = ANY(%(ids)s) "
                    "GROUP BY uc, period",
                    {"ids": list(ids)},
                )
                .fetchall()
            )
        return self._add_totals(rows, ids)

    def counters(self, instance: str | None = None) -> dict[str, int]:
        """Persisted ingest counters (of one instance, or summed over all)."""
        with self._failures():
            conn = self._connection()
            if instance is None:
                rows = conn.execute("SELECT name, sum(value) FROM counters GROUP BY name").fetchall()
            else:
                rows = conn.execute("SELECT name, value FROM counters WHERE instance = %s", (instance,)).fetchall()
        return {str(name): int(value) for name, value in rows}

    def instances(self) -> list[str]:
        """Names of the collectors that have committed to this database."""
        with self._failures():
            rows = self._connection().execute("SELECT DISTINCT instance FROM counters ORDER BY instance").fetchall()
        return [str(r[0]) for r in rows]

    def seen_count(self) -> int:
        """Report ids currently remembered."""
        return int(self._scalar("SELECT count(*) FROM seen"))

    # -- maintenance -----------------------------------------------------------------------

    def low_water(self) -> dict[str, int]:
        """The lowest period still accepted, per use case (0 if never set)."""
        with self._failures():
            rows = self._connection().execute("SELECT id, low_water FROM use_cases").fetchall()
        marks = {int(i): int(w) for i, w in rows}
        return {name: marks[row.id] for name, row in self._use_cases.items()}

    def prune(self, low_water: Mapping[str, int]) -> int:
        """Raise low-water marks (never lower them) and drop the partitions of periods below them.

        Several members may prune at once: an advisory lock lets one through at a time.

        Returns:
            The number of report ids forgotten.
        """
        with self._failures():
            return self._prune(low_water)

    def _prune(self, low_water: Mapping[str, int]) -> int:
        conn = self._connection()
        wanted = {self._use_cases[n].id: m for n, m in low_water.items() if n in self._use_cases}
        with conn.cursor() as cur:
            stored = {int(i): int(w) for i, w in cur.execute("SELECT id, low_water FROM use_cases").fetchall()}
            marks = {uc: max(stored.get(uc, 0), mark) for uc, mark in wanted.items()}
            raised = {uc for uc, mark in marks.items() if mark > stored.get(uc, 0)}
            if not raised and not partitions_below(cur, marks):
                return 0  # the common case, every few seconds on every member: no write at all
            cur.execute("BEGIN")
            # As for creating partitions: dropping one waits for readers of its parent, and
            # commits would queue behind it; the next maintenance round tries again.
            cur.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_PRUNE,))
            # The use cases' rows first (commits hold them FOR SHARE): once locked, no commit
            # is inside a period about to be dropped, and none can start in one.
            cur.execute("SELECT id FROM use_cases WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (sorted(wanted),))
            for uc in sorted(raised):
                cur.execute("UPDATE use_cases SET low_water = greatest(low_water, %s) WHERE id = %s", (marks[uc], uc))
                self._reseal_use_case(cur, uc)
            removed = 0
            stale = partitions_below(cur, marks)
            for uc, period in stale:
                removed += drop_partitions(cur, uc, period)
            cur.execute("COMMIT")
        self._partitions -= set(stale)
        return removed

    def compaction_candidates(self, compact_after: int) -> list[tuple[str, int]]:
        """Keys whose segments should be folded into their base now."""
        lows = self.low_water()
        with self._failures():
            rows = (
                self._connection()
                .execute(
                    "SELECT s.uc, s.period, s.n, s.size, coalesce(octet_length(a.data), 0) FROM "
                    "(SELECT uc, period, count(*) AS n, sum(octet_length(data)) AS size FROM segments "
                    "GROUP BY uc, period) s LEFT JOIN aggregates a ON a.uc = s.uc AND a.period = s.period"
                )
                .fetchall()
            )
        return self._worth_compacting(rows, compact_after, lows)

    def compact(self, use_case: str, period: int) -> int:
        """Fold the key's segments into its base, in one transaction; return segments folded.

        A member that finds another compacting the same key leaves it (returns 0).
        """
        with self._failures():
            return self._compact(use_case, period)

    def _compact(self, use_case: str, period: int) -> int:
        row = self._use_cases[use_case]
        conn = self._connection()
        lock = int.from_bytes(
            hashlib.blake2b(f"compact:{row.id}:{period}".encode(), digest_size=8).digest(), "big", signed=True
        )
        with conn.cursor(binary=True) as cur:
            cur.execute("BEGIN")
            got = cur.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock,)).fetchone()
            if got != (True,):
                cur.execute("ROLLBACK")
                return 0
            # READ COMMITTED: each statement below sees every compaction before it (they held
            # the lock), and any segment of version <= the highest read (versions are commit-ordered).
            agg, reports, records = self._base(cur, row, period)
            segs = cur.execute(
                "SELECT version, kind, reports, records, data FROM segments WHERE uc = %s AND period = %s "
                "ORDER BY version",
                (row.id, period),
            ).fetchall()
            if not segs:
                cur.execute("ROLLBACK")
                return 0
            self._write_compacted(cur, row, period, (agg, reports, records), (s[1:] for s in segs))
            cur.execute(
                "DELETE FROM segments WHERE uc = %s AND period = %s AND version <= %s",
                (row.id, period, int(segs[-1][0])),
            )
            cur.execute("UPDATE clock SET compactions = compactions + 1")
            cur.execute("COMMIT")
        return len(segs)
