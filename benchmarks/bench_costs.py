"""The small costs the device-side code is written around: what a fresh interpreter pays to import
a library the agent avoids or defers, what the OS CSPRNG takes per request, and what RAPPOR's
pure-Python instantaneous response costs against numpy's.

Run: ``.venv/bin/python -m benchmarks.bench_costs`` (prints one JSON document on stdout; docs/benchmarks.md
shows its figures, with the date of the run it took them from).

* ``imports``: for each import, the CPU time (user and system) and the resident memory of a fresh
  interpreter that makes it, less those of a bare one (``python -c pass``), the medians of
  ``--runs`` runs: ``importlib.metadata`` (only ``--version`` needs it, ``runtime/console.py``),
  ``cryptography.x509`` (only a client certificate, ``runtime/tls.py``, ``agent/identity.py``),
  cryptography's AES-GCM (the fallback of ``agent/aes_gcm.py``) and APScheduler's cron trigger
  (which ``agent/schedule.py`` replaced);
* ``urandom``: ``os.urandom`` of 8 KiB (the coins of a 1,024-coordinate CMS record, a device's
  largest request) and of 1 MiB, the median of many calls (``protocol/randomness.py``);
* ``rappor_irr``: RAPPOR's instantaneous response of one report at ``k = 128`` (004 §5.4), the
  device's pure path (``Rappor._irr_packed``) and the same two comparisons with numpy, the
  medians of many reports (``protocol/rappor.py``).

``--small`` is the suite's run: fewer repetitions, the same figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress
from protocol.randomness import SeededRandom
from protocol.rappor import Rappor

IMPORTS = {
    "importlib_metadata": "import importlib.metadata",
    "cryptography_x509": "from cryptography import x509",
    "cryptography_aes_gcm": "from cryptography.hazmat.primitives.ciphers.aead import AESGCM",
    "apscheduler_cron": "from apscheduler.triggers.cron import CronTrigger",
}
"""The imports measured, by name."""


def fresh_interpreter(code: str) -> tuple[float, float]:
    """CPU milliseconds (user and system) and resident MiB of a fresh interpreter that runs ``code``."""
    # The child reads its own resident memory: wait4's peak would be this (forking) process's.
    probe = f"{code}\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])"
    proc = subprocess.Popen([sys.executable, "-c", probe], cwd="/", stdout=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stdout is not None
    with proc.stdout:
        rss_kb = int(proc.stdout.read())
    if proc.returncode:
        raise RuntimeError(f"{code!r} failed in a fresh interpreter ({proc.returncode})")
    return 1000 * (usage.ru_utime + usage.ru_stime), rss_kb / 1024


def _imports(runs: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, code in {"bare": "pass", **IMPORTS}.items():
        progress(f"costs: {name}")
        samples = [fresh_interpreter(code) for _ in range(runs)]
        out[name] = {
            "cpu_ms": round(statistics.median(c for c, _ in samples), 1),
            "rss_mib": round(statistics.median(r for _, r in samples), 2),
        }
    bare = out["bare"]
    for name in IMPORTS:
        out[name]["added_cpu_ms"] = round(out[name]["cpu_ms"] - bare["cpu_ms"], 1)
        out[name]["added_rss_mib"] = round(out[name]["rss_mib"] - bare["rss_mib"], 2)
    return out


def _median_us(fn: Callable[[], object], calls: int) -> float:
    """The median wall time of one call of ``fn``, in microseconds."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e6 * statistics.median(times), 2)


def _urandom(calls: int) -> dict[str, float]:
    progress("costs: os.urandom")
    return {
        "8KiB_us": _median_us(lambda: os.urandom(8192), calls),
        "1MiB_us": _median_us(lambda: os.urandom(1 << 20), max(calls // 40, 5)),
    }


def _rappor_irr(calls: int) -> dict[str, float]:
    """One report's instantaneous response at the deployed RAPPOR parameters, both ways."""
    progress("costs: rappor instantaneous response")
    mech = Rappor(k=128, h=2, cohorts=32, f=0.75, p=0.5, q=0.75, seed=bytes(16))
    rng = SeededRandom(1)
    packed = bytes(range(16))
    one, zero = np.uint64(mech.irr_one_coin.numerator), np.uint64(mech.irr_zero_coin.numerator)
    bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8)).astype(np.bool_)

    def with_numpy() -> bytes:
        words = rng.words(mech.k)
        return np.packbits(np.where(bits, words < one, words < zero)).tobytes()

    return {
        "pure_us": _median_us(lambda: mech._irr_packed(packed, rng), calls),
        "numpy_us": _median_us(with_numpy, calls),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per import (default 7)")
    parser.add_argument("--calls", type=int, default=4_000, help="calls per timed step (default 4,000)")
    parser.add_argument("--small", action="store_true", help="the suite's run: 2 interpreters, 200 calls")
    args = parser.parse_args(argv)
    runs, calls = (2, 200) if args.small else (args.runs, args.calls)
    result: dict[str, Any] = {
        "benchmark": "bench_costs",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "imports": _imports(runs),
        "urandom": _urandom(calls),
        "rappor_irr": _rappor_irr(calls),
    }
    emit(result)


if __name__ == "__main__":
    main()
