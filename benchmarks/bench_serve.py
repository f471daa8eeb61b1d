"""The cost of an estimate request once the service holds its aggregate in memory.

``python -m benchmarks.bench_serve`` prints one JSON document. The deployed Count Mean
Sketch of ``deploy/usecases.example.toml`` (``emoji``: k = 65,536, m = 1,024, its 846-entry
dictionary) receives ``--records`` privatized records (Zipf population over the dictionary)
in ``--commits`` commits through the service's own parts: the checkpoint store on its thread
commits each batch, the materialised aggregates (``collector.live``) are told which keys
the commit added to, exactly as ingest tells them, and the maintenance compaction runs as
the service runs it. Then the HTTP API serves ``/api/v1/use-cases/emoji/estimate``:

* ``first_request_seconds``: the first request (the aggregate is already in memory, so it
  costs the estimate: about one dictionary query, ``dictionary_query_seconds``, three
  queries timed on the same aggregate right after);
* ``repeated_request_seconds``: the same request again, unchanged aggregate (the computed
  estimate is reused; the target is at most 50 ms);
* ``load_average``: the machine's load when the requests ran (a shared machine's scheduling
  shows in the slowest repeated request);
* ``store_path_seconds``: for comparison, the CLI's path (``compute_estimate``), which reads
  the base and the segments from SQLite and folds them for every request, as every request
  did before.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress, zipf_ranks
from collector.config import parse_config
from collector.estimation import compute_estimate, load_dictionary
from collector.http import HttpApi
from collector.ingest import StoreThread
from collector.live import LiveAggregates
from collector.store import CheckpointStore
from protocol.randomness import SeededRandom
from protocol.registry import UseCase, parse_registry
from protocol.server.cms import CMSServer

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
USE_CASE = "emoji"


@dataclass(frozen=True, slots=True)
class _Report:
    """What the store folds of a decoded report (``collector.store.FoldedReport``)."""

    use_case: UseCase
    period: int
    report_id: bytes
    batch: Any


def _get(url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body: bytes = r.read()
    return time.perf_counter() - start, body


async def _folded(store: StoreThread[CheckpointStore], live: LiveAggregates, period: int) -> Any:
    """The view's entry of the period once it has folded the last commit (in the background, as in the service)."""
    last = await store.call(lambda s: s.last_seq())
    for _ in range(60_000):
        entry = live._entries.get((USE_CASE, period))  # white-box: wait until current
        if entry is not None and entry.seq == last:
            break
        await asyncio.sleep(0.01)
    return live._entries[(USE_CASE, period)]


async def _run(records: int, commits: int, repeats: int, seed: int, work: Path) -> dict[str, Any]:
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    uc = registry.use_cases[USE_CASE]
    mech: Any = uc.mechanism
    config = parse_config(
        {
            "registry": str(REGISTRY),
            "store": {"path": str(work / "collector.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
        }
    )
    words = load_dictionary(uc, REGISTRY.parent)
    assert words is not None
    gen = np.random.default_rng(seed)
    rng = SeededRandom(seed)
    period = uc.period.index_at(time.time())
    per_commit = records // commits

    store = StoreThread(lambda: CheckpointStore(config.store.path, registry, instance="bench"))
    live = LiveAggregates(config, registry)
    folding = asyncio.create_task(live.run(), name="materialise")
    compactions = 0
    privatize_s = commit_s = 0.0
    try:
        progress(f"{records} records in {commits} commits (k={mech.k}, m={mech.m})")
        for c in range(commits):
            start = time.perf_counter()
            values = [words[r] for r in zipf_ranks(per_commit, len(words), gen)]
            batch = CMSServer(mech).privatize_many(values, rng)
            ids = gen.bytes(16 * per_commit)
            reports = [
                _Report(uc, period, ids[16 * i : 16 * i + 16], batch.take(np.arange(i, i + 1)))
                for i in range(per_commit)
            ]
            privatize_s += time.perf_counter() - start
            start = time.perf_counter()
            result = await store.call(functools.partial(CheckpointStore.commit, reports=reports, counters={}))
            commit_s += time.perf_counter() - start
            live.committed(result.keys)  # what Ingest.on_commit does in the service
            if c % 50 == 49:  # the service's maintenance task, every few seconds
                keys = await store.call(functools.partial(CheckpointStore.compaction_candidates, compact_after=64))
                for use_case, key_period in keys:
                    compact = functools.partial(CheckpointStore.compact, use_case=use_case, period=key_period)
                    compactions += bool(await store.call(compact))
                progress(f"  {c + 1} commits, {compactions} compactions")
        entry = await _folded(store, live, period)
        assert entry.info.records == records

        api = HttpApi(config, live=live)
        port = await api.start()
        url = f"http://127.0.0.1:{port}/api/v1/use-cases/{USE_CASE}/estimate"
        first, body = await asyncio.to_thread(_get, url)
        repeated = [(await asyncio.to_thread(_get, url))[0] for _ in range(repeats)]
        await api.close()

        aggregate: Any = entry.aggregate  # a CMSAggregate: its dictionary query, timed alone
        queries = [_timed(lambda: aggregate.estimate(list(words))) for _ in range(3)]
        store_path = _timed(lambda: compute_estimate(config, USE_CASE))
        stats = live.statistics()
    finally:
        folding.cancel()
        await asyncio.gather(folding, return_exceptions=True)
        await asyncio.to_thread(live.close)
        store.close()
    return {
        "use_case": USE_CASE,
        "k": mech.k,
        "m": mech.m,
        "dictionary": len(words),
        "records": records,
        "commits": commits,
        "compactions": compactions,
        "privatize_seconds": round(privatize_s, 2),
        "commit_seconds": round(commit_s, 2),
        "first_request_seconds": round(first, 4),
        "repeated_request_seconds": {
            "median": round(statistics.median(repeated), 4),
            "p90": round(statistics.quantiles(repeated, n=10)[-1], 4),
            "max": round(max(repeated), 4),
            "count": len(repeated),
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
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
    }


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    """Run the benchmark and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        emit(asyncio.run(_run(args.records, args.commits, args.repeats, args.seed, Path(work))))


if __name__ == "__main__":
    main()
