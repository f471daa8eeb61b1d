"""RAPPOR (004 §2): exact ε∞ and ε1, memoized B', unbiased t_ij with honest SE, strict wire form."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from itertools import permutations
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.hashing import HashFamily
from protocol.randomness import SCALE, SeededRandom
from protocol.rappor import Rappor, RapporAggregate, RapporBatch, RapporRecord, RapporState
from tests.protocol.ldp import assert_tight_ldp

SEED = b"rappor-test-seed-0001"
CHROME: dict[str, Any] = {"f": 0.75, "p": 0.5, "q": 0.75}  # 004 §5.4
UNIVERSE = [f"value-{i}" for i in range(20)]


def small(variant: str = "standard", **over: Any) -> Rappor:
    """The exact-LDP configuration: k = 8, h = 2, two cohorts."""
    params: dict[str, Any] = {"k": 8, "h": 2, "cohorts": 2, "seed": SEED, "variant": variant, **CHROME}
    params.update(over)
    return Rappor(**params)


def basic(variant: str = "basic", categories: Sequence[str] = ("a", "b", "c", "d", "e", "f"), **over: Any) -> Rappor:
    """A basic-variant mechanism over a few categories."""
    params: dict[str, Any] = {"k": len(categories), "h": 1, "cohorts": 2, "seed": SEED, "variant": variant}
    params.update(CHROME)
    params.update(over)
    return Rappor(categories=tuple(categories), **params)


def reference_bloom(mech: Rappor, value: str, cohort: int) -> frozenset[int]:
    """Step 1 computed straight from the spec: bit h_{c·h+i}(value) of HashFamily(seed, cohorts·h, k)."""
    if mech.basic:
        return frozenset({mech.categories.index(value)})
    family = HashFamily(mech.seed, count=mech.cohorts * mech.h, range=mech.k)
    return frozenset(family.evaluate_value(value, cohort * mech.h + i) for i in range(mech.h))


def coin_probabilities(mech: Rappor, stage: str) -> tuple[Fraction, Fraction]:
    """``(Pr[1 | B_i = 1], Pr[1 | B_i = 0])`` rebuilt from the implemented coins (004 Lemma 1)."""
    c = mech.prr_coin.probability
    if stage == "permanent" or mech.one_time:
        return 1 - c, c
    q, p = mech.irr_one_coin.probability, mech.irr_zero_coin.probability
    return (1 - c) * q + c * p, c * q + (1 - c) * p


def product_max_ratio(one: Fraction, zero: Fraction, k: int, b1: frozenset[int], b2: frozenset[int]) -> Fraction:
    """max over outputs of Pr[s | B1] / Pr[s | B2] for independent coordinates: the product of per-bit maxima."""
    ratio = Fraction(1)
    for i in range(k):
        p1 = one if i in b1 else zero
        p2 = one if i in b2 else zero
        ratio *= max(p1 / p2, (1 - p1) / (1 - p2))
    return ratio


def exact_worst_case(mech: Rappor, values: Sequence[str], stage: str) -> tuple[float, bool]:
    """The exact max log-ratio over all value pairs and cohorts, and whether a disjoint pair reaches it."""
    one, zero = coin_probabilities(mech, stage)
    bound = mech.epsilon_infinity if stage == "permanent" else mech.epsilon_one
    worst = 0.0
    disjoint_tight = False
    for cohort in range(mech.cohorts):
        blooms = {v: reference_bloom(mech, v, cohort) for v in values}
        for v1, v2 in permutations(values, 2):
            b1, b2 = blooms[v1], blooms[v2]
            lr = math.log(product_max_ratio(one, zero, mech.k, b1, b2))
            worst = max(worst, lr)
            if len(b1) == len(b2) == mech.h and not b1 & b2:
                assert lr == pytest.approx(bound, rel=1e-12)
                disjoint_tight = True
    return worst, disjoint_tight


# ----- privacy ---------------------------------------------------------------------------


def test_epsilons_match_the_paper() -> None:
    """ε1 of 004 §5.4 (0.5343) and §5.3 (1.0743), Theorem 1's ε∞ and each variant's ε_report."""
    chrome = Rappor(k=128, h=2, cohorts=32, seed=SEED, **CHROME)
    assert chrome.epsilon_one == pytest.approx(0.5343, abs=5e-5)
    assert chrome.epsilon_infinity == pytest.approx(2 * 2 * math.log(0.625 / 0.375), rel=1e-12)
    windows = Rappor(k=128, h=2, cohorts=8, f=0.5, p=0.5, q=0.75, seed=SEED)
    assert windows.epsilon_one == pytest.approx(1.0743, abs=5e-5)
    assert windows.epsilon_report == windows.epsilon_one
    one_time = Rappor(k=128, h=2, cohorts=8, f=0.5, p=0.5, q=0.75, seed=SEED, variant="one-time")
    assert one_time.epsilon_report == one_time.epsilon_infinity == pytest.approx(4 * math.log(3), rel=1e-12)
    no_prr = Rappor(k=16, h=2, cohorts=1, f=0.0, p=0.5, q=0.75, seed=SEED)
    assert no_prr.epsilon_infinity == math.inf
    assert no_prr.epsilon_one == pytest.approx(2 * math.log(3), rel=1e-12)  # 004 §5.1: ln 3 per bit


@pytest.mark.parametrize("variant", ["standard", "one-time"])
def test_exact_ldp_per_report(variant: str) -> None:
    """Exact max log-ratio of one report over 20 values ≤ ε_report, reached by a pair with disjoint Bloom bits."""
    mech = small(variant)
    worst, tight = exact_worst_case(mech, UNIVERSE, "report")
    assert tight, "the seed must give a pair of values with disjoint Bloom bits"
    assert worst <= mech.epsilon_report + 1e-12
    assert worst == pytest.approx(mech.epsilon_report, rel=1e-12)
    # The same check on the explicit distribution over all (cohort, 2**8 outputs).
    dists = [mech.output_distribution(v) for v in UNIVERSE]
    assert_tight_ldp(dists, mech.epsilon_report)


def test_exact_ldp_permanent_response() -> None:
    """Theorem 1: B' alone leaks at most ε∞ = 2h ln((1 - f/2)/(f/2)), exactly reached."""
    mech = small("standard")
    worst, tight = exact_worst_case(mech, UNIVERSE, "permanent")
    assert tight
    assert worst == pytest.approx(mech.epsilon_infinity, rel=1e-12)
    assert_tight_ldp([mech.output_distribution(v, stage="permanent") for v in UNIVERSE], mech.epsilon_infinity)
    assert mech.epsilon_one < mech.epsilon_infinity  # the IRR only adds noise


