"""The cost of an estimate request as the running service serves it from its materialised aggregates.

``python -m benchmarks.bench_serve`` prints one JSON document. The deployed Count Mean
Sketch of ``deploy/usecases.example.toml`` (``emoji``: k = 65,536, m = 1,024, its 846-entry
dictionary; ``--registry`` names another registry with an ``emoji`` CMS, e.g. the
simulator's smaller one) receives ``--records`` privatized records (Zipf population over
the dictionary) in ``--commits`` commits through the service's own parts: the checkpoint
store on its thread commits each batch, the materialised aggregates (``collector.live``)
are told which keys the commit added to, exactly as ingest tells them, and the maintenance
compaction runs as the service runs it.

The live view keeps current only the keys a request has made resident (``collector/live.py``),
so the HTTP API serves ``/api/v1/use-cases/emoji/estimate`` at two moments:

* ``first_request_seconds``: the first request for the key, after all but the last tenth
  of the commits: nothing is resident yet, so it reads the aggregate from the store (the
  base and the segments not yet compacted), keeps it and computes the estimate;
* then the last tenth of the commits lands and the view's background task folds each into
  the now resident aggregate (``catch_ups``), as it does in the service;
  ``current_request_seconds`` is the next request: the aggregate already in memory and
  current, so it costs the estimate, about one dictionary query
  (``dictionary_query_seconds``, three queries timed on the same aggregate right after);
* ``repeated_request_seconds``: the same request again, unchanged aggregate (the computed
  estimate is reused; the target is at most 50 ms);
* ``load_average``: the machine's load when the requests ran (a shared machine's scheduling
  shows in the slowest repeated request);
* ``store_path_seconds``: for comparison, the CLI's path (``compute_estimate``), which reads
  the base and the segments from SQLite and folds them for every request.

``checks`` says what does not depend on the machine's speed: the view holds every record
committed, the served estimate is the store path's, to the byte of its JSON, and every
repeated request reused the computed estimate.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress, zipf_ranks
from collector.config import CollectorConfig, parse_config
from collector.estimation import compute_estimate, load_dictionary
from collector.http import HttpApi
from collector.ingest import StoreThread
from collector.live import LiveAggregates
from collector.results import EstimateResult, to_json
from collector.store import CheckpointStore
from collector.threads import numpy_threads
from protocol.randomness import SeededRandom
from protocol.registry import UseCase, parse_registry

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
USE_CASE = "emoji"
TAIL_SHARE = 10
"""The last ``1 / TAIL_SHARE`` of the commits land after the first request made the key resident."""
CURRENT_WITHIN_S = 600.0
"""How long the background fold may take to catch up with the last commit before the run fails."""


@dataclass(frozen=True, slots=True)
class _Report:
    """What the store folds of a decoded report (``collector.store.FoldedReport``)."""

    use_case: UseCase
    period: int
    report_id: bytes
    batch: Any


@dataclass
class _Feed:
    """The commits of the run, made and committed as ingest would."""

    uc: UseCase
    words: list[str]
    period: int
    per_commit: int
    gen: np.random.Generator
    rng: SeededRandom
    store: StoreThread[CheckpointStore]
    live: LiveAggregates
    done: int = 0
    compactions: int = 0
    privatize_s: float = 0.0
    commit_s: float = 0.0

    async def commit(self, count: int) -> None:
        """``count`` more commits, each followed by the notice ingest gives the live view."""
        server: Any = self.uc.server
        for _ in range(count):
            start = time.perf_counter()
            values = [self.words[r] for r in zipf_ranks(self.per_commit, len(self.words), self.gen)]
            batch = server.privatize_many(values, self.rng)
            ids = self.gen.bytes(16 * self.per_commit)
            reports = [
                _Report(self.uc, self.period, ids[16 * i : 16 * i + 16], batch.take(np.arange(i, i + 1)))
                for i in range(self.per_commit)
            ]
            self.privatize_s += time.perf_counter() - start
            start = time.perf_counter()
            result = await self.store.call(functools.partial(CheckpointStore.commit, reports=reports, counters={}))
            self.commit_s += time.perf_counter() - start
            self.live.committed(result.keys)  # what Ingest.on_commit does in the service
            self.done += 1
            if self.done % 50 == 0:  # the service's maintenance task, every few seconds
                await self._compact()
                progress(f"  {self.done} commits, {self.compactions} compactions")

    async def _compact(self) -> None:
        keys = await self.store.call(functools.partial(CheckpointStore.compaction_candidates, compact_after=64))
        for use_case, key_period in keys:
            compact = functools.partial(CheckpointStore.compact, use_case=use_case, period=key_period)
            self.compactions += bool(await self.store.call(compact))


def _get(url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body: bytes = r.read()
    return time.perf_counter() - start, body


async def _current(feed: _Feed) -> Any:
    """The view's resident entry of the key once its background task has folded the last commit."""
    last = await feed.store.call(lambda s: s.last_seq())
    key = (feed.uc.ref, feed.period)  # aggregates are keyed by definition ref (docs/wire-format.md)
    deadline = time.monotonic() + CURRENT_WITHIN_S
    while True:
        entry = feed.live._entries.get(key)  # white-box: wait until current
        if entry is not None and entry.seq == last:
            return entry
        if time.monotonic() > deadline:
            raise RuntimeError(f"the live view did not fold commit {last} of {key} within {CURRENT_WITHIN_S} s")
        await asyncio.sleep(0.01)


