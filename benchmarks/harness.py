"""Small helpers shared by the benchmarks: timing and JSON output."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any


def seconds(fn: Callable[[], object], *, repeat: int = 1) -> float:
    """Best wall-clock time of ``repeat`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def rate(count: int, elapsed: float) -> float:
    """Items per second, rounded for reading."""
    return round(count / elapsed, 1) if elapsed > 0 else float("inf")


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries only JSON)."""
    print(message, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    """Print one JSON document on stdout."""
    print(json.dumps(result, indent=2, sort_keys=True))
