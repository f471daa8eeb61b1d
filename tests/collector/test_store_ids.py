"""The SQLite store's report ids and allowance slots in runs, in memory and settled: each answer
is the same wherever the id or tag is kept, across several collectors on one file, a failed
commit and retention (collector/store/sqlite_ids.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from collector.store import CheckpointStore
from collector.store import sqlite as sqlite_module
from collector.store.row_format import allowance_tag, allowance_tagger
from protocol.registry import Registry
from protocol.wire import DecodedReport, decode_report
from tests.collector.conftest import NOW
from tests.collector.stores import sqlite_allowance
from tests.collector.support import bit_reports, current_period

LIMIT = 64
"""Keys in memory before settling: small, so that every test settles many times."""


def _reports(registry: Registry, period: int, count: int, seed: int) -> list[DecodedReport]:
    return [decode_report(p, registry) for p in bit_reports(registry, "flag", count, period=period, seed=seed)]


def _senders(first: int, count: int) -> list[bytes]:
    return [f"dev-{i:05d}".encode() for i in range(first, first + count)]


def _rows(path: Path, query: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute(query).fetchone()[0])
    finally:
        db.close()


def test_settled_and_recent_ids_and_slots_answer_alike(tmp_path: Path, registry: Registry) -> None:
    """Three periods committed in small batches under a small memory: ids and tags end up both settled
    and in runs, and every redelivery is a duplicate, every second report of a device over its
    allowance, before and after reopening."""
    path = tmp_path / "c.sqlite3"
    now = current_period(registry, "flag", NOW)
    batches = [(p, _reports(registry, p, 60, seed=p), _senders(0, 60)) for p in (now - 2, now - 1, now)]
    store = CheckpointStore(path, registry, ids_in_memory=LIMIT)
    try:
        for _period, reports, senders in batches:
            for lo in range(0, len(reports), 20):
                result = store.commit(reports[lo : lo + 20], {}, senders[lo : lo + 20])
                assert (result.reports, result.duplicates, result.over_allowance) == (20, 0, 0)
        assert store.seen_count() == 180
    finally:
        store.close()
    settled = _rows(path, "SELECT count(*) FROM seen")
    in_runs = _rows(path, "SELECT count(*) FROM id_runs WHERE kind = 'r'")
    assert settled > 0, settled
    assert in_runs > 0, in_runs
    db = sqlite3.connect(path)
    assert sorted(sqlite_allowance(db).values()) == [1] * 180
    db.close()
    for _ in range(2):  # the same answers from a store that reads everything back at open
        store = CheckpointStore(path, registry, ids_in_memory=LIMIT)
        try:
            for period, reports, senders in batches:
                again = store.commit(reports, {}, senders)
                assert (again.reports, again.duplicates, again.over_allowance) == (0, 60, 0)
                second = _reports(registry, period, 60, seed=period + 100)
                over = store.commit(second, {}, senders)
                assert (over.reports, over.over_allowance) == (0, 60)
            assert store.seen_count() == 180
        finally:
            store.close()


def test_two_collectors_on_one_file_see_each_others_ids_and_settles(tmp_path: Path, registry: Registry) -> None:
    """Two stores on one file (a group on one host) commit in turn, each settling under a small memory:
    a report folded by one is a duplicate at the other, a device counted by one is over its
    allowance at the other, whatever was settled in between and by whom."""
    path = tmp_path / "c.sqlite3"
    now = current_period(registry, "flag", NOW)
    a = CheckpointStore(path, registry, instance="a", ids_in_memory=LIMIT)
    b = CheckpointStore(path, registry, instance="b", ids_in_memory=LIMIT)
    gen = np.random.default_rng(7)
    try:
        folded: list[tuple[DecodedReport, bytes]] = []
        for step in range(12):
            period = now - int(gen.integers(0, 3))
            reports = _reports(registry, period, 16, seed=1000 + step)
            senders = _senders(16 * step, 16)
            first, second = (a, b) if step % 2 else (b, a)
            result = first.commit(reports, {}, senders)
            assert (result.reports, result.duplicates) == (16, 0)
            folded += zip(reports, senders, strict=True)
            # The other one, at once: the same reports are duplicates, new ones from the same devices over.
            again = second.commit(reports, {}, senders)
            assert (again.reports, again.duplicates) == (0, 16)
            over = second.commit(_reports(registry, period, 16, seed=2000 + step), {}, senders)
            assert (over.reports, over.over_allowance) == (0, 16)
        everything = a.commit([r for r, _ in folded], {}, [s for _, s in folded])
        assert (everything.reports, everything.duplicates) == (0, len(folded))
        assert a.seen_count() == b.seen_count() == len(folded)
        assert a.counters()["reports"] == len(folded)
        assert _rows(path, "SELECT count(*) FROM seen") > 0  # both have settled along the way
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("limit", [LIMIT, 10_000])
def test_a_failed_commit_leaves_nothing_held_in_memory(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """A commit that fails after its runs were written (with a settle, or none) rolls back, and memory
    holds none of it: the same batch, retried, folds every report once."""
    path = tmp_path / "c.sqlite3"
    now = current_period(registry, "flag", NOW)
    store = CheckpointStore(path, registry, ids_in_memory=limit)
    try:
        early = _reports(registry, now - 1, 50, seed=1)
        assert store.commit(early, {}, _senders(0, 50)).reports == 50
        batch = _reports(registry, now, 50, seed=2)

        def failing(*args: object, **kwargs: object) -> object:
            raise sqlite3.OperationalError("disk I/O error")

        with monkeypatch.context() as patch:
            patch.setattr(sqlite_module, "segment_rows", failing)
            with pytest.raises(Exception, match="disk I/O error"):
                store.commit(batch, {}, _senders(0, 50))
        retried = store.commit(batch, {}, _senders(0, 50))
        assert (retried.reports, retried.duplicates, retried.over_allowance) == (50, 0, 0)
        assert store.commit(early + batch, {}, _senders(0, 50) * 2).duplicates == 100
        assert store.seen_count() == 100
    finally:
        store.close()


def test_retention_deletes_runs_and_settled_rows_of_closed_periods(tmp_path: Path, registry: Registry) -> None:
    """Pruning a period drops its runs and settled rows (ids and tags) and what memory holds of it;
    its reports are then refused as expired, later periods keep theirs."""
    path = tmp_path / "c.sqlite3"
    ref = registry["flag"].ref
    now = current_period(registry, "flag", NOW)
    store = CheckpointStore(path, registry, ids_in_memory=LIMIT)
    try:
        old, new = _reports(registry, now - 1, 80, seed=5), _reports(registry, now, 30, seed=6)
        store.commit(old, {}, _senders(0, 80))
        store.commit(new, {}, _senders(0, 30))
        assert store.prune({ref: now}) == 80
        assert store.seen_count() == 30
        assert _rows(path, f"SELECT count(*) FROM seen WHERE period = {now - 1}") == 0
        assert _rows(path, f"SELECT count(*) FROM id_runs WHERE period = {now - 1}") == 0
        assert _rows(path, f"SELECT count(*) FROM allowance WHERE period = {now - 1}") == 0
        expired = store.commit(old, {}, _senders(0, 80))
        assert (expired.reports, expired.expired) == (0, 80)
        again = store.commit(new, {}, _senders(0, 30))
        assert (again.reports, again.duplicates) == (0, 30)
    finally:
        store.close()


def test_the_tagger_of_a_commit_gives_the_allowance_tag() -> None:
    """The keyed state computed once and copied per sender gives allowance_tag's digest for any sender."""
    gen = np.random.default_rng(3)
    key = gen.bytes(32)
    tag = allowance_tagger(key)
    senders = [gen.bytes(int(n)) for n in gen.integers(0, 300, size=200)]
    assert [tag(s) for s in senders] == [allowance_tag(s, key) for s in senders]
