"""The checkpoint store: exact folding in any grouping, compaction, retention, registry changes."""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.errors import StoreError, StoreUnavailable
from collector.folding import batch_from_plain, batch_to_plain, concat_batches, is_columnar
from collector.store import CheckpointStore, Store
from protocol.registry import Registry
from protocol.wire import DecodedReport, decode_report, encode_report
from tests.collector.stores import StoreSite
from tests.collector.support import (
    REGISTRY_TEXT,
    current_period,
    load_registry,
    plain_equal,
    privatized_reports,
    write_registry,
)

NOW = 1_709_294_400.0


@cache
def _fixture() -> tuple[Registry, dict[str, list[DecodedReport]]]:
    """A registry and 24 decoded reports per use case (built once: privatizing is the slow part)."""
    directory = Path(tempfile.mkdtemp(prefix="store-fixture-"))
    registry = load_registry(write_registry(directory))
    reports = {}
    for i, name in enumerate(sorted(registry.use_cases)):
        period = current_period(registry, name, NOW)
        made = privatized_reports(registry, name, 24, period=period, seed=40 + i)
        reports[name] = [decode_report(encode_report(r), registry) for r in made]
    return registry, reports


def _reference(registry: Registry, reports: list[DecodedReport]) -> Any:
    mech = reports[0].use_case.server
    agg = mech.new_aggregate()
    for r in reports:
        mech.fold(agg, r.batch)
    return agg


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["domains", "emoji", "flag", "hist", "home", "usage", "words"]),
    order=st.permutations(range(24)),
    cuts=st.lists(st.integers(min_value=1, max_value=23), max_size=5),
    compact_at=st.integers(min_value=0, max_value=6),
)
def test_any_grouping_and_order_of_commits_gives_the_same_aggregate(
    site: StoreSite, name: str, order: list[int], cuts: list[int], compact_at: int
) -> None:
    """Folding is exact whatever the commit grouping, order and compaction (merge is associative, commutative)."""
    registry, reports = _fixture()
    chosen = [reports[name][i] for i in order]
    bounds = [0, *sorted(set(cuts)), 24]
    with tempfile.TemporaryDirectory() as tmp:
        example = site.fresh("example") if site.server is not None else StoreSite("sqlite", Path(tmp) / "s.sqlite3")
        store = example.open(registry)
        try:
            for k, (a, b) in enumerate(itertools.pairwise(bounds)):
                store.commit(chosen[a:b], {})
                if k == compact_at:
                    for uc, period in store.compaction_candidates(1):
                        store.compact(uc, period)
            period = chosen[0].period
            stored, info = store.aggregate(registry[name].ref, period)
        finally:
            store.close()
    assert plain_equal(stored, _reference(registry, reports[name]))
    assert info.reports == 24


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["domains", "emoji", "flag", "hist", "home", "usage", "words"]), data=st.data())
def test_columnar_batches_concatenate_and_round_trip(name: str, data: st.DataObject) -> None:
    """Concatenated batches fold like the parts; their plain form restores them exactly."""
    registry, reports = _fixture()
    picks = data.draw(st.lists(st.sampled_from(reports[name]), min_size=1, max_size=6))
    batches = [r.batch for r in picks]
    joined = concat_batches(batches)
    assert joined is not None
    assert is_columnar(joined)
    assert len(joined) == sum(len(b) for b in batches)
    mech = registry.use_cases[name].server
    restored = batch_from_plain(mech.empty_batch(), batch_to_plain(joined))
    one, parts = mech.new_aggregate(), mech.new_aggregate()
    mech.fold(one, restored)
    for b in batches:
        mech.fold(parts, b)
    assert plain_equal(one, parts)


def _snapshot(store: Store) -> dict[tuple[str, int], object]:
    return {(k.use_case, k.period): (store.aggregate(k.use_case, k.period)[0].to_plain(), k) for k in store.totals()}


def test_compaction_folds_segments_into_the_base_without_changing_anything(site: StoreSite) -> None:
    """After compaction the segments are gone and every aggregate and total is unchanged."""
    registry, reports = _fixture()
    store = site.open(registry)
    try:
        for rs in reports.values():
            for i in range(0, 24, 6):
                store.commit(rs[i : i + 6], {"messages": 6})
        before = _snapshot(store)
        version = store.data_version()
        keys = store.compaction_candidates(4)
        assert len(keys) == len(reports)
        for uc, period in keys:
            assert store.compact(uc, period) == 4
        assert store.compaction_candidates(1) == []
        assert _snapshot(store) == before
        assert store.data_version() != version
        assert store.counters()["reports"] == 24 * len(reports)
    finally:
        store.close()


