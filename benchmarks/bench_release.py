"""What the collector releases from frequency outputs, and whether the intervals shown with it hold.

Run: ``python -m benchmarks.bench_release [--seed 1] [--seeds N] [--reports 1000000]
[--strings 20000] [--population zipf] [--population words] [--only cms|hcms|sfp|rappor] [--small]``.
Prints JSON (progress on stderr). ``--small`` runs the same four use cases with small
sketches (``SMALL_REGISTRY``: the same ε and release settings), for the tests.

Populations (``--population``, default ``zipf``; seeds ``--seed`` .. ``--seed + --seeds - 1``):

* ``zipf``: a Zipf(1.1) draw of ``10^6`` reports over 20,000 synthetic strings (3-9
  characters of ``a-z``, one in twenty with an apostrophe, as in ``don't``);
* ``words``: the 20,000 most frequent English words of at most 10 letters (``a-z`` and the
  apostrophe) drawn with their published frequencies (the ``wordfreq`` package's list;
  ``pip install wordfreq`` into the benchmark's environment, nothing else needs it).

Each of the four deployed use cases of ``deploy/usecases.example.toml`` is run on it with its
own parameters and release settings: ``emoji`` (CMS, ``k = 65,536``, ``m = 1,024``, ε = 4),
``safari-energy-domains`` (HCMS, ``k = 1,024``, ``m = 32,768``, ε = 4), ``new-words`` (SFP,
the 003 §6.1 parameters), all three with ``release_threshold = 1,000`` and the default rule
(Benjamini-Hochberg at 0.05 on the one-sided tests against the threshold,
:mod:`collector.decoding.release`), and ``homepage`` (RAPPOR, 004 §5.4's parameters, BH at
0.05, threshold 0). The population's strings are the CMS and HCMS dictionary; SFP discovers
words from its own reports; RAPPOR decodes against the population's 100 most frequent
strings and 100 decoys that never occur (the shape of 004 §5.2's simulation; the words
ranked just after the population for ``words``). Reports are privatized with the seeded
batch APIs (``privatize_many``; RAPPOR's cohorts uniform) and the release is computed by
:func:`collector.estimation.estimate_aggregate`, the function the HTTP API, the CLI and the
dashboard call.

Per mechanism and seed (``mechanisms``):

* ``released``: entries released;
* ``precision``: the share of released entries whose true count is at least the release
  threshold ``T`` and above 0 (a string that never occurs is a false release at ``T = 0``);
  ``false_discovery_proportion`` is one minus it (0 when nothing is released);
* ``recall``: the share of entries with a true count of at least ``T + 4 SE`` that are
  released (SE: the entry's reported standard error, or the median one for SFP words the
  puzzle did not assemble; for RAPPOR among its candidates);
* ``coverage``: the share of released entries whose interval, as shown (conditional on
  release, docs/estimation.md), holds the true count;
* ``rms_over_se``: the RMS over released entries of (shown count - true count) / shown SE
  (the selection-adjusted SE the CLI and the dashboard show for released entries);
* ``count_threshold_only``: what the count threshold alone (the rule before the test) would
  have released from the same estimates, and its precision (CMS and HCMS; for SFP over the
  words the puzzle assembled);
* ``decoys_released`` (RAPPOR): decoys released.

``summary`` pools the seeds per population and mechanism: coverage and RMS / SE over every
released entry (a seed releases a handful of RAPPOR strings, too few for a coverage of its
own), precision and recall pooled (and their worst seed), the false discovery rate (the mean
over seeds of the false share, which BH at 0.05 bounds by 0.05) with its standard error, and
the verdicts against the targets (precision ≥ 0.95, recall ≥ 0.90, coverage in
[0.93, 0.97], RMS / SE ≤ 1.15).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress
from collector.estimation import estimate_aggregate
from collector.results import FrequencyEntry, ReleaseDecision
from collector.store import KeyInfo
from collector.threads import numpy_threads
from protocol.randomness import SeededRandom, uniform_ints
from protocol.registry import UseCase, parse_registry
from protocol.server.rappor import RapporServer

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
USE_CASES = (("cms", "emoji"), ("hcms", "safari-energy-domains"), ("sfp", "new-words"), ("rappor", "homepage"))
STRINGS = 20_000
PRECISION_TARGET = 0.95
RECALL_TARGET = 0.90
COVERAGE_RANGE = (0.93, 0.97)
RMS_TARGET = 1.15
RAPPOR_PRESENT = 100
"""RAPPOR's candidates: the most frequent strings of the population, and as many decoys that
never occur (the strings a release must not name): the shape of 004 §5.2's simulation."""
POPULATIONS = ("zipf", "words")
WORD_LENGTH = 10
"""Longest word of the ``words`` population: the deployed SFP length (003 §6.1)."""
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

