"""Speed of Count Mean Sketch at the deployed sizes of 003 §6.2-6.3.

k = 65,536, m = 1,024, ε = 4 (Popular Emojis): client privatize (single calls with the OS
CSPRNG, and the batch path), wire decoding, server aggregation into the 256 MiB integer
table, and a dictionary query at the Safari Auto-play scale (same k and m, 250,000
candidates). Targets: privatize >= 5e4 records/s, aggregation >= 5e5 records/s, query
<= 60 s.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.harness import progress, rate, seconds
from protocol.cms import CMSBatch, CountMeanSketch
from protocol.randomness import SystemRandom

SEED = b"ldp-telemetry/bench/cms/emoji"
DICTIONARY = 250_000


def _zipf_values(n: int, universe: int, gen: np.random.Generator) -> list[str]:
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -1.2
    ranks = gen.choice(universe, size=n, p=weights / weights.sum())
    names = [f"site-{i}.example" for i in range(universe)]
    return [names[r] for r in ranks]


def bench(n: int) -> list[dict[str, Any]]:
    """One result row: the deployed configuration."""
    mech = CountMeanSketch(epsilon=4.0, k=65_536, m=1024, seed=SEED)
    csprng = SystemRandom()
    values = _zipf_values(n, 10_000, np.random.default_rng(1))

    progress("cms: privatize")
    singles = min(n, 50_000)
    mech.privatize("warm-up.example", None, csprng)
    t_single = seconds(lambda: [mech.privatize(v, None, csprng) for v in values[:singles]], repeat=2)
    cpu0 = time.process_time()
    for v in values[:singles]:
        mech.privatize(v, None, csprng)
    cpu_single = time.process_time() - cpu0

    holder: list[CMSBatch] = []
    t_batch = seconds(lambda: holder.append(mech.privatize_many(values, csprng)))
    batch = holder[0]

    progress("cms: decode")
    records = [mech.privatize(v, None, csprng)[0] for v in values[: min(n, 100_000)]]
    wire = mech.encode_records(records)
    t_decode = seconds(lambda: mech.decode_records(wire), repeat=2)

    progress("cms: aggregate")
    agg = mech.new_aggregate()
    t_add_cold = seconds(lambda: agg.add(batch))  # the first add also faults in the table's pages
    t_add = seconds(lambda: agg.add(batch))  # a running collector's table is already mapped

    progress("cms: dictionary query (250,000 candidates)")
    dictionary = [f"site-{i}.example" for i in range(DICTIONARY)]
    fp_holder: list[Any] = []
    t_fp = seconds(lambda: fp_holder.append(mech.family.fingerprints(dictionary)))
    t_moment = seconds(agg.second_moment)  # cached afterwards; timed on its own
    t_query = seconds(lambda: agg.estimate_fingerprints(fp_holder[0]))

    est = agg.estimate(dictionary[:3])
    return [
        {
            "mechanism": "cms",
            "params": {"epsilon": 4.0, "k": mech.k, "m": mech.m},
            "n": n,
            "n_aggregated": agg.n,
            "privatize_per_s": rate(singles, t_single),
            "privatize_cpu_per_s": rate(singles, cpu_single),
            "privatize_batch_per_s": rate(n, t_batch),
            "decode_per_s": rate(len(wire), t_decode),
            "aggregate_per_s": rate(n, t_add),
            "aggregate_cold_per_s": rate(n, t_add_cold),
            "dictionary_size": DICTIONARY,
            "fingerprint_s": round(t_fp, 3),
            "second_moment_s": round(t_moment, 3),
            "query_s": round(t_query, 3),
            "top_estimates": [round(float(v), 1) for v in est.values],
            "top_standard_errors": [round(float(s), 1) for s in est.standard_errors],
        }
    ]
