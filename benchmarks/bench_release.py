"""What the collector releases from frequency outputs: precision and recall at the deployed parameters.

Run: ``python -m benchmarks.bench_release [--seed 1] [--reports 1000000] [--strings 20000] [--small]``.
Prints JSON (progress on stderr). ``--small`` runs the same three use cases with small
sketches (``SMALL_REGISTRY``: the same ε and release settings), for the tests.

The population is a Zipf(1.1) draw of ``10^6`` reports over 20,000 synthetic strings (3-9
characters of ``a-z``, one in twenty with an apostrophe, as in ``don't``). Each of the three
deployed use cases of ``deploy/usecases.example.toml`` is run on it with its own parameters
and release settings: ``emoji`` (CMS, ``k = 65,536``, ``m = 1,024``, ε = 4), ``safari-energy-
domains`` (HCMS, ``k = 1,024``, ``m = 32,768``, ε = 4) and ``new-words`` (SFP, the 003 §6.1
parameters), all with ``release_threshold = 1,000`` and no correction named, so the default
rule applies (Benjamini-Hochberg at 0.05 on the one-sided tests against the threshold,
:mod:`collector.decoding.release`). The 20,000 strings are the CMS and HCMS dictionary; SFP
discovers words from its own reports. Reports are privatized with the seeded batch APIs
(``privatize_many``) and the release is computed by
:func:`collector.estimation.estimate_aggregate`, the function the HTTP API, the CLI and the
dashboard call.

Per mechanism:

* ``released``: entries released;
* ``precision``: the share of released entries whose true count is at least the release
  threshold ``T`` (the rule's promise: at least 0.95 in expectation), with its verdict
  ``precision>=0.95`` (true when nothing is released);
* ``recall``: the share of entries with a true count of at least ``T + 4 SE`` that are
  released (SE: the entry's reported standard error, or the median one for SFP words the
  puzzle did not assemble);
* ``count_threshold_only``: what the count threshold alone (the rule before the test) would
  have released from the same estimates, and its precision (CMS and HCMS; for SFP over the
  words the puzzle assembled).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress
from collector.estimation import estimate_aggregate
from collector.results import ReleaseDecision
from collector.store import KeyInfo
from protocol.randomness import SeededRandom
from protocol.registry import UseCase, parse_registry

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
USE_CASES = (("cms", "emoji"), ("hcms", "safari-energy-domains"), ("sfp", "new-words"))
STRINGS = 20_000
PRECISION_TARGET = 0.95
SMALL_REGISTRY = """
format = 1
salt = "0547eed0fe23ed365173a6e9b965e343b4927d0967009d668d6df9ead8a2030c"

[use_cases.emoji]
mechanism = "cms"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 1_500
parameters = { k = 256, m = 1_024 }
[use_cases.emoji.collector]
min_reports = 10_000
release_threshold = 1_000

[use_cases.safari-energy-domains]
mechanism = "hcms"
epsilon = 4
period = "1d"
daily_limit = 2
lifetime_epsilon = 3_000
parameters = { k = 64, m = 1_024 }
[use_cases.safari-energy-domains.collector]
min_reports = 10_000
release_threshold = 1_000

[use_cases.new-words]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 2
lifetime_epsilon = 6_000
parameters = { epsilon = 2, epsilon_fragment = 6, m = 1_024, k = 256, m_fragment = 1_024, k_fragment = 256 }
[use_cases.new-words.collector]
min_reports = 10_000
release_threshold = 1_000
"""
"""The deployed use cases' ε and release settings with small sketches (``--small``); the
dictionary of the CMS and HCMS use cases is the synthetic population, as at full size."""
ZIPF = 1.1
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))
_STEP = 1 << 17


def population(gen: np.random.Generator, strings: int = STRINGS) -> list[str]:
    """``strings`` distinct strings of 3-9 characters; one in twenty carries an apostrophe."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < strings:
        size = int(gen.integers(3, 10))
        word = "".join(LETTERS[gen.integers(0, 26, size=size)])
        if gen.random() < 0.05:
            cut = int(gen.integers(1, size))
            word = word[:cut] + "'" + word[cut + 1 :]
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def _reports(strings: list[str], n: int, gen: np.random.Generator) -> tuple[list[str], dict[str, int]]:
    weights = np.arange(1, len(strings) + 1, dtype=np.float64) ** -ZIPF
    counts = gen.multinomial(n, weights / weights.sum())
    order = np.repeat(np.arange(len(strings)), counts)
    gen.shuffle(order)
    truth = {s: int(c) for s, c in zip(strings, counts.tolist(), strict=True) if c}
    return [strings[i] for i in order.tolist()], truth