[use_cases.homepage]
mechanism = "rappor"
epsilon = 0.54
period = "1d"
daily_limit = 1
lifetime_epsilon = 200
parameters = { k = 128, h = 2, cohorts = 32, f = 0.75, p = 0.5, q = 0.75 }
[use_cases.homepage.collector]
min_reports = 100_000
correction = "bh"
alpha = 0.05
"""
"""The deployed use cases' ε and release settings with small sketches (``--small``); the
dictionary of the CMS and HCMS use cases is the synthetic population, as at full size."""
ZIPF = 1.1
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))
WORD_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz'")
_STEP = 1 << 17


def synthetic_strings(
    gen: np.random.Generator, strings: int = STRINGS, *, avoid: frozenset[str] = frozenset()
) -> list[str]:
    """``strings`` distinct strings of 3-9 characters, none in ``avoid``; one in twenty carries an apostrophe."""
    seen: set[str] = set(avoid)
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


def population(gen: np.random.Generator, strings: int = STRINGS) -> list[str]:
    """The synthetic population's strings (kept for callers of the single-population benchmark)."""
    return synthetic_strings(gen, strings)


def top_words(
    language: str, strings: int, extra: int, usable: Callable[[str], bool]
) -> tuple[list[str], list[str], np.ndarray]:
    """The ``strings`` most frequent ``usable`` words of ``language`` with their published
    frequencies, and the ``extra`` usable words ranked just after them (the ``wordfreq``
    package, installed with the ``[dev]`` extra, for the benchmarks only).

    Raises:
        SystemExit: wordfreq is not installed, or lists fewer usable words than asked for.
    """
    try:
        # Only the word populations need it, and only on a machine that runs a benchmark.
        wordfreq: Any = importlib.import_module("wordfreq")
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise SystemExit("the word populations need the wordfreq package: pip install wordfreq") from exc
    wanted = strings + extra
    words = [w for w in wordfreq.top_n_list(language, 4 * wanted) if usable(w)][:wanted]
    if len(words) < wanted:
        raise SystemExit(f"wordfreq lists only {len(words)} usable {language} words; asked for {wanted}")
    freqs = np.array([wordfreq.word_frequency(w, language) for w in words[:strings]], dtype=np.float64)
    return words[:strings], words[strings:], freqs


def english_words(strings: int) -> tuple[list[str], list[str], np.ndarray]:
    """The ``strings`` most frequent English words of at most 10 letters (``a-z`` and the
    apostrophe), their published frequencies, and ``RAPPOR_PRESENT`` words ranked just after
    them, which the population never holds (RAPPOR's decoys)."""
    return top_words("en", strings, RAPPOR_PRESENT, lambda w: 0 < len(w) <= WORD_LENGTH and set(w) <= WORD_CHARACTERS)


def make_population(kind: str, gen: np.random.Generator, strings: int) -> tuple[list[str], list[str], np.ndarray]:
    """``(strings, decoys, weights)`` of the population ``kind`` (``zipf`` or ``words``)."""
    if kind == "words":
        return english_words(strings)
    found = synthetic_strings(gen, strings)
    decoys = synthetic_strings(gen, RAPPOR_PRESENT, avoid=frozenset(found))
    return found, decoys, np.arange(1, strings + 1, dtype=np.float64) ** -ZIPF


def _reports(
    strings: list[str], weights: np.ndarray, n: int, gen: np.random.Generator
) -> tuple[list[str], dict[str, int]]:
    counts = gen.multinomial(n, weights / weights.sum())
    order = np.repeat(np.arange(len(strings)), counts)
    gen.shuffle(order)
    truth = {s: int(c) for s, c in zip(strings, counts.tolist(), strict=True) if c}
    return [strings[i] for i in order.tolist()], truth


