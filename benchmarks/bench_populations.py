"""Releases on populations the decoders do not fully know: RAPPOR with guessed candidate
lists, CMS and HCMS on real word populations (issue 33; docs/estimation.md).

Run: ``python -m benchmarks.bench_populations [--population zipf --population de ...]
[--coverage 0.5 --coverage 0.8 --coverage 0.95] [--only rappor|cms|hcms] [--min-released 400]
[--max-seeds 400] [--max-wall SECONDS] [--reports 1000000] [--strings 5000] [--decoys 1000] [--sigma inf] [--model-only]
[--small]``.
Prints JSON (progress on stderr). ``--small`` runs the small sketches of
``benchmarks.bench_release.SMALL_REGISTRY`` (the deployed ε and release settings), for the tests.

**Populations** (``--population``; default ``zipf``, ``en`` and ``de``): ``zipf`` is
``benchmarks.bench_release``'s Zipf(1.1) over synthetic strings; any other name is a
language of the ``wordfreq`` package (``en``, ``de``, ``fr``, ``es``, ...): its ``--strings``
most frequent words (letters and the apostrophe), drawn with their published frequencies.
Every seed draws ``--reports`` reports from the population (a multinomial draw: the truth is
what was drawn).

**RAPPOR's candidates are a guess.** A deployment's candidate list never holds the whole
population (004 §5). Here, per seed, the list takes the population's strings in a guessed
order until it holds ``--coverage`` of the reports (nested lists: the 50 % list is part of
the 80 % one). By default the order is random: the guess knows which strings exist, not how
often they occur, so a list that holds half the reports misses about half of the heavy
strings too, and what it misses lands on the candidates' bits. ``--sigma`` orders by a
guessed frequency instead, the true one times ``exp(σ Z)`` (a guess off by a factor of
``e^σ`` either way at one σ; heavy strings then go missing only for large σ). ``--decoys``
strings that never occur are added (the words ranked just after the population, or
synthetic strings for ``zipf``). Reports are privatized once per seed with the server half's
vectorised privatizer (``privatize_many``, cohorts uniform) and decoded against each list
through :func:`collector.estimation.estimate_aggregate`, the function the HTTP API, the CLI
and the dashboard call, with ``homepage``'s parameters and rule (004 §5.4; BH at 0.05,
threshold 0). CMS (``emoji``) and HCMS (``safari-energy-domains``) run on the word
populations with the population as their dictionary, at ``release_threshold = 1,000``.

Seeds run from ``--seed`` on until every setting (population, mechanism and, for RAPPOR,
coverage) has pooled ``--min-released`` released entries (CMS and HCMS:
``--sketch-min-released``), or ``--max-seeds`` seeds have run, or ``--max-wall`` seconds
have passed since the start (no seed starts after that; a seed under way finishes, and
``short_of_target`` lists the settings that pooled less than asked).
Per setting (``settings``):

* ``released``, ``false_released`` and ``precision``: a release is false when the true count
  is below the threshold, or 0 (a string that never occurs);
* ``coverage`` (with its binomial ``coverage_se``): the share of released entries whose
  interval as shown (conditional on release, docs/estimation.md) holds the true count;
  ``rms_over_se``: the RMS of (count - truth) / the SE shown with a released entry;
* RAPPOR: ``unexplained_share`` (the mean over seeds of the share of the reports the
  estimate says the fitted candidates do not explain, ``estimate.unexplained.share``) next
  to ``outside_share`` (the true share of the reports whose string is not a candidate) and
  ``decoys_released``;
* ``ok``: the verdicts (precision ≥ 0.95 and coverage within [0.93, 0.97], pooled).

``--model-only`` adds, per RAPPOR setting, the same releases from the same reports with the
standard errors the decoder gave before (the least-squares variance times the dispersion, no
residual variance; ``RapporDecoder(residual_variance=False)`` through the same release rule),
as the settings of mechanism ``rappor-model-variance``: what the residuals' variance changes.

``wall_s`` is the run's wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.bench_release import REGISTRY, SMALL_REGISTRY, ZIPF, synthetic_strings, top_words
from benchmarks.harness import emit, progress
from collector.decoding.rappor import RapporDecoder
from collector.decoding.release import ReleaseRule, release
from collector.estimation import estimate_aggregate
from collector.results import FrequencyEntry, ReleaseDecision
from collector.store import KeyInfo
from protocol.randomness import SeededRandom, uniform_ints
from protocol.registry import UseCase, parse_registry

ROOT = Path(__file__).resolve().parents[1]
USE_CASES = {"rappor": "homepage", "cms": "emoji", "hcms": "safari-energy-domains"}
POPULATIONS = ("zipf", "en", "de")
COVERAGES = (0.5, 0.8, 0.95)
PRECISION_TARGET = 0.95
COVERAGE_RANGE = (0.93, 0.97)
STRINGS = 5_000
DECOYS = 1_000
SIGMA = math.inf
WORD_LENGTH = 20
_STEP = 1 << 17
MODEL_ONLY = "rappor-model-variance"
"""The comparison setting of ``--model-only``: the decoder's standard errors before issue 33."""
MISSES_SHOWN = 40
"""The released entries whose interval missed the truth, listed per setting (largest truth first)."""


