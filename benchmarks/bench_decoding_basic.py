"""Learning a distribution with basic one-time RAPPOR (004 §5.1, Fig. 4).

Run: ``python -m benchmarks.bench_decoding_basic``. Prints JSON (progress on stderr) and
writes ``benchmarks/out/rappor_5_1_n{N}.svg`` for N = 10^4, 10^5, 10^6: the true
distribution in black, the estimate in light green, as in 004 Fig. 4.

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
Bonferroni 0.05.
"""

from __future__ import annotations

import math
import os
import platform
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


def _run(kind: str, n: int, seed: int, *, plot: bool) -> dict[str, Any]:
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
    row = {
        "variant": kind,
        "n": n,
        "epsilon": round(mech.epsilon_report, 6),
        "tv_raw": round(0.5 * float(np.abs(raw - truth).sum()) / n, 4),
        "tv_consistent": round(0.5 * float(np.abs(cons - truth).sum()) / n, 4),
        "category_se": round(float(np.median(out.estimate.standard_errors)), 1),
        "detected_bonferroni": int(out.detected.sum()),
    }
    if plot:
        figure = bar_chart(
            title=f"004 §5.1: normal(50, 10) by basic one-time RAPPOR, N = {n:,} (TV {row['tv_raw']})",
            labels=list(CATEGORIES),
            series=[("true", list(truth), "#000000"), ("estimated", list(raw), "#90ee90")],
            ylabel="count",
            xlabel="value",
        )
        path = save_svg(figure, OUT / f"rappor_5_1_n{n}.svg")
        row["plot"] = str(path)
    return row


def main() -> None:
    """Run 004 §5.1 at the three sample sizes and print one JSON document."""
    rows = []
    for kind in ("paper", "symmetric"):
        for n in SIZES:
            progress(f"5.1 {kind}: N = {n:,}")
            rows.append(_run(kind, n, seed=51, plot=kind == "paper"))
    emit({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "results": {"rappor_5_1": rows}})


if __name__ == "__main__":
    main()