def _decide(use_case: UseCase, values: list[str], seed: int) -> tuple[ReleaseDecision, float, float]:
    """Privatize ``values`` with the seeded batch API and release through the collector's one path."""
    mech: Any = use_case.server
    rng = SeededRandom(seed)
    agg = mech.new_aggregate()
    t0 = time.perf_counter()
    # RAPPOR's devices are spread uniformly over its cohorts (004 §4).
    cohorts = uniform_ints(rng, mech.mechanism.cohorts, len(values)) if isinstance(mech, RapporServer) else None
    for start in range(0, len(values), _STEP):
        batch = values[start : start + _STEP]
        if cohorts is None:
            agg.add(mech.privatize_many(batch, rng))
        else:
            agg.add(mech.privatize_many(batch, cohorts[start : start + _STEP], rng))
    privatize_s = time.perf_counter() - t0
    info = KeyInfo(use_case.name, 0, len(values), len(values))
    t0 = time.perf_counter()
    with numpy_threads() as threads:  # the service's (collector.threads)
        result = estimate_aggregate(use_case, agg, info, withheld=True, threads=threads)
    estimate_s = time.perf_counter() - t0
    est = result.estimate
    if not isinstance(est, ReleaseDecision) or est.withheld_items is None:
        raise TypeError(f"{use_case.name}: expected every entry of a frequency output")
    return est, privatize_s, estimate_s


def _interval_figures(released: dict[str, FrequencyEntry], truth: dict[str, int]) -> dict[str, Any]:
    """Released-only coverage of the shown intervals, and RMS (shown count - truth) / shown SE:
    the selection-adjusted SE the CLI and the dashboard show (``plain_``: the test's SE)."""
    covered = 0
    squares = []
    plain = []
    for value, it in released.items():
        true = truth.get(value, 0)
        low, high = it.ci
        covered += int((low is None or low <= true) and (high is None or true <= high))
        shown = it.selection_standard_error if it.selection_standard_error is not None else it.standard_error
        if it.count is not None and shown and it.standard_error:
            squares.append(((it.count - true) / shown) ** 2)
            plain.append(((it.count - true) / it.standard_error) ** 2)
    return {
        "covered": covered,
        "coverage": round(covered / len(released), 4) if released else None,
        "squared_errors": round(float(np.sum(squares)), 4),
        "rms_over_se": round(math.sqrt(float(np.mean(squares))), 4) if squares else None,
        "plain_squared_errors": round(float(np.sum(plain)), 4),
    }


def _run(
    use_case: UseCase, values: list[str], truth: dict[str, int], *, seed: int, decoys: Sequence[str] = ()
) -> dict[str, Any]:
    est, privatize_s, estimate_s = _decide(use_case, values, seed)
    withheld_items = est.withheld_items or ()
    threshold = float(use_case.collector.release_threshold)
    released = {it.value: it for it in est.items}
    everything = released | {it.value: it for it in withheld_items}
    ses = [it.standard_error for it in everything.values() if it.standard_error is not None]
    median_se = float(np.median(ses)) if ses else float("nan")

    def se_of(value: str) -> float:
        entry = everything.get(value)
        se = None if entry is None else entry.standard_error
        return median_se if se is None else float(se)

    # A release claims count > max(T, 0): with T = 0 a string that never occurs is false.
    def is_true(value: str) -> bool:
        return truth.get(value, 0) >= threshold and truth.get(value, 0) > 0

    true_released = sum(1 for v in released if is_true(v))
    # RAPPOR can release only its candidates: a string outside them is not missed by the rule.
    candidates = everything if decoys else truth
    strong = [v for v, c in truth.items() if c >= threshold + 4 * se_of(v) and v in candidates]
    found_strong = sum(1 for v in strong if v in released)
    naive = [v for v, it in everything.items() if it.count is not None and it.count >= threshold]
    naive_true = sum(1 for v in naive if is_true(v))
    row: dict[str, Any] = {
        "use_case": use_case.name,
        "release_threshold": threshold,
        "correction": est.correction,
        "alpha": est.alpha,
        "tested": est.tested,
        "interval": est.interval,
        "released": len(released),
        "precision": round(true_released / len(released), 4) if released else None,
        f"precision>={PRECISION_TARGET}": len(released) - true_released <= (1 - PRECISION_TARGET) * len(released),
        "false_released": len(released) - true_released,
        "true_at_least_threshold": sum(1 for c in truth.values() if c >= threshold),
        "false_discovery_proportion": round((len(released) - true_released) / len(released), 4) if released else 0.0,
        "strong_entries": len(strong),
        "found_strong": found_strong,
        "recall": round(found_strong / len(strong), 4) if strong else None,
        **_interval_figures(released, truth),
        "median_standard_error": round(median_se, 1),
        "count_threshold_only": {
            "released": len(naive),
            "precision": round(naive_true / len(naive), 4) if naive else None,
        },
        "privatize_s": round(privatize_s, 2),
        "estimate_s": round(estimate_s, 2),
    }
    if decoys:
        row["decoys"] = len(decoys)
        row["decoys_released"] = sum(1 for v in decoys if v in released)
    if est.top_t is not None:
        row["top_t"] = est.top_t
        row["alphabet"] = est.alphabet
        row["missed_strong"] = sorted(
            ([v, truth[v], everything[v].count if v in everything else None] for v in strong if v not in released),
            key=lambda x: -int(x[1]),
        )
    return row