@dataclass
class Population:
    """A population: its strings, their weights (published frequencies or Zipf), and decoys."""

    name: str
    strings: list[str]
    weights: npt.NDArray[np.float64]
    decoys: list[str]


def word_population(language: str, strings: int, decoys: int) -> Population:
    """The ``strings`` most frequent words of ``language`` (letters and the apostrophe, at most
    ``WORD_LENGTH`` characters) with their published frequencies, and the ``decoys`` words
    ranked just after them (:func:`benchmarks.bench_release.top_words`)."""
    found, fake, weights = top_words(
        language, strings, decoys, lambda w: 0 < len(w) <= WORD_LENGTH and all(ch.isalpha() or ch == "'" for ch in w)
    )
    return Population(language, found, weights, fake)


def zipf_population(strings: int, decoys: int) -> Population:
    """``benchmarks.bench_release``'s Zipf(1.1) population over synthetic strings (fixed: seed 0)."""
    gen = np.random.default_rng(0)
    found = synthetic_strings(gen, strings)
    fake = synthetic_strings(gen, decoys, avoid=frozenset(found))
    return Population("zipf", found, np.arange(1, strings + 1, dtype=np.float64) ** -ZIPF, fake)


def make_population(name: str, strings: int, decoys: int) -> Population:
    """``zipf`` or a ``wordfreq`` language."""
    return zipf_population(strings, decoys) if name == "zipf" else word_population(name, strings, decoys)


def guessed_lists(
    counts: npt.NDArray[np.int64], weights: npt.NDArray[np.float64], coverages: Sequence[float], sigma: float, gen: Any
) -> list[npt.NDArray[np.int64]]:
    """Indices of the strings on each candidate list: the strings ranked by ``weight exp(σ Z)``
    and taken in that order until the list holds ``coverage`` of the reports (nested lists)."""
    if math.isinf(sigma):
        order = gen.permutation(weights.size)
    else:
        guess = np.log(weights) + sigma * gen.standard_normal(weights.size)
        order = np.argsort(-guess, kind="stable")
    share = np.cumsum(counts[order]) / max(int(counts.sum()), 1)
    return [order[: int(np.searchsorted(share, c)) + 1] for c in coverages]


@dataclass
class Setting:
    """Pooled figures of one (population, mechanism, coverage)."""

    population: str
    mechanism: str
    coverage_target: float | None
    seeds: int = 0
    released: int = 0
    false_released: int = 0
    covered: int = 0
    squared_errors: float = 0.0
    decoys_released: int = 0
    unexplained: list[float] = field(default_factory=list)
    unexplained_se: list[float] = field(default_factory=list)
    outside: list[float] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    misses: list[list[Any]] = field(default_factory=list)

    def add(
        self, items: Sequence[FrequencyEntry], truth: dict[str, int], threshold: float, decoys: frozenset[str]
    ) -> None:
        """Fold one seed's released entries."""
        self.seeds += 1
        for it in items:
            true = truth.get(it.value, 0)
            self.released += 1
            self.false_released += int(true < threshold or true <= 0)
            covered = _covers(it, true)
            self.covered += int(covered)
            if not covered:
                self.misses.append([it.value, true, it.count, it.standard_error, it.selection_standard_error, *it.ci])
            shown = it.selection_standard_error if it.selection_standard_error is not None else it.standard_error
            if it.count is not None and shown:
                self.squared_errors += ((it.count - true) / shown) ** 2
            self.decoys_released += int(it.value in decoys)

    def summary(self) -> dict[str, Any]:
        """The pooled figures and their verdicts."""
        r = self.released
        coverage = self.covered / r if r else None
        precision = 1 - self.false_released / r if r else None
        row: dict[str, Any] = {
            "population": self.population,
            "mechanism": self.mechanism,
            "seeds": self.seeds,
            "released": r,
            "released_per_seed": round(r / self.seeds, 2) if self.seeds else None,
            "false_released": self.false_released,
            "precision": None if precision is None else round(precision, 4),
            "coverage": None if coverage is None else round(coverage, 4),
            "coverage_se": None if coverage is None else round(math.sqrt(coverage * (1 - coverage) / r), 4),
            "rms_over_se": round(math.sqrt(self.squared_errors / r), 4) if r else None,
        }
        if self.coverage_target is not None:
            row.update(
                candidate_coverage=self.coverage_target,
                candidates_mean=round(float(np.mean(self.candidates)), 1) if self.candidates else None,
                decoys_released=self.decoys_released,
                unexplained_share=_mean(self.unexplained),
                unexplained_share_se_mean=_mean(self.unexplained_se),
                outside_share=_mean(self.outside),
            )
        # The misses, largest truth first: what a reader needs to tell chance from a pattern.
        row["misses"] = sorted(self.misses, key=lambda x: -int(x[1]))[:MISSES_SHOWN]
        row["ok"] = {
            f"precision>={PRECISION_TARGET}": r > 0 and self.false_released <= (1 - PRECISION_TARGET) * r,
            f"coverage in {list(COVERAGE_RANGE)}": coverage is not None
            and COVERAGE_RANGE[0] <= coverage <= COVERAGE_RANGE[1],
        }
        return row


