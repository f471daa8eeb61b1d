"""CMS and HCMS standard errors under one fixed hash family: the SE shown against the spread of
the estimates over the devices' coins alone (issue 33; docs/estimation.md, "The sketches'
standard error").

Run: ``python -m benchmarks.bench_sketch_family [--mechanism hcms|cms] [--population de]
[--runs 200] [--reports 1000000] [--strings 20000] [--heavy 50] [--light 2000] [--small]``.
Prints JSON (progress on stderr). ``--small`` uses the small sketches of
``benchmarks.bench_release.SMALL_REGISTRY``.

The use case's public seed fixes the hash family, as in a deployment. One population draw
(``benchmarks.bench_populations``: a ``wordfreq`` language or ``zipf``) fixes the truth;
every run privatizes the same reports again with fresh coins (the server half's
``privatize_many``, seeded per run) and estimates the dictionary. So the spread of an
entry's estimates over the runs is the spread over the coins alone, with the family held
fixed, and the mean of its estimates less its true count is the family's fixed offset.

Per group (``heavy``: the ``--heavy`` entries with the largest true counts; ``light``:
``--light`` other entries drawn at random, seeded):

* ``coin_sd_over_se``: ``sqrt(mean over entries of var_runs(estimate) / mean_runs(SE²))``,
  the spread over the coins over the SE shown (1 when the SE is the per-family spread);
  ``coin_sd_over_se_se``: its Monte Carlo standard error (``sqrt(1 / (2 (R - 1) E))`` for
  ``E`` entries and ``R`` runs, halved for a ratio of standard deviations);
* ``offset_over_se_rms`` and ``offset_over_se_max``: the fixed offset of each entry,
  ``mean_runs(estimate) - truth``, over its SE, as measured (its Monte Carlo noise alone
  is ``1/sqrt(R)`` in these units: ``offset_noise``); and ``exact_offset_over_se_rms`` /
  ``_max``: the same offset computed exactly from the family's collisions with every other
  value, ``(m/(m-1)) Σ_v f(v) (q_v - 1/m)`` (``q_v``: the share of rows where ``v`` collides
  with the entry), without any coin;
* ``rms_error_over_se``: the RMS of ``(estimate - truth) / SE`` over runs and entries (coins
  and offset together) and ``plain_coverage``: the share of ``estimate ± 1.96 SE`` holding
  the truth, over runs and entries.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.bench_populations import make_population
from benchmarks.bench_release import REGISTRY, SMALL_REGISTRY
from benchmarks.harness import emit, progress
from protocol.cms import as_value_bytes
from protocol.hcms import hashed_value
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from protocol.server.cms import CMSServer
from protocol.server.hashing import evaluate, family_fingerprints

USE_CASES = {"cms": "emoji", "hcms": "safari-energy-domains"}
Z95 = 1.959963984540054


def exact_offsets(
    server: Any, strings: list[str], counts: npt.NDArray[np.int64], queried: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """``E[f̃(d) | family] - f(d)`` for each queried entry ``d``: ``(m/(m-1)) Σ_{v≠d} f(v) (q_v - 1/m)``.

    Row by row, the reports' mass that lands in ``d``'s cell is a weighted count of the values
    hashed there (``bincount``), so no pair of values is enumerated.
    """
    mech = server.mechanism
    k, m = mech.k, mech.m
    prepare = as_value_bytes if isinstance(server, CMSServer) else hashed_value
    fp = family_fingerprints(mech.family, [prepare(s) for s in strings])
    f = counts.astype(np.float64)
    landed = np.zeros(queried.size)
    for j in range(k):
        h = evaluate(mech.family, fp, j)
        landed += np.bincount(h, weights=f, minlength=m)[h[queried]]
    # Σ_j (mass in d's cell of row j) / k includes d itself once per row.
    collided = landed / k - f[queried]
    others = float(f.sum()) - f[queried]
    out: npt.NDArray[np.float64] = (m / (m - 1)) * (collided - others / m)
    return out


def run(
    *,
    mechanism: str = "hcms",
    population: str = "de",
    runs: int = 200,
    reports: int = 1_000_000,
    strings: int = 20_000,
    heavy: int = 50,
    light: int = 2_000,
    small: bool = False,
) -> dict[str, Any]:
    """The per-family check of one mechanism on one population; the JSON document."""
    started = time.perf_counter()
    source = SMALL_REGISTRY if small else REGISTRY.read_bytes()
    registry = parse_registry(source, source="bench_release --small" if small else str(REGISTRY))
    uc = registry.use_cases[USE_CASES[mechanism]]
    server: Any = uc.server
    pop = make_population(population, strings, 0)
    gen = np.random.default_rng([0, 33])
    counts = gen.multinomial(reports, pop.weights / pop.weights.sum()).astype(np.int64)
    order = np.repeat(np.arange(len(pop.strings)), counts)
    gen.shuffle(order)
    values = [pop.strings[i] for i in order.tolist()]
    ranked = np.argsort(-counts, kind="stable")
    top = ranked[:heavy]
    rest = ranked[heavy:]
    sample = np.sort(gen.choice(rest, size=min(light, rest.size), replace=False))
    queried = np.concatenate([top, sample])
    names = [pop.strings[i] for i in queried.tolist()]
    estimates = np.empty((runs, queried.size))
    ses = np.empty((runs, queried.size))
    for r in range(runs):
        agg = server.new_aggregate()
        rng = SeededRandom(1_000 + r)
        for start in range(0, len(values), 1 << 17):
            agg.add(server.privatize_many(values[start : start + (1 << 17)], rng))
        est = agg.estimate(names)
        estimates[r], ses[r] = est.values, est.standard_errors
        if (r + 1) % 10 == 0:
            progress(f"{mechanism} {population}: run {r + 1} of {runs}")
    offsets = exact_offsets(server, pop.strings, counts, queried)
    truth = counts[queried].astype(np.float64)
    groups = {"heavy": slice(0, top.size), "light": slice(top.size, queried.size)}
    figures = {name: _figures(estimates[:, g], ses[:, g], truth[g], offsets[g]) for name, g in groups.items()}
    return {
        "benchmark": "sketch_family",
        "mechanism": mechanism,
        "use_case": uc.name,
        "parameters": {
            "k": server.mechanism.k,
            "m": server.mechanism.m,
            "epsilon": uc.epsilon,
            "population": population,
            "reports": reports,
            "strings": strings,
            "runs": runs,
            "registry": "SMALL_REGISTRY" if small else "deploy/usecases.example.toml",
        },
        "top_share": round(float(counts.max()) / reports, 4),
        "sum_f2_over_n2": round(float((counts.astype(np.float64) ** 2).sum()) / reports**2, 5),
        "groups": figures,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }


def _figures(
    est: npt.NDArray[np.float64],
    se: npt.NDArray[np.float64],
    truth: npt.NDArray[np.float64],
    exact: npt.NDArray[np.float64],
) -> dict[str, Any]:
    runs, entries = est.shape
    se_mean = np.sqrt((se**2).mean(axis=0))
    ratio = math.sqrt(float((est.var(axis=0, ddof=1) / se_mean**2).mean()))
    offset = (est.mean(axis=0) - truth) / se_mean
    exact_z = exact / se_mean
    z = (est - truth) / se
    return {
        "entries": entries,
        "true_count_min": int(truth.min()),
        "true_count_max": int(truth.max()),
        "se_shown_mean": round(float(se_mean.mean()), 1),
        "coin_sd_over_se": round(ratio, 4),
        "coin_sd_over_se_se": round(0.5 * math.sqrt(2.0 / ((runs - 1) * entries)), 4),
        "offset_over_se_rms": round(float(np.sqrt((offset**2).mean())), 4),
        "offset_over_se_max": round(float(np.abs(offset).max()), 4),
        "offset_noise": round(1 / math.sqrt(runs), 4),
        "exact_offset_over_se_rms": round(float(np.sqrt((exact_z**2).mean())), 4),
        "exact_offset_over_se_max": round(float(np.abs(exact_z).max()), 4),
        "rms_error_over_se": round(float(np.sqrt((z**2).mean())), 4),
        "plain_coverage": round(float((np.abs(z) <= Z95).mean()), 4),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the check and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", choices=list(USE_CASES), default="hcms")
    parser.add_argument("--population", default="de", help="zipf or a wordfreq language")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--strings", type=int, default=20_000)
    parser.add_argument("--heavy", type=int, default=50)
    parser.add_argument("--light", type=int, default=2_000)
    parser.add_argument("--small", action="store_true", help="small sketches, the same ε")
    args = parser.parse_args(argv)
    if args.runs < 2 or min(args.reports, args.strings, args.heavy, args.light) < 1:
        parser.error("--runs takes at least 2; --reports, --strings, --heavy and --light positive counts")
    if args.heavy >= args.strings:
        parser.error("--heavy must be below --strings")
    emit(
        run(
            mechanism=args.mechanism,
            population=args.population,
            runs=args.runs,
            reports=args.reports,
            strings=args.strings,
            heavy=args.heavy,
            light=args.light,
            small=args.small,
        )
    )


if __name__ == "__main__":
    main()
