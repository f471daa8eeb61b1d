"""000 §5 (Fig. 2): mean and histogram error against ε, and what consistency post-processing gains.

Run: ``python -m benchmarks.bench_decoding_telemetry [--mean-reps 120] [--hist-reps 40]``.
Prints JSON (progress on stderr); writes ``benchmarks/out/telemetry_mean.svg`` and
``telemetry_histogram.svg``.

The paper's data (31 days of app usage) is not available; its synthetic datasets are used
instead (000 §5, "On different data distributions", Fig. 3): ``n = 3·10^5`` users,
``m = 24`` hours (86,400 s).

* **Mean** (Fig. 2a, 3b): counters uniform on ``[0, m]``; 1BitMean with α-point rounding
  (``s = m/20``, 000 §3.1) and permanent memoization (1BitRRPM), with output perturbation
  γ = 0 (none), 0.1 and 1/3 (000 §4). Mean absolute error in seconds over ``mean-reps``
  fleets per ε, each fleet freshly set up. The three γ share each fleet's permanent
  state (common random numbers), so their ordering is measured on the same draws.
* **Histogram** (Fig. 2c, 3c): counters normal(12 h, 2 h) truncated to ``[0, m]``, ``k = 32``
  equal buckets; dBitFlipPM with ``d = 1, 2, 4, 32`` (``d = 32`` is BinFlip) against KFlip
  (``k``-RR: the true bucket with probability ``e^ε/(e^ε + k - 1)``, otherwise one of the
  other ``k - 1`` uniformly, exact coins from :mod:`protocol.randomness`). Histogram error
  is ``max_v |ĥ(v) - h(v)|`` (000 §1.1), averaged over ``hist-reps`` fleets, before and
  after the consistency projection (:mod:`collector.decoding.consistency`, weights
  ``1/SE²``, total 1).

Orderings checked against 000 §5's reading of Fig. 2: for the mean, error grows with γ at
every ε; for histograms, error falls as ``d`` grows at every ε, BinFlip (``d = k``) beats
KFlip at small ε and KFlip wins once ε is of order ``ln k`` (≈ 3.5), and 4bitFlipPM is
comparable to KFlip for ε in 0.1-0.5. Consistency is reported cell by cell: it removes the
noise of the near-empty tail buckets, which dominates the max error up to ε ≈ 2; when the
estimate is already almost exact (KFlip at ε >= 5) clipping the tails' negative noise
shifts the large buckets by about as much as it removes, and the max error can rise
slightly.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import OUT, emit, progress
from collector.decoding.consistency import make_consistent
from fleet.plots import line_chart, save_svg
from protocol.buckets import LinearBuckets
from protocol.dbitflip import DBitFlip
from protocol.one_bit_mean import OneBitMean
from protocol.randomness import RandomSource, SeededRandom, bernoulli, coin_at_most, dexp, uniform_ints
from protocol.server.buckets import buckets_of
from protocol.server.dbitflip import DBitFlipServer
from protocol.server.estimate import VectorEstimate
from protocol.server.one_bit_mean import OneBitMeanServer

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
GAMMAS = (0.0, 0.1, 1 / 3)
DS = (1, 2, 4, 32)
N = 300_000
M = 86_400
K = 32


def _mean_errors(eps: float, reps: int, n: int, rng: RandomSource, gen: np.random.Generator) -> dict[str, float]:
    mechs = [OneBitMeanServer(OneBitMean(epsilon=eps, m=M, s=M // 20, gamma=g)) for g in GAMMAS]
    errors: list[list[float]] = [[] for _ in GAMMAS]
    for _ in range(reps):
        x = gen.integers(0, M + 1, n)
        truth = float(x.mean())
        states = mechs[0].setup_many(n, rng)
        for i, mech in enumerate(mechs):
            agg = mech.new_aggregate()
            agg.add(mech.privatize_many(x, states, rng))
            errors[i].append(abs(agg.estimate().value - truth))
    return {f"gamma_{g:.3g}": round(float(np.mean(e)), 2) for g, e in zip(GAMMAS, errors, strict=True)}


class _KFlip:
    """k-RR (KFlip of 000 §5) with exact coins: keep the bucket w.p. e^ε/(e^ε + k - 1)."""

    def __init__(self, eps: float, k: int) -> None:
        self.k = k
        self.coin = coin_at_most(dexp(eps) / (dexp(eps) + k - 1))
        self.p = float(self.coin.probability)
        self.q = (1 - self.p) / (k - 1)

    def estimate(self, buckets: np.ndarray, rng: RandomSource) -> VectorEstimate:
        n = buckets.size
        keep = bernoulli(rng, self.coin, n)
        other = uniform_ints(rng, self.k - 1, n)
        report = np.where(keep, buckets, other + (other >= buckets))
        lam = np.bincount(report, minlength=self.k) / n
        values = (lam - self.q) / (self.p - self.q)
        lam_c = np.clip(lam, self.q, self.p)
        se = np.sqrt(lam_c * (1 - lam_c) / n) / (self.p - self.q)
        return VectorEstimate(values, se, n)


def _histogram_errors(
    eps: float, reps: int, n: int, rng: RandomSource, gen: np.random.Generator
) -> dict[str, dict[str, float]]:
    buckets = LinearBuckets(low=0, high=M, count=K)
    mechs = {f"{d}bitflip": DBitFlipServer(DBitFlip(epsilon=eps, buckets=buckets, d=d)) for d in DS}
    kflip = _KFlip(eps, K)
    raw: dict[str, list[float]] = {name: [] for name in [*mechs, "kflip"]}
    cons: dict[str, list[float]] = {name: [] for name in raw}
    for _ in range(reps):
        x = gen.normal(12 * 3600, 2 * 3600, n)
        x = x[(x >= 0) & (x <= M)][:n]
        while x.size < n:  # truncation: redraw the few outside [0, m]
            extra = gen.normal(12 * 3600, 2 * 3600, n - x.size)
            x = np.concatenate([x, extra[(extra >= 0) & (extra <= M)]])
        b = buckets_of(buckets, x)
        truth = np.bincount(b, minlength=K) / n
        estimates: dict[str, VectorEstimate] = {}
        for name, mech in mechs.items():
            agg = mech.new_aggregate()
            agg.add(mech.privatize_many(x, rng))
            estimates[name] = agg.estimate()
        estimates["kflip"] = kflip.estimate(b, rng)
        for name, est in estimates.items():
            raw[name].append(float(np.abs(est.values - truth).max()))
            projected = make_consistent(est, total=1.0, draws=0).values
            cons[name].append(float(np.abs(projected - truth).max()))
    return {
        name: {"raw": round(float(np.mean(raw[name])), 6), "consistent": round(float(np.mean(cons[name])), 6)}
        for name in raw
    }


def _checks(mean_rows: list[dict[str, Any]], hist_rows: list[dict[str, Any]]) -> dict[str, bool]:
    """The orderings of 000 §5's reading of Fig. 2, each pass/fail."""
    gamma_keys = [f"gamma_{g:.3g}" for g in GAMMAS]
    d_keys = [f"{d}bitflip" for d in DS]
    return {
        "mean_error_grows_with_gamma_at_every_epsilon": all(
            r[gamma_keys[0]] < r[gamma_keys[1]] < r[gamma_keys[2]] for r in mean_rows
        ),
        "histogram_error_falls_with_d_at_every_epsilon": all(
            all(r[d_keys[i + 1]]["raw"] < r[d_keys[i]]["raw"] for i in range(len(DS) - 1)) for r in hist_rows
        ),
        "binflip_beats_kflip_for_epsilon<=1": all(
            r["32bitflip"]["raw"] < r["kflip"]["raw"] for r in hist_rows if r["epsilon"] <= 1
        ),
        "kflip_beats_binflip_at_epsilon_10": all(
            r["kflip"]["raw"] < r["32bitflip"]["raw"] for r in hist_rows if r["epsilon"] >= 10
        ),
        "4bitflip_within_1.5x_of_kflip_for_epsilon_0.1-0.5": all(
            1 / 1.5 < r["4bitflip"]["raw"] / r["kflip"]["raw"] < 1.5 for r in hist_rows if r["epsilon"] <= 0.5
        ),
        "consistency_lowers_max_error_for_epsilon<=2": all(
            v["consistent"] < v["raw"] for r in hist_rows if r["epsilon"] <= 2 for k, v in r.items() if k != "epsilon"
        ),
    }