def _mean(xs: Sequence[float]) -> float | None:
    return round(float(np.mean(xs)), 4) if xs else None


def _covers(it: FrequencyEntry, true: int) -> bool:
    low, high = it.ci
    return (low is None or low <= true) and (high is None or true <= high)


def _aggregate(use_case: UseCase, values: list[str], seed: int) -> Any:
    """The period's aggregate of ``values``, privatized with the server half's batch path."""
    server: Any = use_case.server
    rng = SeededRandom(seed)
    agg = server.new_aggregate()
    rappor = use_case.mechanism.name == "rappor"
    cohorts = uniform_ints(rng, server.mechanism.cohorts, len(values)) if rappor else None
    for start in range(0, len(values), _STEP):
        part = values[start : start + _STEP]
        if cohorts is None:
            agg.add(server.privatize_many(part, rng))
        else:
            agg.add(server.privatize_many(part, cohorts[start : start + _STEP], rng))
    return agg


def _decide(use_case: UseCase, agg: Any, dictionary: Path, n: int) -> ReleaseDecision:
    uc = dataclasses.replace(use_case, collector=dataclasses.replace(use_case.collector, dictionary=str(dictionary)))
    result = estimate_aggregate(uc, agg, KeyInfo(uc.name, 0, n, n))
    if not isinstance(result.estimate, ReleaseDecision):
        raise TypeError(f"{uc.name}: expected a frequency output; got {result.withheld_reason}")
    return result.estimate


def _model_only(uc: UseCase, agg: Any, words: list[str]) -> list[FrequencyEntry]:
    """The released entries of the same decoding with the model's variance times the dispersion
    and no residual variance (the decoder before issue 33), through the same release rule."""
    settings = uc.collector
    rule = ReleaseRule(
        min_reports=settings.min_reports,
        threshold=settings.release_threshold,
        control=settings.correction,
        alpha=settings.alpha,
    )
    server: Any = uc.server
    decoder = RapporDecoder(control=rule.control, alpha=rule.alpha or 0.05, residual_variance=False)
    decoding = decoder.decode_bits(server, server.estimate_bits(agg), words)
    detail = release(decoding.candidates, decoding.counts, decoding.standard_errors, n=decoding.n, rule=rule)
    return [
        FrequencyEntry(
            value=str(detail.values[i]),
            count=float(detail.counts[i]),
            standard_error=float(detail.standard_errors[i]),
            ci=(float(detail.lows[i]), float(detail.highs[i])),
            z=float(detail.z[i]),
            p_value=float(detail.p_values[i]),
            released=True,
            selection_standard_error=float(detail.selection_standard_errors[i]),
        )
        for i in detail.order(detail.released)
    ]


def _draw(pop: Population, reports: int, gen: np.random.Generator) -> tuple[npt.NDArray[np.int64], list[str]]:
    counts = gen.multinomial(reports, pop.weights / pop.weights.sum()).astype(np.int64)
    order = np.repeat(np.arange(len(pop.strings)), counts)
    gen.shuffle(order)
    return counts, [pop.strings[i] for i in order.tolist()]


@dataclass(frozen=True)
class Draw:
    """One seed's reports: their true counts per string, the reports, and the truth by string."""

    seed: int
    counts: npt.NDArray[np.int64]
    values: list[str]
    truth: dict[str, int]