@pytest.mark.parametrize("variant", ["basic", "basic-one-time"])
def test_exact_ldp_basic(variant: str) -> None:
    """Basic variants: any two categories differ in two bits; the bound is exact and reached."""
    mech = basic(variant)
    worst, tight = exact_worst_case(mech, list(mech.categories), "report")
    assert tight
    assert worst == pytest.approx(mech.epsilon_report, rel=1e-12)
    assert_tight_ldp([mech.output_distribution(c) for c in mech.categories], mech.epsilon_report)


def test_output_distribution_matches_the_coins() -> None:
    """output_distribution equals the product of the implemented per-bit coins."""
    mech = small("standard", f=0.3, p=0.25, q=0.8)
    one, zero = coin_probabilities(mech, "report")
    value = UNIVERSE[3]
    dist = mech.output_distribution(value)
    assert sum(dist.values()) == 1
    for cohort in range(mech.cohorts):
        bloom = reference_bloom(mech, value, cohort)
        for out in (0b10110001, 0, 255):
            bits = [(out >> (7 - i)) & 1 for i in range(8)]
            want = Fraction(1, mech.cohorts)
            for i, s in enumerate(bits):
                p1 = one if i in bloom else zero
                want *= p1 if s else 1 - p1
            assert dist[(cohort, bytes([out]))] == want


def test_coins_round_toward_privacy() -> None:
    """The f/2 coin is rounded up, q down, p up: the implemented ratios never exceed the nominal ones."""
    mech = small("standard", f=0.1, p=0.1, q=0.7)
    c = mech.prr_coin.probability
    # Fraction(float) is the float's exact binary value, which is what the coins resolve.
    assert Fraction(0.1) / 2 <= c < Fraction(0.1) / 2 + Fraction(1, SCALE)
    assert mech.irr_one_coin.probability <= Fraction(0.7)
    assert mech.irr_zero_coin.probability >= Fraction(0.1)
    nominal = 2 * 2 * math.log((1 - 0.05) / 0.05)
    assert mech.epsilon_infinity <= nominal


# ----- signal, coins, memoization --------------------------------------------------------