def _plots(mean_rows: list[dict[str, Any]], hist_rows: list[dict[str, Any]], out: Path, n: int) -> list[str]:
    """The two SVG figures, written under ``out``; their paths."""
    gamma_keys = [f"gamma_{g:.3g}" for g in GAMMAS]
    d_keys = [f"{d}bitflip" for d in DS]
    mean_figure = line_chart(
        title=f"000 §5: mean absolute error (s) of 1BitRRPM, n = {n:.0e}, m = 24 h",
        x=list(EPSILONS),
        series=[
            (f"gamma = {g:.3g}", [r[k] for r in mean_rows], c)
            for g, k, c in zip(GAMMAS, gamma_keys, ("#1f77b4", "#ff7f0e", "#d62728"), strict=True)
        ],
        ylabel="mean absolute error (s)",
        xlabel="ε per report",
    )
    mean_svg = save_svg(mean_figure, out / "telemetry_mean.svg")
    colors = ("#9467bd", "#8c564b", "#2ca02c", "#1f77b4", "#d62728")
    hist_figure = line_chart(
        title=f"000 §5: histogram max error, n = {n:.0e}, k = 32 (raw)",
        x=list(EPSILONS),
        series=[
            (name, [r[name]["raw"] for r in hist_rows], c) for name, c in zip([*d_keys, "kflip"], colors, strict=True)
        ],
        ylabel="max error (share of devices)",
        xlabel="ε per report",
    )
    hist_svg = save_svg(hist_figure, out / "telemetry_histogram.svg")
    return [str(mean_svg), str(hist_svg)]


