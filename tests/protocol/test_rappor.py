"""RAPPOR's device half (004 §2): exact ε∞ and ε1, memoized B', the coins the vectorised path draws.

The server half (estimates, wire decoding, aggregates) is tested in ``test_rappor_server.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from itertools import permutations
from types import MappingProxyType
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InputError, ParameterError, StateError
from protocol.hashing import HashFamily
from protocol.randomness import SCALE, SeededRandom, uniform_ints
from protocol.rappor import Rappor, RapporRecord, RapporState
from protocol.server.rappor import RapporServer
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
    batch = RapporServer(mech).privatize_many(values, cohorts, rng)
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
    assert RapporServer(mech).candidate_bits(cats)[:, 0, :].tolist() == np.eye(11, dtype=np.uint8).tolist()


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
    many = RapporServer(mech).privatize_many([value] * 50_000, np.zeros(50_000, dtype=np.int64), rng).bits
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
    batch = RapporServer(mech).privatize_many(["x"] * 500, np.zeros(500, dtype=np.int64), rng)
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
    good: Any = state.to_plain()
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


# ----- the pure device path and the vectorised server path ------------------------------


@pytest.mark.parametrize(
    ("variant", "over"),
    [
        ("standard", {}),
        ("standard", {"f": 0.0}),
        ("standard", {"p": 0.0, "q": 1.0}),
        ("standard", {"k": 13, "h": 3, "cohorts": 3}),
        ("one-time", {}),
        ("basic", {}),
        ("basic-one-time", {"f": 0.0}),
    ],
)
def test_privatize_draws_the_coins_of_privatize_many(variant: str, over: dict[str, Any]) -> None:
    """One fresh device: privatize and RapporServer.privatize_many consume the same words, report the same bits."""
    mech = basic(variant, **over) if variant.startswith("basic") else small(variant, **over)
    server = RapporServer(mech)
    values = list(mech.categories) if mech.basic else UNIVERSE[:8]
    for seed in range(12):
        for cohort in range(mech.cohorts):
            value = values[(seed + cohort) % len(values)]
            state = RapporState(cohort=cohort, memo_key=bytes(32), memo=MappingProxyType({}))
            pure, vectorised = SeededRandom(seed), SeededRandom(seed)
            record, _ = mech.privatize(value, state, pure)
            batch = server.privatize_many([value], [cohort], vectorised)
            assert record == RapporRecord(int(batch.cohorts[0]), batch.bits[0].tobytes())
            assert pure.draw(1) == vectorised.draw(1)


@pytest.mark.parametrize("cohorts", [1, 3, 32, 256, 257, 1 << 16])
def test_setup_draws_the_coins_of_the_vectorised_path(cohorts: int) -> None:
    """setup's pure draws are the vectorised ones: the cohort is uniform_ints' and the key four words, little-endian."""
    mech = Rappor(k=8, h=2, cohorts=cohorts, seed=SEED, **CHROME)
    for seed in range(10):
        state = mech.setup(SeededRandom(seed))
        rng = SeededRandom(seed)
        assert state.cohort == int(uniform_ints(rng, cohorts, 1)[0])
        assert state.memo_key == rng.words(4).astype("<u8").tobytes()


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
        RapporServer(mech).privatize_many(["a", "zzz"], [0, 0], rng)
    bloom = small()
    with pytest.raises(InputError):
        bloom.privatize(3, bloom.setup(rng), rng)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        RapporServer(bloom).privatize_many(["a", None], [0, 0], rng)  # type: ignore[list-item]
    with pytest.raises(InputError):
        RapporServer(bloom).privatize_many(["a"], [2], rng)
    with pytest.raises(InputError):
        RapporServer(bloom).privatize_many(["a", "b"], [0], rng)


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