@pytest.mark.parametrize("variant", ["standard", "one-time"])
def test_signal_step_uses_the_public_hash_family(variant: str, rng: SeededRandom) -> None:
    """With f = 0, p = 0, q = 1 a report is the Bloom filter: bit h_{c·h+i}(v) of HashFamily(seed, cohorts·h, k)."""
    mech = Rappor(k=64, h=3, cohorts=4, f=0.0, p=0.0, q=1.0, seed=SEED, variant=variant)
    values = [f"https://example-{i}.test/" for i in range(40)]
    for v in values:
        state = mech.setup(rng)
        record, _ = mech.privatize(v, state, rng)
        got = np.flatnonzero(np.unpackbits(np.frombuffer(record.bits, dtype=np.uint8)))
        assert frozenset(got.tolist()) == reference_bloom(mech, v, state.cohort)
    cohorts = np.arange(len(values)) % mech.cohorts
    batch = mech.privatize_many(values, cohorts, rng)
    for d, v in enumerate(values):
        got = np.flatnonzero(np.unpackbits(batch.bits[d]))
        assert frozenset(got.tolist()) == reference_bloom(mech, v, int(cohorts[d]))


def test_basic_maps_each_category_to_its_own_bit(rng: SeededRandom) -> None:
    """Basic variants (004 §2.1): category i sets bit i and nothing else."""
    cats = [f"c{i}" for i in range(11)]
    mech = basic("basic-one-time", categories=cats, f=0.0)
    for i, c in enumerate(cats):
        record, _ = mech.privatize(c, mech.setup(rng), rng)
        assert np.flatnonzero(np.unpackbits(np.frombuffer(record.bits, dtype=np.uint8))).tolist() == [i]
    assert mech.candidate_bits(cats)[:, 0, :].tolist() == np.eye(11, dtype=np.uint8).tolist()


def bit_rates(bits: npt.NDArray[np.uint8], k: int) -> npt.NDArray[np.int64]:
    """Per-bit count of ones among packed reports."""
    counts: npt.NDArray[np.int64] = np.unpackbits(bits, axis=1, count=k).sum(axis=0, dtype=np.int64)
    return counts


@pytest.mark.parametrize("variant", ["standard", "one-time"])
def test_fresh_reports_follow_lemma_1(variant: str, rng: SeededRandom) -> None:
    """privatize and privatize_many on fresh devices set a Bloom bit w.p. q* and any other w.p. p* (5 SE)."""
    mech = Rappor(k=32, h=2, cohorts=1, seed=SEED, variant=variant, f=0.5, p=0.25, q=0.875)
    one, zero = (float(x) for x in mech.coordinate_probabilities())
    value = "the number 68"
    bloom = np.zeros(32, dtype=bool)
    bloom[list(reference_bloom(mech, value, 0))] = True
    n = 4000
    single = np.stack(
        [np.frombuffer(mech.privatize(value, mech.setup(rng), rng)[0].bits, dtype=np.uint8) for _ in range(n)]
    )
    many = mech.privatize_many([value] * 50_000, np.zeros(50_000, dtype=np.int64), rng).bits
    for bits in (single, many):
        m = bits.shape[0]
        ones = bit_rates(bits, 32)
        expect = np.where(bloom, one, zero) * m
        sd = np.sqrt(m * np.where(bloom, one * (1 - one), zero * (1 - zero)))
        assert (np.abs(ones - expect) <= 5 * sd).all()


def test_irr_with_q_equal_one_reports_every_set_bit(rng: SeededRandom) -> None:
    """q = 1 (a coin of exactly 2**64/2**64) reports every set B' bit, in the single and batch paths."""
    mech = Rappor(k=16, h=2, cohorts=1, f=0.0, p=0.5, q=1.0, seed=SEED)
    bloom = reference_bloom(mech, "x", 0)
    for _ in range(200):
        record, _ = mech.privatize("x", mech.setup(rng), rng)
        got = set(np.flatnonzero(np.unpackbits(np.frombuffer(record.bits, dtype=np.uint8))).tolist())
        assert bloom <= got
    batch = mech.privatize_many(["x"] * 500, np.zeros(500, dtype=np.int64), rng)
    assert (np.unpackbits(batch.bits, axis=1)[:, sorted(bloom)] == 1).all()


