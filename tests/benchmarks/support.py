"""What the benchmarks' small-size tests share: which test runs which benchmark, and reading a run's JSON.

Each test that runs a benchmark (a ``benchmarks/bench_*.py`` script) says so with
:func:`covers`; ``test_every_benchmark.py`` fails when a script has no such test. The tests
assert what does not depend on the machine's speed (counts, precision, recall, coverage,
errors against their standard errors, exactness) and only print the speed figures: at
these sizes, on a shared machine, they are noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pytest

__all__ = ["COVERED", "ELSEWHERE", "covers", "report", "require_keys", "run_main"]

F = TypeVar("F", bound=Callable[..., Any])

COVERED: dict[str, str] = {}
"""Benchmark module name (``bench_agent``) -> the test that runs it small."""

ELSEWHERE = {
    # Its small run (a 600-message stream through a one- and a three-member group) has been in
    # the collector's tests since the benchmark was written; it runs there, once.
    "bench_collector": "tests.collector.test_bench_collector.test_a_small_group_run_reports_every_mode_and_target",
}
"""Benchmarks whose small run is a test outside this folder: module name -> that test."""


def covers(*modules: str) -> Callable[[F], F]:
    """Mark a test as the small-size run of the benchmark ``modules`` (``bench_*`` names)."""

    def mark(test: F) -> F:
        for module in modules:
            COVERED.setdefault(module, f"{test.__module__}.{test.__name__}")
        return test

    return mark


def run_main(main: Callable[[list[str]], None], argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """Run a benchmark's ``main(argv)`` and return the one JSON document it printed on stdout."""
    capsys.readouterr()  # anything printed before is not the benchmark's
    main(list(argv))
    out = capsys.readouterr().out
    return json.loads(out)


def require_keys(doc: Mapping[str, Any], keys: Iterable[str], *, where: str) -> None:
    """Fail naming every key of ``keys`` that ``doc`` lacks or holds as null or NaN."""
    missing = [k for k in keys if k not in doc or doc[k] is None or (isinstance(doc[k], float) and math.isnan(doc[k]))]
    assert not missing, f"{where}: missing or empty {missing}; has {sorted(doc)}"


def report(name: str, figures: Mapping[str, Any]) -> None:
    """Print a benchmark's speed figures (shown with ``pytest -rP``); never asserted."""
    shown = ", ".join(f"{k} = {v}" for k, v in figures.items())
    print(f"{name}: {shown}")