def test_retention_forgets_old_ids_and_never_reopens_their_periods(site: StoreSite) -> None:
    """Pruning drops ids below the low-water mark; the mark never goes down; old periods stay closed."""
    registry, reports = _fixture()
    flag = reports["flag"]
    ref = registry["flag"].ref
    now = flag[0].period
    store = site.open(registry)
    try:
        old = [_with_period(r, now - 3) for r in flag[:8]]
        store.commit(old, {})
        store.commit(flag[8:16], {})
        assert store.seen_count() == 16
        assert store.prune({ref: now - 1}) == 8
        assert store.low_water()[ref] == now - 1
        store.prune({ref: now - 10})  # a clock set back: the mark stays
        assert store.low_water()[ref] == now - 1
        # The forgotten ids' period is closed: replays are refused as expired, not folded again.
        result = store.commit(old, {})
        assert (result.reports, result.expired) == (0, 8)
        result = store.commit(flag[8:16] + flag[16:20], {})
        assert (result.reports, result.duplicates) == (4, 8)
        assert store.counters()["rejected:period-expired"] == 8
    finally:
        store.close()


def _with_period(report: DecodedReport, period: int) -> DecodedReport:
    return DecodedReport(
        use_case=report.use_case,
        period=period,
        report_id=bytes(b ^ 0x5A for b in report.report_id),
        batch=report.batch,
    )


def test_changed_parameters_start_new_aggregates(site: StoreSite, tmp_path: Path) -> None:
    """A use case whose mechanism parameters change gets fresh aggregates; the old ones stay, unmixed."""
    registry, reports = _fixture()
    store = site.open(registry)
    store.commit(reports["usage"], {})
    store.close()
    changed = load_registry(write_registry(tmp_path / "r2", REGISTRY_TEXT.replace("m = 3_600", "m = 7_200")))
    assert changed["usage"].ref != registry["usage"].ref
    assert changed["flag"].ref == registry["flag"].ref
    store = site.open(changed)
    try:
        assert store.totals(changed["usage"].ref) == []
        assert store.totals(changed["flag"].ref) == []  # flag had no data; unchanged use cases keep theirs
    finally:
        store.close()
    store = site.open(registry)
    try:
        assert store.totals(registry["usage"].ref)[0].reports == 24
    finally:
        store.close()
    assert site.query("SELECT count(*) FROM use_cases WHERE name = 'usage'") == [(2,)]


def test_unusable_databases_are_refused(tmp_path: Path) -> None:
    """A missing database (read-only), another schema version or a non-database file is a StoreError."""
    registry, _ = _fixture()
    with pytest.raises(StoreError, match="no checkpoint database"):
        CheckpointStore(tmp_path / "missing.sqlite3", registry, readonly=True)
    path = tmp_path / "s.sqlite3"
    CheckpointStore(path, registry).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = 99 WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99"):
        CheckpointStore(path, registry)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError):
        CheckpointStore(junk, registry)


def test_wal_mode_and_full_sync_are_on(tmp_path: Path) -> None:
    """The database is in WAL mode (readers never block the writer)."""
    registry, _ = _fixture()
    store = CheckpointStore(tmp_path / "s.sqlite3", registry)
    try:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        store.close()


def test_store_failures_that_can_pass_are_store_unavailable_with_a_cause(tmp_path: Path, registry: Registry) -> None:
    """A locked database and a removed database file give StoreUnavailable naming the cause; nothing is stored."""
    path = tmp_path / "s.sqlite3"
    store = CheckpointStore(path, registry, instance="t")
    try:
        reports = [
            decode_report(encode_report(r), registry)
            for r in privatized_reports(registry, "flag", 5, period=current_period(registry, "flag"), seed=1)
        ]
        store._db.execute("PRAGMA busy_timeout=0")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailable) as info:
            store.commit(reports, {"messages": 5})
        assert info.value.cause == "locked"
        assert str(path) in str(info.value)
        other.execute("ROLLBACK")
        other.close()
        assert store.commit(reports, {"messages": 5}).reports == 5  # the same batch, once the lock is gone
        path.unlink()
        with pytest.raises(StoreUnavailable) as info:
            store.commit(reports, {"messages": 5})
        assert info.value.cause == "vanished"
    finally:
        store.close()