def test_b_prime_is_memoized_per_value(rng: SeededRandom) -> None:
    """Same value → same B' for 1,000 rounds and across a msgpack save/restore; a new value gets a new entry."""
    # p = 0, q = 1 makes the IRR the identity, so every report shows B' itself.
    mech = Rappor(k=64, h=2, cohorts=4, f=0.75, p=0.0, q=1.0, seed=SEED)
    state = mech.setup(rng)
    first, state = mech.privatize("homepage.example", state, rng)
    assert len(state.memo) == 1
    for _ in range(1000):
        record, state = mech.privatize("homepage.example", state, rng)
        assert record == first
    assert len(state.memo) == 1
    restored = RapporState.from_plain(mech, msgpack.unpackb(msgpack.packb(state.to_plain())))
    assert restored == state
    for _ in range(10):
        record, restored = mech.privatize("homepage.example", restored, rng)
        assert record == first
    before = restored
    other, after = mech.privatize("another.example", restored, rng)
    assert len(after.memo) == 2
    assert len(before.memo) == 1  # the old state object is untouched
    assert set(before.memo.items()) <= set(after.memo.items())
    again, after = mech.privatize("another.example", after, rng)
    assert again == other


def test_one_time_variants_report_the_memoized_b_prime(rng: SeededRandom) -> None:
    """One-time variants skip the IRR: every report on a value is the same B'."""
    mech = Rappor(k=64, h=2, cohorts=4, seed=SEED, variant="one-time", **CHROME)
    state = mech.setup(rng)
    first, state = mech.privatize("v", state, rng)
    assert first.bits == next(iter(state.memo.values()))
    for _ in range(100):
        record, state = mech.privatize("v", state, rng)
        assert record == first


def test_memo_never_holds_the_value(rng: SeededRandom) -> None:
    """The saved state holds keyed hashes of values, not the values; the key is per device."""
    mech = Rappor(k=128, h=2, cohorts=32, seed=SEED, **CHROME)
    values = ["very-secret-homepage.example", "another-private-site.example", "x" * 40]
    state_a, state_b = mech.setup(rng), mech.setup(rng)
    for v in values:
        _, state_a = mech.privatize(v, state_a, rng)
        _, state_b = mech.privatize(v, state_b, rng)
    blob = msgpack.packb(state_a.to_plain())
    for v in values:
        assert v.encode("utf-8") not in blob
    assert state_a.memo_key != state_b.memo_key
    assert not set(state_a.memo) & set(state_b.memo)  # keyed: memo ids differ between devices


def test_cohorts_are_uniform(rng: SeededRandom) -> None:
    """setup draws the cohort uniformly (each cohort's count within 5 SE)."""
    mech = Rappor(k=16, h=2, cohorts=5, seed=SEED, **CHROME)
    n = 5000
    counts = np.bincount([mech.setup(rng).cohort for _ in range(n)], minlength=5)
    sd = math.sqrt(n * 0.2 * 0.8)
    assert (np.abs(counts - n / 5) <= 5 * sd).all()


def test_state_from_plain_is_strict(rng: SeededRandom) -> None:
    """Malformed saved state raises StateError, never redraws."""
    mech = Rappor(k=12, h=2, cohorts=4, seed=SEED, **CHROME)
    _, state = mech.privatize("v", mech.setup(rng), rng)
    good = state.to_plain()
    (memo_id, packed) = next(iter(good["memo"].items()))
    bad_cases: list[object] = [
        None,
        [],
        {**good, "cohort": 4},
        {**good, "cohort": -1},
        {**good, "cohort": True},
        {**good, "cohort": "0"},
        {**good, "key": b"short"},
        {**good, "memo": []},
        {**good, "memo": {b"short": packed}},
        {**good, "memo": {memo_id: packed + b"\0"}},
        {**good, "memo": {memo_id: bytes([packed[0], packed[1] | 0x01])}},
        {**good, "memo": {memo_id: "text"}},
        {k: v for k, v in good.items() if k != "key"},
    ]
    for bad in bad_cases:
        with pytest.raises(StateError):
            RapporState.from_plain(mech, bad)
    with pytest.raises(StateError):
        mech.privatize("v", "not a state", rng)  # type: ignore[arg-type]


# ----- estimation ------------------------------------------------------------------------