def _use_case(registry: Any, kind: str, name: str, dictionaries: dict[str, Path]) -> UseCase:
    """The deployed settings, with the population (CMS, HCMS) or the candidates (RAPPOR) as the dictionary."""
    uc: UseCase = registry.use_cases[name]
    if kind in dictionaries:
        uc = dataclasses.replace(uc, collector=dataclasses.replace(uc.collector, dictionary=str(dictionaries[kind])))
    return uc


def run_population(
    kind: str, seed: int, reports: int, *, registry: Any, strings: int, only: Sequence[str]
) -> list[dict[str, Any]]:
    """Every use case asked for on one draw of the population ``kind``."""
    gen = np.random.default_rng(seed)
    found, decoys, weights = make_population(kind, gen, strings)
    values, truth = _reports(found, weights, reports, gen)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dictionaries = {"cms": Path(tmp) / "population.txt", "rappor": Path(tmp) / "candidates.txt"}
        dictionaries["cms"].write_text("\n".join(found) + "\n", encoding="utf-8")
        dictionaries["rappor"].write_text("\n".join(found[:RAPPOR_PRESENT] + decoys) + "\n", encoding="utf-8")
        dictionaries["hcms"] = dictionaries["cms"]
        for index, (mech, name) in enumerate(USE_CASES):
            if only and mech not in only:
                continue
            uc = _use_case(registry, mech, name, dictionaries)
            progress(f"{kind} seed {seed} {mech}: {name}, {len(values)} reports")
            row = _run(uc, values, truth, seed=seed * 10 + index, decoys=decoys if mech == "rappor" else ())
            row.update(mechanism=mech, population=kind, seed=seed)
            progress(
                f"{mech}: released {row['released']}, precision {row['precision']}, recall {row['recall']}, "
                f"coverage {row['coverage']}, rms/se {row['rms_over_se']}"
            )
            rows.append(row)
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (population, mechanism), over the seeds: the figures and their verdicts.

    Coverage and RMS / SE pool the released entries of every seed (a seed releases a few
    dozen entries at the threshold, too few for a coverage on its own); precision and
    recall are the worst seed's.
    """
    out = []
    for key in dict.fromkeys((r["population"], r["mechanism"]) for r in rows):
        group = [r for r in rows if (r["population"], r["mechanism"]) == key]
        released = sum(r["released"] for r in group)
        precisions = [r["precision"] for r in group if r["precision"] is not None]
        recalls = [r["recall"] for r in group if r["recall"] is not None]
        coverage = sum(r["covered"] for r in group) / released if released else None
        rms = math.sqrt(sum(r["squared_errors"] for r in group) / released) if released else None
        plain = math.sqrt(sum(r["plain_squared_errors"] for r in group) / released) if released else None
        strong = sum(r["strong_entries"] for r in group)
        fdp = [r["false_discovery_proportion"] for r in group]
        row: dict[str, Any] = {
            "population": key[0],
            "mechanism": key[1],
            "seeds": [r["seed"] for r in group],
            "released": released,
            "precision": round(1 - sum(r["false_released"] for r in group) / released, 4) if released else None,
            "precision_min": min(precisions) if precisions else None,
            "recall_min": min(recalls) if recalls else None,
            "coverage": None if coverage is None else round(coverage, 4),
            "coverage_se": None if coverage is None else round(math.sqrt(coverage * (1 - coverage) / released), 4),
            "rms_over_se": None if rms is None else round(rms, 4),
            "rms_over_plain_se": None if plain is None else round(plain, 4),
            "recall_pooled": round(sum(r["found_strong"] for r in group) / strong, 4) if strong else None,
            "false_released": sum(r["false_released"] for r in group),
            # What BH bounds: the mean over seeds of the share of false releases (0 when none).
            "false_discovery_rate": round(float(np.mean(fdp)), 4),
            "false_discovery_rate_se": round(float(np.std(fdp, ddof=1) / math.sqrt(len(fdp))), 4)
            if len(fdp) > 1
            else None,
        }
        row["ok"] = {
            # Pooled, like the rule's promise (an expected share): one false string among a
            # seed's eight RAPPOR releases is a precision of 0.875 on that seed alone.
            f"precision>={PRECISION_TARGET}": released == 0
            or row["false_released"] <= (1 - PRECISION_TARGET) * released,
            # Pooled: a seed has a handful of strong RAPPOR strings, so its own recall is 0.8 or 1.
            f"recall>={RECALL_TARGET}": strong > 0 and sum(r["found_strong"] for r in group) >= RECALL_TARGET * strong,
            f"coverage in {list(COVERAGE_RANGE)}": coverage is not None
            and COVERAGE_RANGE[0] <= coverage <= COVERAGE_RANGE[1],
            f"rms/se<={RMS_TARGET}": rms is not None and rms <= RMS_TARGET,
        }
        if any("decoys" in r for r in group):
            row["decoys_released"] = sum(r.get("decoys_released", 0) for r in group)
        out.append(row)
    return out


def run(
    seed: int = 1,
    reports: int = 1_000_000,
    *,
    strings: int = STRINGS,
    only: Sequence[str] = (),
    small: bool = False,
    seeds: int = 1,
    populations: Sequence[str] = ("zipf",),
) -> dict[str, Any]:
    """The use cases asked for (``only``: their mechanisms) on each population and seed; the JSON document."""
    if small:
        registry = parse_registry(SMALL_REGISTRY, source="bench_release --small")
    else:
        registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    rows = [
        row
        for kind in populations
        for s in range(seed, seed + seeds)
        for row in run_population(kind, s, reports, registry=registry, strings=strings, only=only)
    ]
    return {
        "benchmark": "release",
        "population": {"strings": strings, "zipf": ZIPF, "reports": reports, "seed": seed, "seeds": seeds},
        "populations": list(populations),
        "registry": "SMALL_REGISTRY" if small else str(REGISTRY.relative_to(ROOT)),
        "mechanisms": rows,
        "summary": summarize(rows),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }


def main(argv: list[str] | None = None) -> None:
    """Run the use cases and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed on")
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--strings", type=int, default=STRINGS, help=f"distinct strings (default {STRINGS:,})")
    parser.add_argument("--only", choices=[m for m, _ in USE_CASES], action="append")
    parser.add_argument("--population", choices=POPULATIONS, action="append", help="zipf (default) and/or words")
    parser.add_argument("--small", action="store_true", help="small sketches, the same ε and release settings")
    args = parser.parse_args(argv)
    if args.reports < 1 or args.strings < 1 or args.seeds < 1:
        parser.error("--reports, --strings and --seeds take positive counts")
    doc = run(
        args.seed,
        args.reports,
        strings=args.strings,
        only=args.only or (),
        small=args.small,
        seeds=args.seeds,
        populations=args.population or ("zipf",),
    )
    emit(doc)


if __name__ == "__main__":
    main()
