"""What the SQLite store remembers per report and device: report ids and allowance slots.

A commit must find out whether each report id was folded before (exactly once, docs/design.md,
invariant 8) and how many reports each device's allowance slot already holds
(docs/device-identity.md), and remember both for the reports it folds. Both are random
16-byte keys. Kept as rows of a B-tree keyed by them (schema 4), each report was an insert at a
random place of a large tree: once the tables outgrew a commit, nearly every report dirtied a
4 KiB page of its own, which the commit wrote to the write-ahead log and a checkpoint wrote
again, so the commit's cost grew with what was stored (docs/deploy.md, "The store's cost per
report", has the figures). Schema 5 keeps them in three places:

* **runs** (table ``id_runs``): per commit and (use case, period), one row holding the
  commit's new report ids (kind ``r``) or the tags of the reports it counted against their
  allowance (kind ``t``, a tag once per report), concatenated, behind a checksum over the
  row. Appending them dirties about one page per 256 keys, whatever is stored.
* **memory** (:class:`~collector.store.keyset.KeySet`): every key the runs hold, read at open
  and kept current, so the lookups a commit makes never touch the runs.
* **settled** (tables ``seen`` and ``allowance``, the schema-4 layout): when memory holds more
  than ``limit`` keys, the runs of the least recently written (use case, period) are moved
  there in one sorted pass, in the same transaction as the commit that needed the room; a
  key's lookups then also ask these tables, by index.

Several collectors on one file: each holds every run in memory. Inside a commit's write
transaction it first reads the runs the others appended since its last commit (their ``seq``
is higher), and when another one has settled or pruned since (``meta.id_runs_generation``
moved), it reads them all again; the write lock makes this exact.
"""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collector.errors import StoreError
from collector.store.keyset import KEY_BYTES, Key, KeySet
from collector.store.row_format import DIGEST_BYTES, digest, rid_tag

__all__ = ["IDS", "LIMIT", "TAGS", "RunsWritten", "SQLiteIds", "check_runs"]

IDS, TAGS = "r", "t"
"""Kinds of run: the report ids a commit folded; the allowance tags it counted."""

LIMIT = 1 << 22
"""Keys (report ids and tags together) held in memory before the oldest runs are settled:
about 85 MiB of arrays (collector/store/keyset.py)."""

_SEALED = b"s"
_IN_CHUNK = 500  # SQLite host parameters per "IN (...)" query
_GENERATION = "id_runs_generation"


def _seal(seq: int, kind: str, key: Key, payload: bytes) -> bytes:
    return _SEALED + digest("id_runs", seq, kind, key[0], key[1], payload) + payload


def _opened(row: Sequence[object], damaged: Callable[[str], StoreError]) -> tuple[int, str, Key, bytes]:
    """A run row ``(seq, kind, uc, period, data)``, checked: its fields and its keys.

    Raises:
        StoreError: made by ``damaged``, naming the row.
    """
    seq, kind, uc, period, data = row
    if isinstance(data, memoryview | bytearray):
        data = bytes(data)
    what = f"table id_runs, row {seq!r}"
    if type(seq) is not int or kind not in (IDS, TAGS) or type(uc) is not int or type(period) is not int:
        raise damaged(f"{what}: a field has a value of the wrong type")
    if not isinstance(data, bytes) or data[:1] != _SEALED or (len(data) - 1 - DIGEST_BYTES) % KEY_BYTES:
        raise damaged(f"{what}: the data is not a sealed run of {KEY_BYTES}-byte keys")
    payload = data[1 + DIGEST_BYTES :]
    if digest("id_runs", seq, kind, uc, period, payload) != data[1 : 1 + DIGEST_BYTES]:
        raise damaged(f"{what}: the checksum does not match the row")
    return seq, str(kind), (uc, period), payload


def _split(payload: bytes) -> list[bytes]:
    return [payload[i : i + KEY_BYTES] for i in range(0, len(payload), KEY_BYTES)]