def test_basic_one_time_recovers_a_normal_distribution() -> None:
    """004 §5.1: n = 10^5 rounded normal(50, 10); every count within 5 SE, SE within 15% of the spread (150 runs)."""
    # 004 §5.1 uses ε = ln 3; with one-time (no IRR) coins this is f with 2 ln((1 - f/2)/(f/2)) = ln 3.
    f = 2 / (1 + math.sqrt(3))
    # Categories 15..85 (mean ± 3.5 sd); the 0.05% of values beyond are clipped into the end categories.
    low, high = 15, 85
    cats = tuple(str(i) for i in range(low, high + 1))
    k = len(cats)
    mech = Rappor(k=k, h=1, cohorts=1, f=f, p=0.5, q=0.75, seed=SEED, variant="basic-one-time", categories=cats)
    assert mech.epsilon_report == pytest.approx(math.log(3), abs=1e-12)
    rng = SeededRandom(51)
    n, reps = 100_000, 150
    data = np.clip(np.rint(50 + 10 * np.random.default_rng(5).standard_normal(n)), low, high).astype(np.int64) - low
    truth = np.bincount(data, minlength=k).astype(np.float64)
    values = [cats[i] for i in data]
    cohorts = np.zeros(n, dtype=np.int64)
    estimates = np.empty((reps, k))
    ses = np.empty((reps, k))
    for r in range(reps):
        agg = mech.new_aggregate()
        agg.add(mech.privatize_many(values, cohorts, rng))
        est = agg.estimate()
        assert (np.abs(est.values - truth) <= 5 * est.standard_errors).all()
        estimates[r], ses[r] = est.values, est.standard_errors
    # Unbiased: the mean of 150 runs is within 5 SE of the mean of each count.
    assert (np.abs(estimates.mean(axis=0) - truth) <= 5 * ses.mean(axis=0) / math.sqrt(reps)).all()
    # Honest SE, pooled over the counts (one count's spread over 150 runs is only good to ~6%).
    spread = math.sqrt(float(estimates.var(axis=0, ddof=1).mean()))
    reported = math.sqrt(float((ses**2).mean()))
    assert abs(reported / spread - 1) < 0.15


def test_standard_bit_estimates_are_unbiased_with_honest_se() -> None:
    """t_ij (004 §4) is within 5 SE of the true per-cohort Bloom bit counts; SE within 15% of the spread."""
    mech = Rappor(k=32, h=2, cohorts=4, seed=SEED, **CHROME)
    rng = SeededRandom(54)
    n, reps = 40_000, 150
    strings = [f"string-{i}" for i in range(40)]
    weights = np.exp(-np.arange(40) / 6)
    data_rng = np.random.default_rng(8)
    idx = data_rng.choice(40, size=n, p=weights / weights.sum())
    values = [strings[i] for i in idx]
    cohorts = data_rng.integers(0, 4, size=n)
    truth = np.zeros((4, 32))
    for s, string in enumerate(strings):
        for c in range(4):
            members = int(np.count_nonzero((idx == s) & (cohorts == c)))
            for bit in reference_bloom(mech, string, c):
                truth[c, bit] += members
    t = np.empty((reps, 4, 32))
    se = np.empty((reps, 4, 32))
    for r in range(reps):
        agg = mech.new_aggregate()
        agg.add(mech.privatize_many(values, cohorts, rng))
        est = agg.estimate_bits()
        assert est.n == n
        assert est.cohort_sizes.tolist() == np.bincount(cohorts, minlength=4).tolist()
        assert (np.abs(est.values - truth) <= 5 * est.standard_errors).all()
        t[r], se[r] = est.values, est.standard_errors
    assert (np.abs(t.mean(axis=0) - truth) <= 5 * se.mean(axis=0) / math.sqrt(reps)).all()
    spread = math.sqrt(float(t.var(axis=0, ddof=1).mean()))
    reported = math.sqrt(float((se**2).mean()))
    assert abs(reported / spread - 1) < 0.15
    flat = agg.estimate()
    assert flat.values.tolist() == est.values.ravel().tolist()


