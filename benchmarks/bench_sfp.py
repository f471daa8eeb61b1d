"""Speed of the Sequence Fragment Puzzle at the New Words parameters of 003 §6.1.

(m, m') = (1024, 1024), (k, k') = (2048, 2048), (ε, ε') = (2, 6), words of 10 characters
in 5 fragments of 2: client privatize (single calls with the OS CSPRNG, and the batch
path), wire decoding, server aggregation (word sketch plus five fragment sketches) and
one reconstruction (003 Alg. 10) over a 27-symbol alphabet with T = 64. ``small`` runs the
same steps with 256 hash functions in each sketch instead of 2,048, for the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness import progress, seconds, time_add, time_decode, time_privatize, zipf_ranks
from collector.threads import numpy_threads
from protocol.randomness import SystemRandom
from protocol.server.sfp import SFPServer
from protocol.sfp import SequenceFragmentPuzzle

SEED = b"ldp-telemetry/bench/sfp/new-words"


def _words(n: int, universe: int, gen: np.random.Generator) -> list[str]:
    ranks = zipf_ranks(n, universe, gen)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = gen.integers(2, 13, size=universe)
    names = ["".join(letters[gen.integers(0, 26, size=int(size))]) for size in lengths]
    return [names[r] for r in ranks]


def bench(n: int, *, small: bool = False) -> list[dict[str, Any]]:
    """One result row: the deployed configuration (``small``: sketches of 256 hash functions)."""
    k = 256 if small else 2048
    mech = SequenceFragmentPuzzle(
        epsilon=2.0, epsilon_fragment=6.0, k=k, m=1024, k_fragment=k, m_fragment=1024, seed=SEED
    )
    csprng = SystemRandom()
    values = _words(n, 20_000, np.random.default_rng(1))

    progress("sfp: privatize")
    server = SFPServer(mech)
    client = time_privatize(mech, server, values, csprng, singles=25_000, warm_up="warmup", cpu=True)

    progress("sfp: decode")
    decode = time_decode(mech, server, values[:50_000], csprng)

    progress("sfp: aggregate")
    agg = server.new_aggregate()
    add = time_add(agg, client.batch, n)

    progress("sfp: reconstruct (27 symbols, T = 64)")
    found: list[Any] = []
    with numpy_threads() as threads:  # the collector's (collector.threads)
        t_reconstruct = seconds(
            lambda: found.extend(
                agg.reconstruct(alphabet="abcdefghijklmnopqrstuvwxyz ", top_t=64, threshold=0.0, threads=threads)
            )
        )
    truth = {mech.pad(v).rstrip(" ") for v in values}
    est = agg.estimate_words(values[:3])
    return [
        {
            "mechanism": "sfp",
            "params": {
                "epsilon": 2.0,
                "epsilon_fragment": 6.0,
                "k": mech.k,
                "m": mech.m,
                "k_fragment": mech.k_fragment,
                "m_fragment": mech.m_fragment,
                "length": mech.length,
                "fragment_length": mech.fragment_length,
            },
            "epsilon_report": round(mech.epsilon_report, 12),
            "n": n,
            "n_aggregated": agg.n,
            **client.row(),
            **decode,
            **add.row(),
            "word_estimates": [round(float(v), 1) for v in est.values],
            "reconstruct_s": round(t_reconstruct, 3),
            "reconstructed_words": len(found),
            "reconstructed_true_words": sum(d.word in truth for d in found),
            "reconstructed_top": [[d.word, round(d.count, 1)] for d in found[:5]],
        }
    ]