def check_runs(db: sqlite3.Connection, damaged: Callable[[str], StoreError]) -> None:
    """Check every run's checksum (part of the store's ``verify``).

    Raises:
        StoreError: made by ``damaged``, naming the row at fault.
    """
    for row in db.execute("SELECT seq, kind, uc, period, data FROM id_runs"):
        _opened(row, damaged)


@dataclass
class RunsWritten:
    """What a commit appended, to be held in memory once it has committed.

    Attributes:
        ids: the report ids it folded, by (use case, period) (none held before, none twice).
        tags: the allowance tags it counted (a tag once per report), by (use case, period).
        new_tags: the keys whose tags were all held by no report before and appear once.
        seq: the highest run ``seq`` it wrote (0: none).
        settled: the keys it settled.
        generation: the generation it set (0: unchanged).
    """

    ids: dict[Key, list[bytes]] = field(default_factory=dict)
    tags: dict[Key, list[bytes]] = field(default_factory=dict)
    new_tags: set[Key] = field(default_factory=set)
    seq: int = 0
    settled: list[Key] = field(default_factory=list)
    generation: int = 0


class SQLiteIds:
    """The report ids and allowance slots of one SQLite connection (see the module docstring).

    Not thread-safe: the store's one thread drives it. Its methods that write run inside the
    caller's write transaction; :meth:`committed` and :meth:`forgotten` are called after the
    transaction commits, so that what memory holds never runs ahead of the file.

    Args:
        db: the store's connection.
        damaged: makes the error that stops the collector, from what is wrong.
        limit: keys held in memory before the least recently written runs are settled.
    """

    def __init__(self, db: sqlite3.Connection, damaged: Callable[[str], StoreError], *, limit: int = LIMIT) -> None:
        self._db = db
        self._damaged = damaged
        self.limit = limit
        self.ids = KeySet()
        self.tags = KeySet()
        self._settled: set[Key] = set()
        self._seq = 0
        self._generation = 0
        self._written: dict[Key, int] = {}  # each key's last commit that wrote it (a count of commits)
        self._commits = 0

    # -- reading what is stored ------------------------------------------------------------

    def load(self) -> None:
        """Read every run into memory, and which keys have settled rows (at open, and after
        another collector settled or pruned)."""
        db = self._db
        self.ids.clear()
        self.tags.clear()
        self._written.clear()
        row = db.execute("SELECT value FROM meta WHERE key = ?", (_GENERATION,)).fetchone()
        self._generation = int(row[0]) if row else 0
        self._seq = 0
        self._read_runs(db.execute("SELECT seq, kind, uc, period, data FROM id_runs ORDER BY seq"))
        self._settled = set(self._settled_keys("seen")) | set(self._settled_keys("allowance"))

    def _settled_keys(self, table: str) -> Iterable[Key]:
        """The distinct (use case, period) of a settled table, one index probe each."""
        key = self._db.execute(f"SELECT uc, period FROM {table} ORDER BY uc, period LIMIT 1").fetchone()
        while key is not None:
            yield int(key[0]), int(key[1])
            key = self._db.execute(
                f"SELECT uc, period FROM {table} WHERE (uc, period) > (?, ?) ORDER BY uc, period LIMIT 1", key
            ).fetchone()

    def _read_runs(self, rows: Iterable[Sequence[object]]) -> None:
        for row in rows:
            seq, kind, key, payload = _opened(row, self._damaged)
            (self.ids if kind == IDS else self.tags).add(key, _split(payload), new=False)
            self._seq = max(self._seq, seq)
            self._written[key] = self._commits

    def sync(self) -> None:
        """Catch up with what other collectors on the file committed (inside a write transaction)."""
        db = self._db
        row = db.execute("SELECT value FROM meta WHERE key = ?", (_GENERATION,)).fetchone()
        if (int(row[0]) if row else 0) != self._generation:
            self.load()
            return
        self._read_runs(
            db.execute("SELECT seq, kind, uc, period, data FROM id_runs WHERE seq > ? ORDER BY seq", (self._seq,))
        )

    def count(self) -> int:
        """Report ids remembered (runs and settled)."""
        row = self._db.execute(
            "SELECT (SELECT count(*) FROM seen) + "
            f"coalesce((SELECT sum((length(data) - {1 + DIGEST_BYTES}) / {KEY_BYTES}) FROM id_runs WHERE kind = ?), 0)",
            (IDS,),
        ).fetchone()
        return int(row[0])

    # -- a commit's questions --------------------------------------------------------------

    def held(self, key: Key, ids: Sequence[bytes]) -> list[bool]:
        """Whether each report id of ``key`` was folded before."""
        out = [n > 0 for n in self.ids.count(key, ids)]
        if key in self._settled:
            rest = [rid_tag(rid, *key) for rid, done in zip(ids, out, strict=True) if not done]
            stored = {bytes(row[0])[:KEY_BYTES] for row in self._in_table("seen", "rid", key, rest)}
            out = [done or rid in stored for rid, done in zip(ids, out, strict=True)]
        return out

    def used(self, key: Key, tags: Sequence[bytes]) -> list[int]:
        """Reports each allowance tag of ``key`` has been counted for."""
        out = self.tags.count(key, tags)
        if key in self._settled:
            stored = {bytes(t): int(n) for t, n in self._in_table("allowance", "tag, reports", key, list(set(tags)))}
            out = [n + stored.get(t, 0) for n, t in zip(out, tags, strict=True)]
        return out

    def _in_table(self, table: str, columns: str, key: Key, values: Sequence[bytes]) -> list[tuple[Any, ...]]:
        """Rows of a settled table under ``key`` whose key column (``rid`` of ``seen``, ``tag`` of
        ``allowance``) is one of ``values``."""
        column = "rid" if table == "seen" else "tag"
        rows: list[tuple[Any, ...]] = []
        for i in range(0, len(values), _IN_CHUNK):
            chunk = values[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT {columns} FROM {table} WHERE uc = ? AND period = ? AND {column} IN ({marks})"
            rows.extend(self._db.execute(query, (*key, *chunk)))
        return rows

    # -- a commit's writes -----------------------------------------------------------------

    def append(
        self, ids: Mapping[Key, list[bytes]], tags: Mapping[Key, list[bytes]], new_tags: set[Key]
    ) -> RunsWritten:
        """Append the commit's runs (inside its transaction); settle when memory would hold too much.

        ``ids`` are the report ids judged fresh (held nowhere, each once); ``new_tags`` the keys of
        ``tags`` whose tags are likewise each held nowhere and counted once.
        """
        db = self._db
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'id_runs'").fetchone()
        seq = int(row[0]) if row else 0
        rows = []
        for kind, by_key in ((IDS, ids), (TAGS, tags)):
            for key, keys in sorted(by_key.items()):
                if keys:
                    seq += 1
                    payload = b"".join(keys)
                    rows.append((seq, kind, key[0], key[1], _seal(seq, kind, key, payload)))
        db.executemany("INSERT INTO id_runs (seq, kind, uc, period, data) VALUES (?, ?, ?, ?, ?)", rows)
        written = RunsWritten(dict(ids), dict(tags), new_tags, seq if rows else 0)
        adding = sum(len(v) for v in ids.values()) + sum(len(v) for v in tags.values())
        if self.ids.size + self.tags.size + adding > self.limit:
            self._settle(written)
        return written

    def _settle(self, written: RunsWritten) -> None:
        """Move the runs of the least recently written keys into the settled tables until
        memory will hold at most half of ``limit`` (inside the commit's transaction)."""
        db = self._db
        now = set(written.ids) | set(written.tags)
        sizes = Counter(
            {k: self.ids.held(k) + self.tags.held(k) for k in set(self.ids.groups()) | set(self.tags.groups())}
        )
        for key in now:
            sizes[key] += len(written.ids.get(key, ())) + len(written.tags.get(key, ()))
        total = sum(sizes.values())
        # Least recently written first (an old period that takes no more reports), then the largest.
        order = sorted(sizes, key=lambda k: (k in now, self._written.get(k, -1), -sizes[k]))
        for key in order:
            if total <= self.limit // 2:
                break
            self._settle_key(key)
            written.settled.append(key)
            total -= sizes[key]
        generation = self._generation + 1
        db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_GENERATION, generation),
        )
        written.generation = generation

    def _settle_key(self, key: Key) -> None:
        """Move one key's runs, its own commit's included, into ``seen`` and ``allowance``, sorted."""
        db = self._db
        ids: list[bytes] = []
        tags: Counter[bytes] = Counter()
        for row in db.execute("SELECT seq, kind, uc, period, data FROM id_runs WHERE uc = ? AND period = ?", key):
            _seq, kind, _key, payload = _opened(row, self._damaged)
            if kind == IDS:
                ids.extend(_split(payload))
            else:
                tags.update(_split(payload))
        uc, period = key
        db.executemany(
            "INSERT INTO seen (uc, period, rid) VALUES (?, ?, ?)",
            [(uc, period, rid_tag(rid, uc, period)) for rid in sorted(ids)],
        )
        db.executemany(
            "INSERT INTO allowance (uc, period, tag, reports) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uc, period, tag) DO UPDATE SET reports = reports + excluded.reports",
            [(uc, period, tag, n) for tag, n in sorted(tags.items())],
        )
        db.execute("DELETE FROM id_runs WHERE uc = ? AND period = ?", key)

    def committed(self, written: RunsWritten) -> None:
        """The commit that wrote ``written`` is durable: hold its keys."""
        self._commits += 1
        for key in written.settled:
            self.ids.drop(key)
            self.tags.drop(key)
            self._written.pop(key, None)
            self._settled.add(key)
        settled = set(written.settled)
        for key, values in written.ids.items():
            if key not in settled:
                self.ids.add(key, values, new=True)
                self._written[key] = self._commits
        for key, values in written.tags.items():
            if key not in settled:
                self.tags.add(key, values, new=key in written.new_tags)
                self._written[key] = self._commits
        self._seq = max(self._seq, written.seq)
        if written.generation:
            self._generation = written.generation

    # -- retention -------------------------------------------------------------------------

    def forget_below(self, uc: int) -> int:
        """Delete the runs of ``uc``'s periods below its low-water mark (inside the prune's
        transaction); return the report ids they held."""
        low = "(SELECT low_water FROM use_cases WHERE id = ?)"
        row = self._db.execute(
            f"SELECT coalesce(sum((length(data) - {1 + DIGEST_BYTES}) / {KEY_BYTES}), 0) FROM id_runs "
            f"WHERE kind = ? AND uc = ? AND period < {low}",
            (IDS, uc, uc),
        ).fetchone()
        self._db.execute(f"DELETE FROM id_runs WHERE uc = ? AND period < {low}", (uc, uc))
        return int(row[0])

    def forgotten(self, low_water: Mapping[int, int]) -> None:
        """The prune that raised ``low_water`` (by use case id) is durable: drop what lies below."""
        for keys in (self.ids, self.tags):
            for uc, period in keys.groups():
                if period < low_water.get(uc, period):
                    keys.drop((uc, period))
        self._settled = {(uc, p) for uc, p in self._settled if p >= low_water.get(uc, p)}


def by_key(pairs: Iterable[tuple[Key, bytes]]) -> dict[Key, list[bytes]]:
    """``(key, value)`` pairs grouped by key, in order."""
    out: dict[Key, list[bytes]] = defaultdict(list)
    for key, value in pairs:
        out[key].append(value)
    return dict(out)