@pytest.mark.parametrize("variant", ["basic", "basic-one-time"])
def test_basic_direct_decoding_is_unbiased(variant: str) -> None:
    """Basic decoding Σ_j t_ij across cohorts, for both variants: within 5 SE over 40 runs and on their mean."""
    cats = ["red", "green", "blue", "cyan", "none"]
    mech = basic(variant, categories=cats, cohorts=3, f=0.25, p=0.2, q=0.9)
    rng = SeededRandom(3 if variant == "basic" else 4)
    n, reps = 30_000, 40
    data = np.repeat(np.arange(5), [12_000, 9_000, 6_000, 3_000, 0])
    values = [cats[i] for i in data]
    cohorts = np.arange(n) % 3
    truth = np.bincount(data, minlength=5)
    runs = []
    for _ in range(reps):
        agg = mech.new_aggregate()
        agg.add(mech.privatize_many(values, cohorts, rng))
        est = agg.estimate_categories()
        assert (np.abs(est.values - truth) <= 5 * est.standard_errors).all()
        runs.append(est.values)
    assert (np.abs(np.mean(runs, axis=0) - truth) <= 5 * est.standard_errors / math.sqrt(reps)).all()


def test_single_reports_aggregate_like_the_batch_path(rng: SeededRandom) -> None:
    """Reports from privatize, through the wire form, estimate the true Bloom bits within 5 SE."""
    mech = Rappor(k=16, h=2, cohorts=2, seed=SEED, f=0.25, p=0.25, q=0.75)
    records = []
    truth = np.zeros((2, 16))
    for d in range(4000):
        value = f"v{d % 3}"
        state = mech.setup(rng)
        record, _ = mech.privatize(value, state, rng)
        records.append(record)
        for bit in reference_bloom(mech, value, state.cohort):
            truth[state.cohort, bit] += 1
    wire = msgpack.unpackb(msgpack.packb(mech.encode_records(records)))
    agg = mech.new_aggregate()
    agg.add(mech.decode_records(wire))
    est = agg.estimate_bits()
    assert (np.abs(est.values - truth) <= 5 * est.standard_errors).all()


def test_aggregate_counts_bits_exactly(rng: SeededRandom) -> None:
    """add() gives the same c_ij and N_j as counting unpacked bits, for k not a multiple of 8."""
    mech = Rappor(k=13, h=2, cohorts=5, seed=SEED, **CHROME)
    batch = mech.privatize_many([f"s{i % 17}" for i in range(3000)], np.arange(3000) % 5, rng)
    agg = mech.new_aggregate()
    agg.add(batch)
    agg.add(RapporBatch(np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.uint8)))
    unpacked = np.unpackbits(batch.bits, axis=1, count=13).astype(np.int64)
    for c in range(5):
        assert agg.counts[c].tolist() == unpacked[batch.cohorts == c].sum(axis=0).tolist()
    assert agg.sizes.tolist() == np.bincount(batch.cohorts, minlength=5).tolist()
    assert agg.n == 3000


def test_candidate_bits_match_the_bloom_filters() -> None:
    """candidate_bits / candidate_positions give every candidate's Bloom bits in every cohort."""
    mech = Rappor(k=128, h=2, cohorts=8, seed=SEED, **CHROME)
    cands = [f"cand-{i}" for i in range(30)]
    bits = mech.candidate_bits(cands)
    pos = mech.candidate_positions(cands)
    assert bits.shape == (30, 8, 128)
    assert pos.shape == (30, 8, 2)
    for m, cand in enumerate(cands):
        for c in range(8):
            assert set(np.flatnonzero(bits[m, c]).tolist()) == reference_bloom(mech, cand, c)
            assert set(pos[m, c].tolist()) == reference_bloom(mech, cand, c)


def test_empty_and_degenerate_estimates() -> None:
    """An empty cohort estimates 0 ± 0; f = 1 carries no signal (NaN ± inf); Bloom variants refuse direct decoding."""
    mech = Rappor(k=8, h=2, cohorts=2, seed=SEED, **CHROME)
    est = mech.new_aggregate().estimate_bits()
    assert (est.values == 0).all()
    assert (est.standard_errors == 0).all()
    with pytest.raises(ParameterError, match="variant"):
        mech.new_aggregate().estimate_categories()
    flat = Rappor(k=8, h=2, cohorts=2, seed=SEED, f=1.0, p=0.5, q=0.75)
    assert flat.epsilon_one == 0
    assert flat.epsilon_infinity == 0
    est = flat.new_aggregate().estimate_bits()
    assert np.isnan(est.values).all()
    assert np.isinf(est.standard_errors).all()


