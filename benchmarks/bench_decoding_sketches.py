"""003: the spread of CMS/HCMS dictionary counts against Theorems 4.2 and 4.4, and SFP word discovery.

Run: ``python -m benchmarks.bench_decoding_sketches [--seeds 3]``. Prints JSON (progress on
stderr).

* **CMS and HCMS** (003 §4.1-4.2, Fig. 4's Zipf(1.2) data): ``n = 10^6`` reports drawn from
  Zipf(1.2) over a 10^4-entry dictionary, ε = 4, ``k = m = 1024``. The whole dictionary is
  queried (:func:`collector.decoding.sketches.query_dictionary`) and the empirical SD of
  ``f̃(d) - f(d)`` over its entries is compared with the SD of Theorem 4.2 / 4.4 (the bound,
  with the realised ``Σ f²``) and with the exact variance before the bound (the RMS of the
  per-entry values). Each seed draws new hash functions, coins and data; the spread over
  entries of one run is a draw over the hash family, as the theorems' expectation is.
  Also timed: a 250,000-entry dictionary query (hundreds of thousands of entries, as
  deployed in 003 §6.3-6.4).
* **SFP** (003 §4.3, the New Words parameters of §6.1: ``(m, m') = (1024, 1024)``,
  ``(k, k') = (2048, 2048)``, ``(ε, ε') = (2, 6)``): a corpus of 10^6 words, Zipf(1) over
  5,000 distinct words of 3-10 letters; Alg. 10 with ``T = 256`` over ``a-z`` and the space.
  Released: estimated count at least the threshold (5 word-oracle SEs, about 0.5% of the
  reports) *and* significantly above it at Bonferroni 0.05 over all assembled words (the
  release rule of :mod:`collector.decoding.release`, through
  :func:`collector.decoding.sketches.discover_words`). Recall is over the corpus words whose
  true count is at least the threshold; ``absent_share`` is the share of released words that
  were never typed; ``missed_words`` lists the words above the threshold that were not
  released, with their true count and estimate (``missed_assembled``: how many of them the
  puzzle did assemble, i.e. were lost only because their estimate fell below the threshold).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress
from collector.decoding.sketches import discover_words, query_dictionary
from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.randomness import SeededRandom
from protocol.server.cms import CMSServer
from protocol.server.hcms import HCMSServer
from protocol.server.sfp import SFPServer
from protocol.sfp import SequenceFragmentPuzzle

N = 1_000_000
DICTIONARY = 10_000
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def _zipf(n: int, size: int, s: float, gen: np.random.Generator) -> np.ndarray:
    w = np.arange(1, size + 1, dtype=np.float64) ** -s
    return gen.multinomial(n, w / w.sum())


def _sketch_row(kind: str, seed: int) -> dict[str, Any]:
    gen = np.random.default_rng(seed)
    dictionary = [f"entry-{i}.example" for i in range(DICTIONARY)]
    counts = _zipf(N, DICTIONARY, 1.2, gen)
    order = np.repeat(np.arange(DICTIONARY), counts)
    gen.shuffle(order)
    values = [dictionary[i] for i in order.tolist()]
    seed_bytes = f"bench-decoding/003/{kind}/{seed}".encode()
    mech: CMSServer | HCMSServer
    if kind == "cms":
        mech = CMSServer(CountMeanSketch(epsilon=4.0, k=1024, m=1024, seed=seed_bytes))
    else:
        mech = HCMSServer(HadamardCountMeanSketch(epsilon=4.0, k=1024, m=1024, seed=seed_bytes))
    rng = SeededRandom(seed)
    agg = mech.new_aggregate()
    step = 1 << 18
    for start in range(0, N, step):
        agg.add(mech.privatize_many(values[start : start + step], rng))  # type: ignore[arg-type]
    t0 = time.perf_counter()
    release = query_dictionary(agg, dictionary)
    query_s = time.perf_counter() - t0
    est = {e.value: e for e in release.entries}
    err = np.array([est[d].count - counts[i] for i, d in enumerate(dictionary)])
    sum_sq = float(np.dot(counts.astype(np.float64), counts.astype(np.float64)))
    bound_sd = float(np.sqrt(mech.variance_bound(n=N, sum_sq=sum_sq)))
    exact = mech.variance(n=N, count=counts.astype(np.float64), others_sum_sq=sum_sq - counts.astype(np.float64) ** 2)
    exact_sd = float(np.sqrt(np.mean(exact)))
    reported_sd = float(np.sqrt(np.mean([e.standard_error**2 for e in release.entries])))
    empirical = float(err.std(ddof=1))
    return {
        "mechanism": kind,
        "seed": seed,
        "empirical_sd": round(empirical, 1),
        "theorem_sd": round(bound_sd, 1),
        "exact_sd": round(exact_sd, 1),
        "reported_se_rms": round(reported_sd, 1),
        "ratio_to_theorem": round(empirical / bound_sd, 4),
        "ratio_to_exact": round(empirical / exact_sd, 4),
        "mean_error": round(float(err.mean()), 1),
        "query_s_10k": round(query_s, 3),
        "_aggregate": agg,
    }


def _big_query(agg: Any) -> dict[str, Any]:
    big = [f"big-{i}.example" for i in range(250_000)]
    t0 = time.perf_counter()
    release = query_dictionary(agg, big, alpha=0.05, top_n=100)
    return {"entries": len(big), "seconds": round(time.perf_counter() - t0, 2), "released": release.released}


def _words(gen: np.random.Generator) -> list[str]:
    words: set[str] = set()
    out: list[str] = []
    while len(out) < 5000:
        w = "".join(LETTERS[gen.integers(0, 26, size=int(gen.integers(3, 11)))])
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def _sfp(seed: int) -> dict[str, Any]:
    gen = np.random.default_rng(seed)
    words = _words(gen)
    counts = _zipf(N, len(words), 1.0, gen)
    order = np.repeat(np.arange(len(words)), counts)
    gen.shuffle(order)
    mech = SequenceFragmentPuzzle(
        epsilon=2.0,
        epsilon_fragment=6.0,
        k=2048,
        m=1024,
        k_fragment=2048,
        m_fragment=1024,
        seed=f"bench-decoding/003/sfp/{seed}".encode(),
    )
    server = SFPServer(mech)
    rng = SeededRandom(seed)
    agg = server.new_aggregate()
    step = 1 << 18
    values = [words[i] for i in order.tolist()]
    for start in range(0, N, step):
        agg.add(server.privatize_many(values[start : start + step], rng))
    word_se = float(agg.estimate_words([words[0]]).standard_errors[0])
    threshold = round(5 * word_se)
    t0 = time.perf_counter()
    release = discover_words(agg, alphabet="abcdefghijklmnopqrstuvwxyz ", top_t=256, threshold=threshold, alpha=0.05)
    seconds = time.perf_counter() - t0
    # Were the missed words assembled by the puzzle (and lost only to the threshold)?
    everything = discover_words(agg, alphabet="abcdefghijklmnopqrstuvwxyz ", top_t=256, alpha=None)
    assembled = {e.value: e.count for e in everything.entries}
    truth = dict(zip(words, counts.tolist(), strict=True))
    found = {e.value for e in release.entries}
    above = {w for w, c in truth.items() if c >= threshold}
    absent = [w for w in found if w not in truth]
    covered = [e for e in release.entries if e.value in truth and e.low <= truth[str(e.value)] <= e.high]
    missed = sorted(above - found)
    return {
        "seed": seed,
        "threshold": threshold,
        "missed": len(missed),
        "missed_assembled": sum(w in assembled for w in missed),
        "missed_words": [[w, truth[w], round(assembled.get(w, float("nan")))] for w in missed],
        "words_above_threshold": len(above),
        "discovered": len(found),
        "recall_above_threshold": round(len(above & found) / max(len(above), 1), 4),
        "absent_share": round(len(absent) / max(len(found), 1), 4),
        "absent_words": absent,
        "assembled": release.tested,
        "interval_coverage": round(len(covered) / max(len(found) - len(absent), 1), 4),
        "reconstruct_s": round(seconds, 2),
        "top": [
            [e.value, round(e.count), round(e.standard_error), truth.get(str(e.value), 0)] for e in release.entries[:5]
        ],
    }


def main() -> None:
    """Run the sketch and SFP checks and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="runs per mechanism (default 5)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    big: dict[str, Any] = {}
    for kind in ("cms", "hcms"):
        for seed in range(1, args.seeds + 1):
            progress(f"003 {kind}: seed {seed}")
            row = _sketch_row(kind, seed)
            agg = row.pop("_aggregate")
            if seed == 1:
                progress(f"003 {kind}: 250,000-entry query")
                big[kind] = _big_query(agg)
            rows.append(row)
    summary = {
        kind: {
            "ratio_to_theorem_mean": round(
                float(np.mean([r["ratio_to_theorem"] for r in rows if r["mechanism"] == kind])), 4
            ),
            "within_15_percent": all(abs(r["ratio_to_theorem"] - 1) <= 0.15 for r in rows if r["mechanism"] == kind),
        }
        for kind in ("cms", "hcms")
    }
    sfp_rows = []
    for seed in range(1, args.seeds + 1):
        progress(f"003 sfp: seed {seed}")
        sfp_rows.append(_sfp(seed))
    sfp_summary = {
        "recall_mean": round(float(np.mean([r["recall_above_threshold"] for r in sfp_rows])), 4),
        "absent_share_mean": round(float(np.mean([r["absent_share"] for r in sfp_rows])), 4),
        "recall_mean>=0.9": float(np.mean([r["recall_above_threshold"] for r in sfp_rows])) >= 0.9,
        "absent_share_mean<0.05": float(np.mean([r["absent_share"] for r in sfp_rows])) < 0.05,
        "seeds_with_recall>=0.9": sum(r["recall_above_threshold"] >= 0.9 for r in sfp_rows),
        "missed_words_assembled": all(r["missed_assembled"] == r["missed"] for r in sfp_rows),
    }
    emit(
        {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "results": {
                "params": {"n": N, "dictionary": DICTIONARY, "zipf": 1.2, "epsilon": 4.0, "k": 1024, "m": 1024},
                "sketches": rows,
                "sketch_summary": summary,
                "dictionary_query_250k": big,
                "sfp": sfp_rows,
                "sfp_summary": sfp_summary,
            },
        }
    )


if __name__ == "__main__":
    main()