@dataclass
class Run:
    """What one invocation runs, and its pooled settings."""

    registry: Any
    reports: int
    coverages: tuple[float, ...]
    sigma: float
    min_released: int
    sketch_min_released: int
    max_seeds: int
    first_seed: int
    model_only: bool = False
    deadline: float = math.inf
    """``time.perf_counter()`` after which no seed starts (``--max-wall``)."""
    settings: dict[tuple[str, str, float | None], Setting] = field(default_factory=dict)

    def setting(self, population: str, mechanism: str, coverage: float | None) -> Setting:
        """The pooled figures of one setting (created on first use)."""
        key = (population, mechanism, coverage)
        if key not in self.settings:
            self.settings[key] = Setting(population, mechanism, coverage)
        return self.settings[key]

    def population(self, pop: Population, mechanisms: Sequence[str]) -> None:
        """Seeds on ``pop`` until each of its settings has pooled ``min_released`` entries."""
        wanted = [m for m in mechanisms if m == "rappor" or pop.name != "zipf"]
        for seed in range(self.first_seed, self.first_seed + self.max_seeds):
            todo = [m for m in wanted if not self._enough(pop.name, m)]
            if not todo or time.perf_counter() >= self.deadline:
                break
            gen = np.random.default_rng([seed, 33])
            counts, values = _draw(pop, self.reports, gen)
            truth = {s: int(c) for s, c in zip(pop.strings, counts.tolist(), strict=True) if c}
            draw = Draw(seed, counts, values, truth)
            with tempfile.TemporaryDirectory() as tmp:
                for mechanism in todo:
                    if mechanism == "rappor":
                        self._rappor(pop, draw, gen, Path(tmp))
                    else:
                        self._sketch(pop, mechanism, draw, Path(tmp))

    def _enough(self, population: str, mechanism: str) -> bool:
        # The comparison (MODEL_ONLY) rides along with RAPPOR's seeds; it sets no target of its own.
        targets = self.coverages if mechanism == "rappor" else (None,)
        wanted = self.min_released if mechanism == "rappor" else self.sketch_min_released
        return all(self.setting(population, mechanism, c).released >= wanted for c in targets)

    def _rappor(self, pop: Population, draw: Draw, gen: np.random.Generator, tmp: Path) -> None:
        seed, counts, values, truth = draw.seed, draw.counts, draw.values, draw.truth
        uc: UseCase = self.registry.use_cases[USE_CASES["rappor"]]
        agg = _aggregate(uc, values, seed * 10 + 1)
        decoys = frozenset(pop.decoys)
        for coverage, listed in zip(
            self.coverages, guessed_lists(counts, pop.weights, self.coverages, self.sigma, gen), strict=True
        ):
            words = [pop.strings[i] for i in listed.tolist()] + pop.decoys
            path = tmp / f"candidates-{coverage}.txt"
            path.write_text("\n".join(words) + "\n", encoding="utf-8")
            decision = _decide(uc, agg, path, len(values))
            s = self.setting(pop.name, "rappor", coverage)
            s.add(decision.items, truth, float(uc.collector.release_threshold), decoys)
            s.candidates.append(len(words))
            s.outside.append(1 - float(counts[listed].sum()) / len(values))
            un = decision.unexplained
            if un is not None and un.value is not None:
                s.unexplained.append(un.value / len(values))
                s.unexplained_se.append((un.standard_error or math.nan) / len(values))
            if self.model_only:
                items = _model_only(uc, agg, words)
                m = self.setting(pop.name, MODEL_ONLY, coverage)
                m.add(items, truth, float(uc.collector.release_threshold), decoys)
            progress(
                f"{pop.name} seed {seed} rappor {coverage}: released {len(decision.items)}, "
                f"pooled {s.released}, false {s.false_released}, covered {s.covered}"
            )

    def _sketch(self, pop: Population, mechanism: str, draw: Draw, tmp: Path) -> None:
        seed, values, truth = draw.seed, draw.values, draw.truth
        uc: UseCase = self.registry.use_cases[USE_CASES[mechanism]]
        path = tmp / "population.txt"
        if not path.exists():
            path.write_text("\n".join(pop.strings) + "\n", encoding="utf-8")
        agg = _aggregate(uc, values, seed * 10 + (2 if mechanism == "cms" else 3))
        decision = _decide(uc, agg, path, len(values))
        s = self.setting(pop.name, mechanism, None)
        s.add(decision.items, truth, float(uc.collector.release_threshold), frozenset())
        progress(
            f"{pop.name} seed {seed} {mechanism}: released {len(decision.items)}, pooled {s.released}, "
            f"false {s.false_released}, covered {s.covered}"
        )


