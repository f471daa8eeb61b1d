"""The materialised aggregates the HTTP API reads: current with every commit, bounded, equal to the store's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from collector.config import CollectorConfig, parse_config
from collector.estimation import compute_estimate, compute_series
from collector.live import LiveAggregates
from collector.status import store_status
from collector.store import Store, footprint
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.stores import StoreSite
from tests.collector.support import current_period, plain_equal, privatized_reports, run_async

PERIOD_NOW = 1_709_294_400.0


def _config(site: StoreSite, registry_path: Path) -> CollectorConfig:
    return parse_config({"registry": str(registry_path), "store": site.table()})


@contextlib.asynccontextmanager
async def _view(
    site: StoreSite, registry: Registry, registry_path: Path
) -> AsyncIterator[tuple[CollectorConfig, Store, LiveAggregates]]:
    """The collector config, a store that commits (instance "w") and a live view of it; both closed after."""
    config = _config(site, registry_path)
    writer = site.open(registry, instance="w")
    live = LiveAggregates(config, registry)
    try:
        yield config, writer, live
    finally:
        await asyncio.to_thread(live.close)
        writer.close()


def _commit(store: Store, registry: Registry, name: str, count: int, *, period: int, seed: int) -> None:
    reports = privatized_reports(registry, name, count, period=period, seed=seed)
    result = store.commit([decode_report(encode_report(r), registry) for r in reports], {})
    assert result.keys == ((registry[name].ref, period),)


@run_async
async def test_estimates_follow_commits_reading_only_what_was_added(
    site: StoreSite, registry: Registry, registry_path: Path
) -> None:
    """After each commit the view folds only the new segments and serves what the store path computes."""
    period = current_period(registry, "emoji", PERIOD_NOW)
    async with _view(site, registry, registry_path) as (config, writer, live):
        _commit(writer, registry, "emoji", 60, period=period, seed=1)
        version, first = await live.estimate("emoji", period)
        assert first == compute_estimate(config, "emoji", period)
        assert first.reports == 60
        for i in range(3):
            _commit(writer, registry, "emoji", 40, period=period, seed=2 + i)
            live.committed([(registry["emoji"].ref, period)])
            runner = asyncio.create_task(live.run())
            await asyncio.sleep(0)
            for _ in range(6000):  # a generous deadline (60 s); counted, not timed
                if live.statistics().catch_ups == i + 1:
                    break
                await asyncio.sleep(0.01)
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            version_after, result = await live.estimate("emoji", period)
            assert version_after != version
            version = version_after
            assert result == compute_estimate(config, "emoji", period)
            assert result.reports == 60 + 40 * (i + 1)
        stats = live.statistics()
        assert stats.loads == 1  # the key was read whole once; every commit after was caught up
        assert stats.catch_ups == 3
        entry = live._entries[(registry["emoji"].ref, period)]  # white-box: the aggregate itself
        assert plain_equal(entry.aggregate, writer.aggregate(registry["emoji"].ref, period)[0])


@run_async
async def test_a_key_no_request_asked_for_is_not_materialised(
    site: StoreSite, registry: Registry, registry_path: Path
) -> None:
    """Commits to a key this member does not serve cost it nothing; the first request reads the key whole."""
    period = current_period(registry, "emoji", PERIOD_NOW)
    async with _view(site, registry, registry_path) as (config, writer, live):
        runner = asyncio.create_task(live.run())
        try:
            for i in range(3):
                _commit(writer, registry, "emoji", 20, period=period, seed=40 + i)
                live.committed([(registry["emoji"].ref, period)])
            # The fold runs on the aggregates thread; a status read queued behind it there
            # returns only once the fold task has run.
            await asyncio.sleep(0)
            await live.status()
            stats = live.statistics()
            assert (stats.resident, stats.loads, stats.catch_ups) == (0, 0, 0)
            _, result = await live.estimate("emoji", period)
            assert result == compute_estimate(config, "emoji", period)
            assert result.reports == 60
            assert (live.statistics().resident, live.statistics().loads) == (1, 1)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


@run_async
async def test_a_repeated_request_reuses_the_estimate_until_a_commit_changes_it(
    site: StoreSite, registry: Registry, registry_path: Path
) -> None:
    """The same version twice is one computation; a commit to another key does not invalidate it."""
    period = current_period(registry, "domains", PERIOD_NOW)
    async with _view(site, registry, registry_path) as (_, writer, live):
        _commit(writer, registry, "domains", 50, period=period, seed=3)
        v1, r1 = await live.estimate("domains")
        v2, r2 = await live.estimate("domains")
        assert v1 == v2
        assert r1 is r2
        assert (live.statistics().estimates, live.statistics().reused) == (1, 1)
        _commit(writer, registry, "emoji", 30, period=period, seed=4)  # another key
        v3, _ = await live.estimate("domains")
        assert v3 == v1
        assert live.statistics().estimates == 1
        _commit(writer, registry, "domains", 30, period=period, seed=5)
        v4, r4 = await live.estimate("domains")
        assert v4 != v1
        assert r4.reports == 80
        assert live.statistics().estimates == 2


@run_async
async def test_a_compaction_the_view_had_not_seen_is_read_afresh(
    site: StoreSite, registry: Registry, registry_path: Path
) -> None:
    """Segments compacted into the base before the view folded them make it reload the key, not miss them."""
    period = current_period(registry, "hist", PERIOD_NOW)
    async with _view(site, registry, registry_path) as (config, writer, live):
        _commit(writer, registry, "hist", 30, period=period, seed=6)
        await live.estimate("hist", period)
        _commit(writer, registry, "hist", 25, period=period, seed=7)
        assert writer.compact(registry["hist"].ref, period) == 2
        _, result = await live.estimate("hist", period)
        assert result == compute_estimate(config, "hist", period)
        assert result.reports == 55
        assert live.statistics().loads == 2
        # A compaction of segments it had already folded changes nothing.
        _commit(writer, registry, "hist", 10, period=period, seed=8)
        await live.estimate("hist", period)
        assert writer.compact(registry["hist"].ref, period) == 1
        _commit(writer, registry, "hist", 10, period=period, seed=9)
        _, result = await live.estimate("hist", period)
        assert result == compute_estimate(config, "hist", period)
        assert live.statistics().loads == 2


@run_async
async def test_memory_is_bounded_least_recently_used_first_out(
    site: StoreSite, registry: Registry, registry_path: Path
) -> None:
    """Resident aggregates stay under the bound; the oldest goes first; one larger than the bound is still served."""
    config = _config(site, registry_path)
    period = current_period(registry, "emoji", PERIOD_NOW)
    writer = site.open(registry, instance="w")
    for back in range(4):
        _commit(writer, registry, "emoji", 25, period=period - back, seed=10 + back)
    size = footprint(writer.aggregate(registry["emoji"].ref, period)[0])
    live = LiveAggregates(config, registry, memory_bytes=2 * size)
    try:
        for back in range(4):
            await live.estimate("emoji", period - back)
        stats = live.statistics()
        assert stats.resident == 2
        assert stats.bytes <= stats.bound
        assert stats.evictions == 2
        assert set(live._entries) == {(registry["emoji"].ref, period - 2), (registry["emoji"].ref, period - 3)}
        # A period without data is answered but not kept: it evicts nothing.
        _, empty = await live.estimate("emoji", period + 5)
        assert (empty.reports, empty.released) == (0, False)
        assert (live.statistics().resident, live.statistics().evictions) == (2, 2)
        tiny = LiveAggregates(config, registry, memory_bytes=size // 2)
        try:
            _, result = await tiny.estimate("emoji", period)
            assert result == compute_estimate(config, "emoji", period)
            assert tiny.statistics().resident == 0
        finally:
            await asyncio.to_thread(tiny.close)
    finally:
        await asyncio.to_thread(live.close)
        writer.close()


@run_async
async def test_series_and_status_match_the_store_path(site: StoreSite, registry: Registry, registry_path: Path) -> None:
    """The series and the status the API serves are the CLI's, plus the view's own counters."""
    period = current_period(registry, "usage", PERIOD_NOW)
    async with _view(site, registry, registry_path) as (config, writer, live):
        for back in range(3):
            _commit(writer, registry, "usage", 30, period=period - back, seed=20 + back)
        assert await live.series("usage") == compute_series(config, "usage")
        assert await live.status() == store_status(config)
        assert live.statistics().resident == 3
        # A use case first collected after the view opened is found (the connection reopens).
        _commit(writer, registry, "flag", 30, period=current_period(registry, "flag", PERIOD_NOW), seed=30)
        _, result = await live.estimate("flag")
        assert result.reports == 30
