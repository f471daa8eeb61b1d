"""Every benchmark script has a test that runs it to completion at a small size."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import tests.benchmarks
from tests.benchmarks.support import COVERED, ELSEWHERE

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_tests() -> None:
    """Import every test module of this folder, so their ``covers`` marks are registered."""
    for info in pkgutil.iter_modules(tests.benchmarks.__path__):
        if info.name.startswith("test_"):
            importlib.import_module(f"tests.benchmarks.{info.name}")


def test_every_benchmark_script_has_a_small_run() -> None:
    """A new benchmarks/bench_*.py fails here until a test runs it small (``covers``)."""
    _load_tests()
    scripts = {path.stem for path in BENCHMARKS.glob("bench_*.py")}
    assert scripts, f"no bench_*.py under {BENCHMARKS}"
    missing = sorted(scripts - set(COVERED) - set(ELSEWHERE))
    assert not missing, (
        f"benchmarks without a small-size test: {missing} (mark one with tests.benchmarks.support.covers)"
    )
    # And nothing claims a script that is not there (a renamed benchmark keeps its test honest).
    assert set(COVERED) | set(ELSEWHERE) <= scripts


def test_the_small_runs_kept_elsewhere_exist() -> None:
    """Each test named in ELSEWHERE is a test function that exists where it says."""
    for name, target in ELSEWHERE.items():
        module, _, function = target.rpartition(".")
        assert callable(getattr(importlib.import_module(module), function, None)), f"{name}: {target} is not a test"