# ----- parameters and inputs -------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "name"),
    [
        ({"k": 0}, "k"),
        ({"k": 2.0}, "k"),
        ({"h": 0}, "h"),
        ({"h": 9}, "h"),
        ({"cohorts": 0}, "cohorts"),
        ({"f": -0.1}, "f"),
        ({"f": 1.5}, "f"),
        ({"f": math.nan}, "f"),
        ({"p": -0.5}, "p"),
        ({"q": 1.01}, "q"),
        ({"p": 0.75, "q": 0.5}, "q"),
        ({"p": 0.5, "q": 0.5}, "q"),
        ({"p": 1e-30, "q": 2e-30}, "q"),
        ({"seed": b"short"}, "seed"),
        ({"seed": "a string seed!!!!!"}, "seed"),
        ({"variant": "bloom"}, "variant"),
        ({"categories": ("a", "b")}, "categories"),
    ],
)
def test_bad_parameters_name_the_parameter(over: dict[str, Any], name: str) -> None:
    """Each invalid parameter raises ParameterError naming it."""
    params: dict[str, Any] = {"k": 8, "h": 2, "cohorts": 2, "seed": SEED, **CHROME}
    params.update(over)
    with pytest.raises(ParameterError) as info:
        Rappor(**params)
    assert info.value.name == name


@pytest.mark.parametrize(
    ("over", "name"),
    [
        ({"categories": ()}, "categories"),
        ({"categories": ("a", "a", "b")}, "categories"),
        ({"categories": ("a", 1, "b")}, "categories"),
        ({"categories": "abc"}, "categories"),
        ({"k": 4}, "k"),
        ({"h": 2}, "h"),
    ],
)
def test_basic_parameter_mismatches_name_the_parameter(over: dict[str, Any], name: str) -> None:
    """Basic variants need distinct string categories, k = len(categories) and h = 1."""
    params: dict[str, Any] = {"k": 3, "h": 1, "cohorts": 1, "seed": SEED, "variant": "basic", **CHROME}
    params["categories"] = ("a", "b", "c")
    params.update(over)
    with pytest.raises(ParameterError) as info:
        Rappor(**params)
    assert info.value.name == name


def test_bad_values_are_refused(rng: SeededRandom) -> None:
    """Unknown categories and non-string values raise InputError in both paths."""
    mech = basic("basic")
    with pytest.raises(InputError):
        mech.privatize("zzz", mech.setup(rng), rng)
    with pytest.raises(InputError):
        mech.privatize_many(["a", "zzz"], [0, 0], rng)
    bloom = small()
    with pytest.raises(InputError):
        bloom.privatize(3, bloom.setup(rng), rng)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        bloom.privatize_many(["a", None], [0, 0], rng)  # type: ignore[list-item]
    with pytest.raises(InputError):
        bloom.privatize_many(["a"], [2], rng)
    with pytest.raises(InputError):
        bloom.privatize_many(["a", "b"], [0], rng)


# ----- wire form -------------------------------------------------------------------------


WIRE_MECH = Rappor(k=12, h=2, cohorts=3, seed=SEED, **CHROME)


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        ({"a": 1}, "bad-type", "records"),
        ([[0, b"\x00\x00"], 5], "bad-type", "records[1]"),
        ([[0, b"\x00\x00", 1]], "bad-length", "records[0]"),
        ([[0]], "bad-length", "records[0]"),
        ([["0", b"\x00\x00"]], "bad-type", "records[0].cohort"),
        ([[True, b"\x00\x00"]], "bad-type", "records[0].cohort"),
        ([[1.0, b"\x00\x00"]], "bad-type", "records[0].cohort"),
        ([[3, b"\x00\x00"]], "out-of-range", "records[0].cohort"),
        ([[-1, b"\x00\x00"]], "out-of-range", "records[0].cohort"),
        ([[2**70, b"\x00\x00"]], "out-of-range", "records[0].cohort"),
        ([[0, "\x00\x00"]], "bad-type", "records[0].bits"),
        ([[0, [0, 0]]], "bad-type", "records[0].bits"),
        ([[0, b"\x00"]], "bad-length", "records[0].bits"),
        ([[0, b"\x00\x00\x00"]], "bad-length", "records[0].bits"),
        ([[0, b"\x00\x01"]], "bad-padding", "records[0].bits"),
        ([[0, b"\xff\xf0"], [1, b"\xff\x08"]], "bad-padding", "records[1].bits"),
    ],
)
def test_decode_is_strict(raw: object, reason: str, field: str) -> None:
    """Malformed wire records raise MalformedReportError with the reason and the field."""
    with pytest.raises(MalformedReportError) as info:
        WIRE_MECH.decode_records(raw)
    assert (info.value.reason, info.value.field) == (reason, field)