def run(mean_reps: int, hist_reps: int, *, n: int = N, out: Path = OUT) -> dict[str, Any]:
    """Both tables, their checks and plots (under ``out``); one JSON-ready document."""
    rng = SeededRandom(2017)
    gen = np.random.default_rng(2017)
    mean_rows: list[dict[str, Any]] = []
    hist_rows: list[dict[str, Any]] = []
    for eps in EPSILONS:
        progress(f"000 §5 mean: epsilon {eps}")
        mean_rows.append({"epsilon": eps, **_mean_errors(eps, mean_reps, n, rng, gen)})
    for eps in EPSILONS:
        progress(f"000 §5 histogram: epsilon {eps}")
        hist_rows.append({"epsilon": eps, **_histogram_errors(eps, hist_reps, n, rng, gen)})
    cells = [v for r in hist_rows for k, v in r.items() if k != "epsilon"]
    consistency = {
        "cells_lowered": sum(v["consistent"] < v["raw"] for v in cells),
        "cells": len(cells),
        "mean_ratio_consistent_to_raw": round(float(np.mean([v["consistent"] / v["raw"] for v in cells])), 3),
        "raised": [
            [r["epsilon"], k] for r in hist_rows for k, v in r.items() if k != "epsilon" and v["consistent"] >= v["raw"]
        ],
    }
    crossover = next((r["epsilon"] for r in hist_rows if r["kflip"]["raw"] < r["32bitflip"]["raw"]), None)
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": {
            "params": {"n": n, "m_seconds": M, "s": M // 20, "k": K, "mean_reps": mean_reps, "hist_reps": hist_reps},
            "mean_absolute_error_seconds": mean_rows,
            "histogram_max_error": hist_rows,
            "kflip_beats_binflip_from_epsilon": crossover,
            "ln_k": round(math.log(K), 3),
            "checks": _checks(mean_rows, hist_rows),
            "consistency": consistency,
            "plots": _plots(mean_rows, hist_rows, out, n),
        },
    }


def main(argv: list[str] | None = None) -> None:
    """Run both tables and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mean-reps", type=int, default=120, help="fleets per ε for the mean (default 120)")
    parser.add_argument("--hist-reps", type=int, default=40, help="fleets per ε for histograms (default 40)")
    parser.add_argument("--n", type=int, default=N, help=f"devices per fleet (default {N:,})")
    parser.add_argument("--out", type=Path, default=OUT, help="where the plots go (default benchmarks/out)")
    args = parser.parse_args(argv)
    if min(args.mean_reps, args.hist_reps, args.n) < 1:
        parser.error("--mean-reps, --hist-reps and --n take positive counts")
    emit(run(args.mean_reps, args.hist_reps, n=args.n, out=args.out))


if __name__ == "__main__":
    main()
