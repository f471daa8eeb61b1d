"""Speed of Count Mean Sketch at the deployed sizes of 003 §6.2-6.3.

k = 65,536, m = 1,024, ε = 4 (Popular Emojis): client privatize (single calls with the OS
CSPRNG, and the batch path), wire decoding, server aggregation into the 256 MiB integer
table, and a dictionary query at the Safari Auto-play scale (same k and m, 250,000
candidates). Targets: privatize >= 5e4 records/s, aggregation >= 5e5 records/s, query
<= 60 s. ``small`` runs the same steps on the fleet simulator's sketch (k = 256, m = 1,024)
and a 10,000-entry dictionary, for the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import progress, seconds, time_add, time_decode, time_privatize, zipf_sites
from collector.threads import numpy_threads
from protocol.cms import CountMeanSketch
from protocol.randomness import SystemRandom
from protocol.server.cms import CMSServer
from protocol.server.hashing import family_fingerprints

SEED = b"ldp-telemetry/bench/cms/emoji"
DEPLOYED = {"k": 65_536, "dictionary": 250_000}
SMALL = {"k": 256, "dictionary": 10_000}


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row: the deployed configuration (``small``: a small sketch and dictionary)."""
    size = SMALL if small else DEPLOYED
    mech = CountMeanSketch(epsilon=4.0, k=size["k"], m=1024, seed=SEED)
    csprng = SystemRandom()
    values = zipf_sites(n, 10_000, np.random.default_rng(1))

    progress("cms: privatize")
    server = CMSServer(mech)
    client = time_privatize(mech, server, values, csprng, singles=50_000, warm_up="warm-up.example", cpu=True)

    progress("cms: decode")
    decode = time_decode(mech, server, values[:100_000], csprng)

    progress("cms: aggregate")
    agg = server.new_aggregate()
    add = time_add(agg, client.batch, n)

    progress(f"cms: dictionary query ({size['dictionary']:,} candidates)")
    dictionary = [f"site-{i}.example" for i in range(size["dictionary"])]
    fp_holder: list[Any] = []
    t_fp = seconds(lambda: fp_holder.append(family_fingerprints(mech.family, dictionary)))
    t_moment = seconds(agg.second_moment)  # cached afterwards; timed on its own
    # The collector's threads (collector.threads), as the service gives its estimates.
    with numpy_threads() as threads:
        t_query = seconds(lambda: agg.estimate_fingerprints(fp_holder[0], threads=threads))

    est = agg.estimate(dictionary[:3])
    return [
        {
            "mechanism": "cms",
            "params": {"epsilon": 4.0, "k": mech.k, "m": mech.m},
            "n": n,
            "n_aggregated": agg.n,
            **client.row(),
            **decode,
            **add.row(),
            "dictionary_size": len(dictionary),
            "fingerprint_s": round(t_fp, 3),
            "second_moment_s": round(t_moment, 3),
            "query_s": round(t_query, 3),
            "top_estimates": [round(float(v), 1) for v in est.values],
            "top_standard_errors": [round(float(s), 1) for s in est.standard_errors],
        }
    ]