def run(
    *,
    populations: Sequence[str] = POPULATIONS,
    mechanisms: Sequence[str] = tuple(USE_CASES),
    coverages: Sequence[float] = COVERAGES,
    reports: int = 1_000_000,
    strings: int = STRINGS,
    decoys: int = DECOYS,
    sigma: float = SIGMA,
    min_released: int = 400,
    sketch_min_released: int = 1_000,
    max_seeds: int = 400,
    seed: int = 1,
    small: bool = False,
    model_only: bool = False,
    max_wall: float = math.inf,
) -> dict[str, Any]:
    """Every setting asked for; the JSON document."""
    started = time.perf_counter()
    source = SMALL_REGISTRY if small else REGISTRY.read_bytes()
    registry = parse_registry(source, source="bench_release --small" if small else str(REGISTRY))
    job = Run(
        registry, reports, tuple(coverages), sigma, min_released, sketch_min_released, max_seeds, seed, model_only
    )
    job.deadline = started + max_wall
    for name in populations:
        job.population(make_population(name, strings, decoys), mechanisms)
    order = sorted(job.settings.values(), key=lambda s: (s.population, s.mechanism, s.coverage_target or 0.0))
    settings = [s.summary() for s in order if s.seeds]
    short = [
        [s.population, s.mechanism, s.coverage_target]
        for s in order
        if s.mechanism != MODEL_ONLY and s.released < (min_released if s.mechanism == "rappor" else sketch_min_released)
    ]
    return {
        "benchmark": "populations",
        "parameters": {
            "reports": reports,
            "strings": strings,
            "decoys": decoys,
            "guess": "random order" if math.isinf(sigma) else f"log-normal, sigma {sigma:g}",
            "min_released": min_released,
            "sketch_min_released": sketch_min_released,
            "max_seeds": max_seeds,
            "max_wall_s": None if math.isinf(max_wall) else max_wall,
            "first_seed": seed,
            "registry": "SMALL_REGISTRY" if small else str(REGISTRY.relative_to(ROOT)),
        },
        "settings": settings,
        "all_ok": all(all(s["ok"].values()) for s in settings),
        "short_of_target": short,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }


def main(argv: list[str] | None = None) -> None:
    """Run the settings and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", action="append", help=f"zipf or a wordfreq language (default {POPULATIONS})")
    parser.add_argument("--only", choices=list(USE_CASES), action="append")
    parser.add_argument("--coverage", type=float, action="append", help=f"candidate coverage (default {COVERAGES})")
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--strings", type=int, default=STRINGS)
    parser.add_argument("--decoys", type=int, default=DECOYS)
    parser.add_argument("--sigma", type=float, default=SIGMA, help="the guess's log-normal error (inf: random order)")
    parser.add_argument("--min-released", type=int, default=400, help="RAPPOR's entries to pool per setting")
    parser.add_argument("--sketch-min-released", type=int, default=1_000, help="CMS's and HCMS's")
    parser.add_argument("--max-seeds", type=int, default=400)
    parser.add_argument("--max-wall", type=float, default=math.inf, help="seconds after which no seed starts")
    parser.add_argument("--seed", type=int, default=1, help="first seed")
    parser.add_argument("--small", action="store_true", help="small sketches, the same ε and release settings")
    parser.add_argument(
        "--model-only", action="store_true", help="also release RAPPOR with the model's variance times the dispersion"
    )
    args = parser.parse_args(argv)
    coverages = tuple(args.coverage or COVERAGES)
    if not all(0 < c <= 1 for c in coverages):
        parser.error("--coverage takes shares in (0, 1]")
    counts = (args.reports, args.strings, args.min_released, args.sketch_min_released, args.max_seeds)
    if min(counts) < 1 or args.decoys < 0 or args.sigma < 0:
        parser.error("--reports, --strings, --min-released, --sketch-min-released and --max-seeds take positive counts")
    emit(
        run(
            populations=tuple(args.population or POPULATIONS),
            mechanisms=tuple(args.only or USE_CASES),
            coverages=coverages,
            reports=args.reports,
            strings=args.strings,
            decoys=args.decoys,
            sigma=args.sigma,
            min_released=args.min_released,
            sketch_min_released=args.sketch_min_released,
            max_seeds=args.max_seeds,
            seed=args.seed,
            small=args.small,
            model_only=args.model_only,
            max_wall=args.max_wall,
        )
    )


if __name__ == "__main__":
    main()