records_strategy = st.lists(
    st.builds(
        RapporRecord,
        st.integers(0, 2),
        st.binary(min_size=2, max_size=2).map(lambda b: bytes([b[0], b[1] & 0xF0])),
    ),
    max_size=30,
)


@given(records_strategy)
def test_wire_round_trip(records: list[RapporRecord]) -> None:
    """encode → msgpack → decode gives the records' batch back."""
    wire = msgpack.unpackb(msgpack.packb(WIRE_MECH.encode_records(records)))
    got = WIRE_MECH.decode_records(wire)
    want = WIRE_MECH.batch(records)
    assert got.cohorts.tolist() == want.cohorts.tolist()
    assert got.bits.tolist() == want.bits.tolist()


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@given(msgpack_values)
def test_decode_is_total(raw: object) -> None:
    """Any msgpack-shaped object either decodes or raises MalformedReportError."""
    try:
        batch = WIRE_MECH.decode_records(raw)
    except MalformedReportError:
        return
    assert batch.bits.shape == (len(batch), 2)


# ----- aggregates: merge and persistence -------------------------------------------------


AGG_MECH = Rappor(k=10, h=2, cohorts=3, seed=SEED, **CHROME)


def aggregate_of(records: list[RapporRecord]) -> RapporAggregate:
    """An aggregate holding ``records``."""
    agg = AGG_MECH.new_aggregate()
    agg.add(AGG_MECH.batch(records))
    return agg


agg_records = st.lists(
    st.builds(
        RapporRecord,
        st.integers(0, 2),
        st.binary(min_size=2, max_size=2).map(lambda b: bytes([b[0], b[1] & 0xC0])),
    ),
    max_size=25,
)


@given(st.lists(agg_records, min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[RapporRecord]]) -> None:
    """Aggregates are sums: any merge order gives the aggregate of all records."""
    a, b, c = (aggregate_of(p) for p in parts)
    left = a.merge(b).merge(c).to_plain()
    right = a.merge(b.merge(c)).to_plain()
    assert left == right == c.merge(a).merge(b).to_plain()
    assert left == aggregate_of([r for p in parts for r in p]).to_plain()
    restored = RapporAggregate.from_plain(AGG_MECH, msgpack.unpackb(msgpack.packb(left)))
    assert restored.to_plain() == left
    assert restored.n == sum(len(p) for p in parts)


def test_merge_refuses_other_parameters() -> None:
    """Aggregates of different parameters do not merge."""
    other = Rappor(k=10, h=2, cohorts=3, seed=SEED, f=0.5, p=0.5, q=0.75)
    with pytest.raises(ValueError, match="different"):
        AGG_MECH.new_aggregate().merge(other.new_aggregate())


def test_aggregate_from_plain_is_strict() -> None:
    """Malformed or impossible saved aggregates raise StateError."""
    good = aggregate_of([RapporRecord(0, b"\xff\xc0"), RapporRecord(2, b"\x01\x00")]).to_plain()
    more = aggregate_of([RapporRecord(0, b"\xff\xc0")] * 3).to_plain()
    bad_cases: list[object] = [
        None,
        {},
        {"counts": good["counts"]},
        {**good, "sizes": good["counts"]},
        {**good, "counts": {**good["counts"], "shape": [3, 11]}},
        {**good, "counts": {**good["counts"], "dtype": "<f8"}},
        {**good, "counts": more["counts"]},  # counts above the number of reports
    ]
    for bad in bad_cases:
        with pytest.raises(StateError):
            RapporAggregate.from_plain(AGG_MECH, bad)


@settings(max_examples=50)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=8), st.integers(0, 2**32))
def test_state_round_trip(values: list[str], seed: int) -> None:
    """Device state survives to_plain → msgpack → from_plain and keeps answering from its memo."""
    mech = Rappor(k=20, h=2, cohorts=3, seed=SEED, variant="one-time", **CHROME)
    rng = SeededRandom(seed)
    state = mech.setup(rng)
    first: dict[str, RapporRecord] = {}
    for v in values:
        record, state = mech.privatize(v, state, rng)
        first.setdefault(v, record)
    restored = RapporState.from_plain(mech, msgpack.unpackb(msgpack.packb(state.to_plain())))
    assert restored == state
    assert len(restored.memo) == len(set(values))
    for v in values:
        record, restored = mech.privatize(v, restored, rng)
        assert record == first[v]
