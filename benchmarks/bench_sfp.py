"""Speed of the Sequence Fragment Puzzle at the New Words parameters of 003 §6.1.

(m, m') = (1024, 1024), (k, k') = (2048, 2048), (ε, ε') = (2, 6), words of 10 characters
in 5 fragments of 2: client privatize (single calls with the OS CSPRNG, and the batch
path), wire decoding, server aggregation (word sketch plus five fragment sketches) and
one reconstruction (003 Alg. 10) over a 27-symbol alphabet with T = 64.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.harness import progress, rate, seconds
from protocol.randomness import SystemRandom
from protocol.sfp import SequenceFragmentPuzzle, SFPBatch

SEED = b"ldp-telemetry/bench/sfp/new-words"


def _words(n: int, universe: int, gen: np.random.Generator) -> list[str]:
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -1.2
    ranks = gen.choice(universe, size=n, p=weights / weights.sum())
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = gen.integers(2, 13, size=universe)
    names = ["".join(letters[gen.integers(0, 26, size=int(size))]) for size in lengths]
    return [names[r] for r in ranks]


def bench(n: int) -> list[dict[str, Any]]:
    """One result row: the deployed configuration."""
    mech = SequenceFragmentPuzzle(
        epsilon=2.0, epsilon_fragment=6.0, k=2048, m=1024, k_fragment=2048, m_fragment=1024, seed=SEED
    )
    csprng = SystemRandom()
    values = _words(n, 20_000, np.random.default_rng(1))

    progress("sfp: privatize")
    singles = min(n, 25_000)
    mech.privatize("warmup", None, csprng)
    t_single = seconds(lambda: [mech.privatize(v, None, csprng) for v in values[:singles]], repeat=2)
    cpu0 = time.process_time()
    for v in values[:singles]:
        mech.privatize(v, None, csprng)
    cpu_single = time.process_time() - cpu0

    holder: list[SFPBatch] = []
    t_batch = seconds(lambda: holder.append(mech.privatize_many(values, csprng)))
    batch = holder[0]

    progress("sfp: decode")
    records = [mech.privatize(v, None, csprng)[0] for v in values[: min(n, 50_000)]]
    wire = mech.encode_records(records)
    t_decode = seconds(lambda: mech.decode_records(wire), repeat=2)

    progress("sfp: aggregate")
    agg = mech.new_aggregate()
    t_add_cold = seconds(lambda: agg.add(batch))
    t_add = seconds(lambda: agg.add(batch))

    progress("sfp: reconstruct (27 symbols, T = 64)")
    found: list[Any] = []
    t_reconstruct = seconds(
        lambda: found.extend(agg.reconstruct(alphabet="abcdefghijklmnopqrstuvwxyz ", top_t=64, threshold=0.0))
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
            "privatize_per_s": rate(singles, t_single),
            "privatize_cpu_per_s": rate(singles, cpu_single),
            "privatize_batch_per_s": rate(n, t_batch),
            "decode_per_s": rate(len(wire), t_decode),
            "aggregate_per_s": rate(n, t_add),
            "aggregate_cold_per_s": rate(n, t_add_cold),
            "word_estimates": [round(float(v), 1) for v in est.values],
            "reconstruct_s": round(t_reconstruct, 3),
            "reconstructed_words": len(found),
            "reconstructed_true_words": sum(d.word in truth for d in found),
            "reconstructed_top": [[d.word, round(d.count, 1)] for d in found[:5]],
        }
    ]
