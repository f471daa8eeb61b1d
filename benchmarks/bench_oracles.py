"""Speed of the frequency oracles at the local-privacy limit (olh, grr, oue, ss, pgr).

Run: ``python -m benchmarks.bench_oracles [--n N] [--small]`` (also part of
``python -m benchmarks.bench_protocol``). Prints JSON with each target and whether it was met.

Per mechanism and domain size: the device's single ``privatize`` calls with the OS CSPRNG (what
an agent does per event), the simulator's batch path, wire decoding, aggregation, and the
estimate. Targets (docs/estimation.md, "Frequency oracles at the local-privacy limit"):

* device privatize >= 5e4 reports/s for ``grr``, ``olh`` and ``pgr`` at k = 8, 843 and 65,536;
  >= 1e4 for ``oue`` and ``ss`` at k = 843 (their records grow with k);
* an ``olh`` estimate of 65,536 candidates from 10^6 reports <= 5 s;
* ``pgr``'s reconstruction at k = 65,536, ε = 4, from 10^6 reports <= 10 s (a Fourier table), and
  the same at ε = 8 (q = 2,039, t = 3: summed hyperplane by hyperplane), held to the same 10 s.

``--small`` runs every step at k <= 843 and 2,000 reports, for the tests: none of the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress, rate, seconds, zipf_ranks
from collector.threads import numpy_threads
from protocol.grr import GeneralizedRandomizedResponse
from protocol.interfaces import Mechanism
from protocol.olh import OptimalLocalHashing
from protocol.oue import OptimizedUnaryEncoding
from protocol.pgr import ProjectiveGeometryResponse
from protocol.randomness import SeededRandom, SystemRandom
from protocol.server.contract import server_of
from protocol.server.pgr import ENUMERATION_COLUMNS, hyperplane_sums
from protocol.ss import SubsetSelection

__all__ = ["bench", "main"]

SEED = b"ldp-telemetry/bench/oracles"
PRIVATIZE_TARGET = {"grr": 5e4, "olh": 5e4, "pgr": 5e4, "oue": 1e4, "ss": 1e4}
"""Device privatize, reports per second of one core."""
OLH_QUERY_TARGET_S = 5.0
PGR_RECONSTRUCT_TARGET_S = 10.0
_SINGLES = 20_000


def _categories(k: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(k))


def _cases(small: bool) -> list[tuple[Mechanism, int]]:
    """(mechanism, domain size) at ε = 4: each of grr, olh, pgr at three sizes, oue and ss at 843."""
    sizes = (8, 843) if small else (8, 843, 65_536)
    out: list[tuple[Mechanism, int]] = []
    for k in sizes:
        out.append((GeneralizedRandomizedResponse(epsilon=4.0, categories=_categories(k)), k))
        out.append((OptimalLocalHashing(epsilon=4.0, seed=SEED), k))
        out.append((ProjectiveGeometryResponse(epsilon=4.0, categories=_categories(k)), k))
    out.append((OptimizedUnaryEncoding(epsilon=4.0, categories=_categories(843)), 843))
    out.append((SubsetSelection(epsilon=4.0, categories=_categories(843)), 843))
    return out


def _row(mech: Mechanism, k: int, n: int) -> dict[str, Any]:
    server: Any = server_of(mech)
    names = _categories(k)
    values = [names[r] for r in zipf_ranks(n, k, np.random.default_rng(1))]
    csprng = SystemRandom()
    singles = values[: min(n, _SINGLES)]
    mech.privatize_plain(values[0], None, csprng)  # lazy set-up (tables, hash coefficients) untimed
    cpu0 = time.process_time()
    wire = [mech.privatize_plain(v, None, csprng)[0] for v in singles]
    single_cpu = time.process_time() - cpu0
    batch_s = seconds(lambda: server.privatize_many(values, SeededRandom(2)))
    batch = server.privatize_many(values, SeededRandom(2))
    decode_s = seconds(lambda: server.decode_records(wire), repeat=2)
    agg = server.new_aggregate()
    add_s = seconds(lambda: server.fold(agg, batch))
    estimate_s = seconds(lambda: server.estimate_frequencies(agg, list(names)))
    target = PRIVATIZE_TARGET[mech.name]
    privatize = rate(len(singles), single_cpu)
    return {
        "mechanism": mech.name,
        "k": k,
        "n": n,
        "record_bytes": mech.max_record_bytes,
        "privatize_per_s": privatize,
        "privatize_target_per_s": target,
        "privatize_met": privatize >= target,
        "privatize_batch_per_s": rate(n, batch_s),
        "decode_per_s": rate(len(wire), decode_s),
        "aggregate_per_s": rate(n, add_s),
        "estimate_s": round(estimate_s, 4),
    }


def _olh_query(n: int, candidates: int) -> dict[str, Any]:
    """An ``olh`` estimate of ``candidates`` dictionary entries from ``n`` reports (default family)."""
    mech = OptimalLocalHashing(epsilon=4.0, seed=SEED)
    server: Any = server_of(mech)
    names = [f"site-{i}.example" for i in range(candidates)]
    values = [names[r] for r in zipf_ranks(n, candidates, np.random.default_rng(3))]
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, SeededRandom(4)))
    with numpy_threads() as threads:  # the service's (collector.threads)
        query_s = seconds(lambda: server.estimate_frequencies(agg, names, threads=threads))
    return {
        "seeds": mech.seeds,
        "g": mech.g,
        "n": n,
        "candidates": candidates,
        "query_s": round(query_s, 3),
        "target_s": OLH_QUERY_TARGET_S,
        "met": query_s <= OLH_QUERY_TARGET_S,
    }


def _sums_seconds(server: Any, counts: Any, columns: int) -> float:
    """Best of two timings of the hyperplane sums taking ``columns`` assignments per step."""
    mech = server.mechanism
    vectors = server.category_vectors
    return seconds(lambda: hyperplane_sums(counts, vectors, mech.q, mech.t, columns=columns), repeat=2)


def _pgr_reconstruct(n: int, k: int, epsilon: float) -> dict[str, Any]:
    """``pgr``'s support counts of ``k`` categories from ``n`` reports at ε (its default geometry)."""
    mech = ProjectiveGeometryResponse(epsilon=epsilon, categories=_categories(k))
    server: Any = server_of(mech)
    values = [mech.categories[r] for r in zipf_ranks(n, k, np.random.default_rng(5))]
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, SeededRandom(6)))
    reconstruct_s = seconds(lambda: server.support_counts(agg.counts, agg.n))
    extra: dict[str, Any] = {}
    if mech.reconstruction == "enumeration":
        # The step width of the hyperplane sums (protocol.server.pgr.ENUMERATION_COLUMNS) against
        # others, down to a category's whole hyperplane per step (q points for t = 3).
        widths = sorted({4, ENUMERATION_COLUMNS, 16, 32, mech.q})
        extra["sums_s_by_step"] = {str(w): round(_sums_seconds(server, agg.counts, w), 3) for w in widths}
        extra["sums_step"] = ENUMERATION_COLUMNS
    return extra | {
        "epsilon": epsilon,
        "q": mech.q,
        "t": mech.t,
        "reconstruction": mech.reconstruction,
        "points": mech.geometry.points,
        "n": n,
        "k": k,
        "reconstruct_s": round(reconstruct_s, 3),
        "target_s": PGR_RECONSTRUCT_TARGET_S,
        "met": reconstruct_s <= PGR_RECONSTRUCT_TARGET_S,
    }


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """The rows :mod:`benchmarks.bench_protocol` collects: one per (mechanism, k), then the two estimates."""
    rows = []
    for mech, k in _cases(small):
        progress(f"oracles: {mech.name} at k = {k:,}")
        rows.append(_row(mech, k, n))
    big = 2_000 if small else 1_000_000
    progress(f"oracles: olh estimate of {('843' if small else '65,536')} candidates from {big:,} reports")
    rows.append({"mechanism": "olh", "step": "query", **_olh_query(big, 843 if small else 65_536)})
    for epsilon in (4.0, 8.0):
        progress(f"oracles: pgr reconstruction at ε = {epsilon:g}")
        row = _pgr_reconstruct(big, 843 if small else 65_536, epsilon)
        rows.append({"mechanism": "pgr", "step": "reconstruct", **row})
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the oracles' speed benchmark and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000, help="reports per mechanism for the speed rows")
    parser.add_argument("--small", action="store_true", help="k <= 843 and 2,000 reports (for the tests)")
    args = parser.parse_args(argv)
    rows = bench(args.n, small=args.small)
    targets = [r.get("privatize_met", r.get("met")) for r in rows]
    emit(
        {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
            "results": rows,
            "all_targets_met": all(bool(t) for t in targets),
            "date": time.strftime("%Y-%m-%d"),
        }
    )


if __name__ == "__main__":
    main()
