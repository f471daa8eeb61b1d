"""The typed results at the edge: a large estimate written as JSON, msgspec Structs against
the plain dictionaries and ``json.dumps`` they replaced.

A frequency estimate asked for with its withheld entries (``?withheld=1``, what the fleet and
an auditor read) lists every dictionary entry: 20,000 entries here, 4 MB of JSON. Printed:
the seconds to encode it each way (median of a few runs), the encoded sizes, and the memory
the entries take as Structs and as dictionaries (``tracemalloc``). docs/design.md, "Typed
results", quotes the figures.

    python -m benchmarks.bench_results [--entries 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence

import msgspec

from benchmarks.harness import emit
from collector.results import EstimateResult, FrequencyEntry, ReleaseDecision, to_json

__all__ = ["main", "measure"]


def _fields(n: int, released: int) -> list[dict[str, object]]:
    rng = random.Random(1)
    return [
        {
            "value": f"word-{i}",
            "count": rng.random() * 1e4,
            "standard_error": rng.random() * 100,
            "ci": (rng.random(), rng.random() + 1),
            "z": rng.random(),
            "p_value": rng.random(),
            "released": i < released,
            "withheld_reason": None if i < released else "below the release threshold",
        }
        for i in range(n)
    ]


def _entries(n: int, released: int) -> tuple[FrequencyEntry, ...]:
    return tuple(msgspec.convert(f, FrequencyEntry) for f in _fields(n, released))


def _estimate(entries: tuple[FrequencyEntry, ...], released: int) -> EstimateResult:
    return EstimateResult(
        use_case="words",
        definition="words@00000000",
        description="",
        mechanism="cms",
        kind="frequencies",
        period=1,
        period_length="1d",
        period_start="2026-01-01T00:00:00Z",
        period_end="2026-01-02T00:00:00Z",
        reports=1_000_000,
        records=1_000_000,
        min_reports=1000,
        release_threshold=1000,
        confidence=0.95,
        epsilon=4.0,
        epsilon_report=4.0,
        released=True,
        withheld_reason=None,
        estimate=ReleaseDecision(
            items=entries[:released],
            withheld=len(entries) - released,
            threshold=1000,
            tested=len(entries),
            correction="bh",
            alpha=0.05,
            test="one-sided test of count > 1000, bh at alpha = 0.05",
            withheld_items=entries[released:],
        ),
    )


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _traced_bytes(build: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        kept = build()
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return size


def measure(entries: int, repeat: int) -> dict[str, object]:
    """Encode one estimate of ``entries`` entries both ways; the figures as a JSON-ready row."""
    released = max(1, entries // 40)
    result = _estimate(_entries(entries, released), released)
    plain = msgspec.to_builtins(result)
    as_dicts = json.dumps(plain, sort_keys=True, allow_nan=False).encode()
    as_structs = to_json(result)
    if json.loads(as_dicts) != json.loads(as_structs):
        raise AssertionError("the two encodings differ")
    return {
        "entries": entries,
        "encode_dicts_json_dumps_s": round(
            _median_seconds(lambda: json.dumps(plain, sort_keys=True).encode(), repeat), 5
        ),
        "encode_structs_msgspec_s": round(_median_seconds(lambda: to_json(result), repeat), 5),
        "bytes_dicts": len(as_dicts),
        "bytes_structs": len(as_structs),
        "memory_entries_as_dicts_bytes": _traced_bytes(lambda: _fields(entries, released)),
        "memory_entries_as_structs_bytes": _traced_bytes(lambda: _entries(entries, released)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Print the figures as one JSON document."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_results", description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=20_000, help="entries in the estimate (default 20,000)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per timing; the median is kept (default 7)")
    args = parser.parse_args(argv)
    emit({"benchmark": "results", "rows": [measure(args.entries, args.repeat)]})


if __name__ == "__main__":
    main()