def _run(use_case: UseCase, values: list[str], truth: dict[str, int], *, seed: int) -> dict[str, Any]:
    mech: Any = use_case.server
    rng = SeededRandom(seed)
    agg = mech.new_aggregate()
    t0 = time.perf_counter()
    for start in range(0, len(values), _STEP):
        agg.add(mech.privatize_many(values[start : start + _STEP], rng))
    privatize_s = time.perf_counter() - t0
    info = KeyInfo(use_case.name, 0, len(values), len(values))
    t0 = time.perf_counter()
    result = estimate_aggregate(use_case, agg, info, withheld=True)
    estimate_s = time.perf_counter() - t0
    est = result.estimate
    if not isinstance(est, ReleaseDecision) or est.withheld_items is None:
        raise TypeError(f"{use_case.name}: expected every entry of a frequency output")
    threshold = float(use_case.collector.release_threshold)
    released = {it.value: it for it in est.items}
    everything = released | {it.value: it for it in est.withheld_items}
    ses = [it.standard_error for it in everything.values() if it.standard_error is not None]
    median_se = float(np.median(ses)) if ses else float("nan")

    def se_of(value: str) -> float:
        entry = everything.get(value)
        se = None if entry is None else entry.standard_error
        return median_se if se is None else float(se)

    true_released = sum(1 for v in released if truth.get(v, 0) >= threshold)
    strong = [v for v, c in truth.items() if c >= threshold + 4 * se_of(v)]
    found_strong = sum(1 for v in strong if v in released)
    naive = [v for v, it in everything.items() if it.count is not None and it.count >= threshold]
    naive_true = sum(1 for v in naive if truth.get(v, 0) >= threshold)
    row: dict[str, Any] = {
        "use_case": use_case.name,
        "release_threshold": threshold,
        "correction": est.correction,
        "alpha": est.alpha,
        "tested": est.tested,
        "released": len(released),
        "precision": round(true_released / len(released), 4) if released else None,
        f"precision>={PRECISION_TARGET}": len(released) - true_released <= (1 - PRECISION_TARGET) * len(released),
        "false_released": len(released) - true_released,
        "true_at_least_threshold": sum(1 for c in truth.values() if c >= threshold),
        "strong_entries": len(strong),
        "recall": round(found_strong / len(strong), 4) if strong else None,
        "median_standard_error": round(median_se, 1),
        "count_threshold_only": {
            "released": len(naive),
            "precision": round(naive_true / len(naive), 4) if naive else None,
        },
        "privatize_s": round(privatize_s, 2),
        "estimate_s": round(estimate_s, 2),
    }
    if est.top_t is not None:
        row["top_t"] = est.top_t
        row["alphabet"] = est.alphabet
        row["missed_strong"] = sorted(
            ([v, truth[v], everything[v].count if v in everything else None] for v in strong if v not in released),
            key=lambda x: -int(x[1]),
        )
    return row


def run(
    seed: int = 1,
    reports: int = 1_000_000,
    *,
    strings: int = STRINGS,
    only: Sequence[str] = (),
    small: bool = False,
) -> dict[str, Any]:
    """The use cases asked for (``only``: their mechanisms); the JSON document."""
    if small:
        registry = parse_registry(SMALL_REGISTRY, source="bench_release --small")
    else:
        registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    gen = np.random.default_rng(seed)
    population_strings = population(gen, strings)
    values, truth = _reports(population_strings, reports, gen)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dictionary = Path(tmp) / "population.txt"
        dictionary.write_text("\n".join(population_strings) + "\n", encoding="utf-8")
        for index, (kind, name) in enumerate(USE_CASES):
            if only and kind not in only:
                continue
            uc = registry.use_cases[name]
            if kind != "sfp":
                # The deployed settings, with the synthetic population as the dictionary.
                uc = dataclasses.replace(uc, collector=dataclasses.replace(uc.collector, dictionary=str(dictionary)))
            progress(f"{kind}: {name}, {len(values)} reports")
            row = _run(uc, values, truth, seed=seed * 10 + index)
            row["mechanism"] = kind
            progress(f"{kind}: released {row['released']}, precision {row['precision']}, recall {row['recall']}")
            rows.append(row)
    return {
        "benchmark": "release",
        "population": {"strings": strings, "zipf": ZIPF, "reports": reports, "seed": seed},
        "registry": "SMALL_REGISTRY" if small else str(REGISTRY.relative_to(ROOT)),
        "mechanisms": rows,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }


def main(argv: list[str] | None = None) -> None:
    """Run the three use cases and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--strings", type=int, default=STRINGS, help=f"distinct strings (default {STRINGS:,})")
    parser.add_argument("--only", choices=[m for m, _ in USE_CASES], action="append")
    parser.add_argument("--small", action="store_true", help="small sketches, the same ε and release settings")
    args = parser.parse_args(argv)
    if args.reports < 1 or args.strings < 1:
        parser.error("--reports and --strings take positive counts")
    emit(run(args.seed, args.reports, strings=args.strings, only=args.only or (), small=args.small))


if __name__ == "__main__":
    main()
