"""Speed of Hadamard Count Mean Sketch at the Safari parameters of 003 §6.4.

k = 1,024, m = 32,768, ε = 4, a 250,000-domain dictionary: client privatize (single calls
with the OS CSPRNG, and the batch path), server aggregation (``np.add.at`` and, for a batch
larger than the table, the counting path), the row-wise Hadamard transform of Alg. 7
step 6 and the dictionary query of Alg. 4. Targets: aggregation >= 1e6 records/s,
transform <= 2 s, privatize >= 5e4 records/s. ``small`` runs the same steps on the fleet
simulator's sketch (k = 64, m = 1,024) and a 10,000-entry dictionary, for the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import progress, rate, seconds, time_add, time_privatize, zipf_sites
from collector.threads import numpy_threads
from protocol.hcms import HadamardCountMeanSketch
from protocol.randomness import SeededRandom, SystemRandom
from protocol.server.hadamard import hadamard_rows
from protocol.server.hashing import family_fingerprints
from protocol.server.hcms import HCMSBatch, HCMSServer

SEED = b"ldp-telemetry/bench/hcms/safari"
DEPLOYED = {"k": 1024, "m": 32_768, "dictionary": 250_000}
SMALL = {"k": 64, "m": 1024, "dictionary": 10_000}


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row: the Safari configuration (``small``: a small sketch and dictionary)."""
    size = SMALL if small else DEPLOYED
    mech = HadamardCountMeanSketch(epsilon=4.0, k=size["k"], m=size["m"], seed=SEED)
    csprng = SystemRandom()
    gen = np.random.default_rng(1)
    values = zipf_sites(n, 10_000, gen)

    server = HCMSServer(mech)
    client = time_privatize(mech, server, values, csprng, singles=50_000, warm_up="warm-up.example", cpu=False)

    agg = server.new_aggregate()
    add = time_add(agg, client.batch, n)

    # A batch as large as the table (np.add.at still; the counting path starts at 4 k m here).
    # Its rows and columns are the top bits of seeded words (k and m are powers of two).
    seeded = SeededRandom(2)
    big_n = mech.k * mech.m
    k_shift, m_shift = (np.uint64(65 - count.bit_length()) for count in (mech.k, mech.m))
    big = HCMSBatch(
        j=(seeded.words(big_n) >> k_shift).astype(np.int64),
        ell=(seeded.words(big_n) >> m_shift).astype(np.int64),
        bits=(seeded.words(big_n) >> np.uint64(63)).astype(np.uint8),
    )
    big_agg = server.new_aggregate()
    big_agg.add(big)
    t_add_big = seconds(lambda: big_agg.add(big))

    progress("hcms: transform")
    # The collector's threads (collector.threads), as the service gives its estimates; and one thread.
    with numpy_threads() as threads:
        t_transform = seconds(lambda: hadamard_rows(agg.sums, threads=threads), repeat=3)
    t_transform_1 = seconds(lambda: hadamard_rows(agg.sums), repeat=2)

    dictionary = [f"site-{i}.example" for i in range(size["dictionary"])]
    fp_holder: list[Any] = []
    t_fp = seconds(lambda: fp_holder.append(family_fingerprints(mech.family, dictionary)))
    agg.transformed()  # the transform is cached; time the query on its own
    progress("hcms: dictionary query")
    with numpy_threads() as threads:
        t_query = seconds(lambda: agg.estimate_fingerprints(fp_holder[0], threads=threads))

    est = agg.estimate(dictionary[:5])
    return [
        {
            "mechanism": "hcms",
            "params": {"epsilon": 4.0, "k": mech.k, "m": mech.m},
            "n": n,
            "n_aggregated": agg.n,
            **client.row(),
            "aggregate_per_s": rate(n, add.warm_s),
            "aggregate_first_batch_per_s": rate(n, add.cold_s),
            "aggregate_table_sized_batch_per_s": rate(big_n, t_add_big),
            "sums_dtype": str(agg.sums.dtype),
            "sums_mib": round(agg.sums.nbytes / 2**20, 1),
            "transform_s": round(t_transform, 3),
            "transform_one_thread_s": round(t_transform_1, 3),
            "dictionary": len(dictionary),
            "dictionary_fingerprint_s": round(t_fp, 3),
            "dictionary_query_s": round(t_query, 3),
            "top5_estimates": [round(float(v)) for v in est.values],
            "top5_standard_error": round(float(est.standard_errors[0]), 1),
        }
    ]