async def _requests(feed: _Feed, api: HttpApi, *, tail: int, repeats: int) -> tuple[dict[str, Any], Any, bytes]:
    """The first request, the last ``tail`` commits, the request once they are folded in, and
    ``repeats`` more; their times, the view's entry of the key and the last full response."""
    port = await api.start()
    url = f"http://127.0.0.1:{port}/api/v1/use-cases/{USE_CASE}/estimate"
    first, _ = await asyncio.to_thread(_get, url)
    progress(f"first request {first:.2f} s; {tail} more commits, folded into the resident aggregate")
    await feed.commit(tail)
    entry = await _current(feed)
    current, body = await asyncio.to_thread(_get, url)
    repeated = [(await asyncio.to_thread(_get, url))[0] for _ in range(repeats)]
    times = {
        "first_request_seconds": round(first, 4),
        "current_request_seconds": round(current, 4),
        "repeated_request_seconds": {
            "median": round(statistics.median(repeated), 4),
            "p90": round(statistics.quantiles(repeated, n=10)[-1], 4),
            "max": round(max(repeated), 4),
            "count": len(repeated),
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    return times, entry, body


def _config(registry: Path, work: Path) -> CollectorConfig:
    return parse_config(
        {
            "registry": str(registry),
            "store": {"path": str(work / "collector.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
        }
    )


async def _run(
    records: int, commits: int, repeats: int, seed: int, *, registry_path: Path, work: Path
) -> dict[str, Any]:
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    uc = registry.use_cases[USE_CASE]
    mech: Any = uc.mechanism
    config = _config(registry_path, work)
    words = load_dictionary(uc, registry_path.parent)
    assert words is not None
    period = uc.period.index_at(time.time())
    tail = max(1, commits // TAIL_SHARE)

    store = StoreThread(lambda: CheckpointStore(config.store.path, registry, instance="bench"))
    live = LiveAggregates(config, registry)
    folding = asyncio.create_task(live.run(), name="materialise")
    feed = _Feed(
        uc=uc,
        words=list(words),
        period=period,
        per_commit=records // commits,
        gen=np.random.default_rng(seed),
        rng=SeededRandom(seed),
        store=store,
        live=live,
    )
    api = HttpApi(config, live=live)
    try:
        progress(f"{records} records in {commits} commits (k={mech.k}, m={mech.m})")
        await feed.commit(commits - tail)
        requests, entry, body = await _requests(feed, api, tail=tail, repeats=repeats)
        await api.close()

        aggregate: Any = entry.aggregate  # a CMSAggregate: its dictionary query, timed alone
        with numpy_threads() as threads:  # the service's (collector.threads)
            queries = [_timed(lambda: aggregate.estimate(list(words), threads=threads)) for _ in range(3)]
        stored: list[EstimateResult] = []
        store_path = _timed(lambda: stored.append(compute_estimate(config, USE_CASE)))
        stats = live.statistics()
        held = entry.info.records
    finally:
        await api.close()
        folding.cancel()
        await asyncio.gather(folding, return_exceptions=True)
        await asyncio.to_thread(live.close)
        store.close()
    served = json.loads(body)
    return {
        "use_case": USE_CASE,
        "registry": str(registry_path),
        "k": mech.k,
        "m": mech.m,
        "dictionary": len(words),
        "records": records,
        "commits": commits,
        "commits_after_first_request": tail,
        "compactions": feed.compactions,
        "privatize_seconds": round(feed.privatize_s, 2),
        "commit_seconds": round(feed.commit_s, 2),
        **requests,
        "dictionary_query_seconds": [round(q, 4) for q in queries],
        "store_path_seconds": round(store_path, 2),
        "response_bytes": len(body),
        "materialised": {
            "resident": stats.resident,
            "mib": round(stats.bytes / 2**20, 1),
            "bound_mib": round(stats.bound / 2**20, 1),
            "loads": stats.loads,
            "catch_ups": stats.catch_ups,
            "estimates": stats.estimates,
            "reused": stats.reused,
        },
        "checks": {
            "records_held": held,
            "every_record_held": held == feed.done * feed.per_commit,
            "served_equals_store_path": served == json.loads(to_json(stored[0])),
            "repeated_requests_reused": stats.reused == repeats,
        },
    }


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--registry",
        type=Path,
        default=REGISTRY,
        help=f"a registry whose {USE_CASE!r} use case is a CMS with a dictionary (default: the deployed one)",
    )
    args = parser.parse_args(argv)
    if args.commits < 2 or args.records < args.commits:
        parser.error("--commits takes at least 2, and --records at least one record per commit")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        doc = asyncio.run(
            _run(
                args.records,
                args.commits,
                args.repeats,
                args.seed,
                registry_path=args.registry.resolve(),
                work=Path(work),
            )
        )
    emit(doc)


if __name__ == "__main__":
    main()
