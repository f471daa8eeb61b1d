"""Learning a distribution with basic one-time RAPPOR (004 §5.1, Fig. 4).

Run: ``python -m benchmarks.bench_decoding_basic [--sizes 10000,100000,1000000] [--out DIR]``.
Prints JSON (progress on stderr) and writes ``benchmarks/out/rappor_5_1_n{N}.svg`` for
N = 10^4, 10^5, 10^6: the true distribution in black, the estimate in light green, as in
004 Fig. 4.

Values are normal(50, 10) rounded to integers (clipped to [0, 100], 101 categories, one
bit each). 004 §5.1 uses "q = 0.75 and p = 0.5 providing ε = ln(3) differential privacy
(f = 0)", one round of randomization of the true value (the Appendix's model
``E(C_i) = q T_i + p (N - T_i)``). In :mod:`protocol.rappor` that is
``Rappor(variant="basic", f=0, p=0.5, q=0.75)`` with one report per device (``f = 0`` makes
``B' = B``, and the instantaneous step applies ``p`` and ``q``): this is the row
``paper``. The ``basic-one-time`` variant of the protocol randomizes with the symmetric
``f`` coin instead; the row ``symmetric`` uses ``f = 2/(1 + sqrt 3)`` (per-bit odds
``sqrt 3``, two bits differ between values: the same ε = ln 3).

For each N: the total variation distance ``½ Σ_i |T̂_i - T_i| / N`` between the estimated
and true distributions, raw (the unbiased ``T̂_i = (C_i - pN)/(q - p)``, possibly negative)
and after the consistency projection (non-negative, summing to N;
:mod:`collector.decoding.consistency`), with the number of categories detected at
Bonferroni 0.05. ``tv_raw_expected`` is what the reported standard errors predict for the
raw distance (the categories' errors are independent normals); ``tv_raw_within_4_sd`` checks
the measured one against it, within 4 of its standard deviations.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import OUT, emit, progress
from collector.decoding.rappor import decode_categories
from fleet.plots import bar_chart, save_svg
from protocol.randomness import SeededRandom
from protocol.rappor import Rappor
from protocol.server.rappor import RapporServer

CATEGORIES = tuple(str(i) for i in range(101))
SIZES = (10_000, 100_000, 1_000_000)


def _mechanism(kind: str) -> Rappor:
    if kind == "paper":
        return Rappor(
            k=101,
            h=1,
            cohorts=1,
            f=0.0,
            p=0.5,
            q=0.75,
            seed=b"bench-decoding/5.1",
            variant="basic",
            categories=CATEGORIES,
        )
    f = 2 / (1 + math.sqrt(3))
    return Rappor(
        k=101,
        h=1,
        cohorts=1,
        f=f,
        p=0.5,
        q=0.75,
        seed=b"bench-decoding/5.1",
        variant="basic-one-time",
        categories=CATEGORIES,
    )


def _run(kind: str, n: int, seed: int, *, plot: Path | None) -> dict[str, Any]:
    mech = _mechanism(kind)
    gen = np.random.default_rng(seed)
    raw_values = np.clip(np.rint(gen.normal(50, 10, n)), 0, 100).astype(np.int64)
    truth = np.bincount(raw_values, minlength=101).astype(np.float64)
    server = RapporServer(mech)
    agg = server.new_aggregate()
    agg.add(
        server.privatize_many(
            [CATEGORIES[v] for v in raw_values.tolist()], np.zeros(n, dtype=np.int64), SeededRandom(seed)
        )
    )
    out = decode_categories(agg, consistent=True)
    assert out.consistent is not None
    raw = out.estimate.values
    cons = out.consistent.values
    # The raw errors are independent normals with the reported SEs (each category has its
    # own bit): E|e| = SE sqrt(2/pi), Var|e| = SE^2 (1 - 2/pi), so the reported SEs predict
    # the total variation distance and its spread.
    ses = out.estimate.standard_errors
    tv_expected = 0.5 * math.sqrt(2 / math.pi) * float(ses.sum()) / n
    tv_sd = 0.5 * math.sqrt((1 - 2 / math.pi) * float((ses**2).sum())) / n
    tv_raw = 0.5 * float(np.abs(raw - truth).sum()) / n
    row = {
        "variant": kind,
        "n": n,
        "epsilon": round(mech.epsilon_report, 6),
        "tv_raw": round(tv_raw, 4),
        "tv_raw_expected": round(tv_expected, 4),
        "tv_raw_within_4_sd": abs(tv_raw - tv_expected) <= 4 * tv_sd,
        "tv_consistent": round(0.5 * float(np.abs(cons - truth).sum()) / n, 4),
        "category_se": round(float(np.median(out.estimate.standard_errors)), 1),
        "detected_bonferroni": int(out.detected.sum()),
    }
    if plot is not None:
        figure = bar_chart(
            title=f"004 §5.1: normal(50, 10) by basic one-time RAPPOR, N = {n:,} (TV {row['tv_raw']})",
            labels=list(CATEGORIES),
            series=[("true", list(truth), "#000000"), ("estimated", list(raw), "#90ee90")],
            ylabel="count",
            xlabel="value",
        )
        path = save_svg(figure, plot / f"rappor_5_1_n{n}.svg")
        row["plot"] = str(path)
    return row


def run(sizes: Sequence[int] = SIZES, *, out: Path = OUT) -> dict[str, Any]:
    """004 §5.1 at each sample size, both variants (the paper's plotted under ``out``); the JSON document."""
    rows = []
    for kind in ("paper", "symmetric"):
        for n in sizes:
            progress(f"5.1 {kind}: N = {n:,}")
            rows.append(_run(kind, n, seed=51, plot=out if kind == "paper" else None))
    return {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "results": {"rappor_5_1": rows}}


def main(argv: Sequence[str] | None = None) -> None:
    """Run 004 §5.1 at the sample sizes asked for and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="sample sizes, comma-separated (default 10^4, 10^5, 10^6)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where the plots go (default benchmarks/out)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    except ValueError:
        parser.error("--sizes takes comma-separated positive counts")
    if not sizes or min(sizes) < 1:
        parser.error("--sizes takes comma-separated positive counts")
    emit(run(sizes, out=args.out))


if __name__ == "__main__":
    main()
