"""Protocol speed: client privatize and server aggregate throughput, estimate times.

Run: ``python -m benchmarks.bench_protocol [--n N] [--only NAME ...] [--small]``. Prints JSON.
Targets: aggregation >= 2e6 records/s for rr, 1BitMean and dBitFlip (d <= 4); >= 1e6 for
RAPPOR (k = 128) and HCMS; >= 5e5 for CMS (m = 1024); privatize >= 5e4 records/s with CSPRNG
coins; CMS dictionary query at k = 65,536, m = 1,024, 250,000 candidates <= 60 s; HCMS
transform (k = 1,024, m = 32,768) <= 2 s; the frequency oracles' own targets
(:mod:`benchmarks.bench_oracles`). ``--small`` runs the sketches (CMS, HCMS, SFP) at
the fleet simulator's sizes with 10,000-entry dictionaries, for the tests: every step, none
of the figures above.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import emit, progress

MODULES = [
    "bench_randomized_response",
    "bench_one_bit_mean",
    "bench_dbitflip",
    "bench_rappor",
    "bench_cms",
    "bench_hcms",
    "bench_sfp",
    "bench_oracles",
]


def run(n: int, *, only: Sequence[str] = (), small: bool = False) -> dict[str, Any]:
    """The selected protocol benchmarks at ``n`` records each; one JSON-ready document."""
    rows: list[dict[str, Any]] = []
    for name in MODULES:
        if only and not any(o in name for o in only):
            continue
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            progress(f"skip {name}: {exc}")
            continue
        progress(f"running {name} (n={n:,}{', small' if small else ''})")
        rows.extend(module.bench(n, small=small))
    return {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "results": rows}


def main(argv: Sequence[str] | None = None) -> None:
    """Run the selected protocol benchmarks and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="records per mechanism (default 10^6)")
    parser.add_argument("--only", action="append", default=[], help="run only modules containing this text")
    parser.add_argument("--small", action="store_true", help="small sketches and dictionaries (for the tests)")
    args = parser.parse_args(argv)
    emit(run(args.n, only=args.only, small=args.small))


if __name__ == "__main__":
    main()
