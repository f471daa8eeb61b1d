"""1BitMean + α-point rounding + memoization + output perturbation (000 §2.1, §3.1, §4)."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.one_bit_mean import OneBitMean, OneBitMeanState, epsilon_prime, theorem5_epsilon
from protocol.randomness import SeededRandom
from protocol.server.one_bit_mean import OneBitMeanAggregate, OneBitMeanBatch, OneBitMeanServer, OneBitMeanStates
from tests.protocol.ldp import assert_tight_ldp

SMALL_M = 240
DAY = 86_400


def fresh_device_distribution(mech: OneBitMean, x: int) -> dict[int, Fraction]:
    """``Pr[output | x]`` of a fresh device, by enumerating α and using the implemented coins."""
    hits = Counter(mech.rounded_index(x, alpha) for alpha in range(mech.segment))
    p = sum((count * mech.memo_probability(ell) for ell, count in hits.items()), Fraction(0)) / mech.segment
    g = mech.flip_coin.probability
    one = g + (1 - 2 * g) * p
    return {1: one, 0: 1 - one}


def eq1(epsilon: float, x: int, m: int) -> Decimal:
    """000 eq. (1) in 60-digit decimal arithmetic."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = Decimal(epsilon).exp()
        return 1 / (e + 1) + Decimal(x) / Decimal(m) * (e - 1) / (e + 1)


# ------------------------------------------------------------------------ 1. exact LDP


@pytest.mark.parametrize("epsilon", [0.25, 1.0, math.log(3), 5.0])
@pytest.mark.parametrize("s", [SMALL_M, SMALL_M // 2, SMALL_M // 20, 1])
def test_exact_ldp_without_perturbation_is_tight_at_epsilon(epsilon: float, s: int) -> None:
    """With γ = 0 a fresh device's report is ε-LDP over every x in [0, m], and exactly ε."""
    mech = OneBitMean(epsilon=epsilon, m=SMALL_M, s=s)
    dists = [fresh_device_distribution(mech, x) for x in range(SMALL_M + 1)]
    assert dists == [mech.output_distribution(x) for x in range(SMALL_M + 1)]
    assert_tight_ldp(dists, epsilon)
    assert mech.epsilon_report <= epsilon + 1e-12
    assert math.isclose(mech.epsilon_report, epsilon, rel_tol=1e-12)


@pytest.mark.parametrize("gamma", [0.01, 1 / 7, 0.2, 1 / 3, 0.45])
@pytest.mark.parametrize("s", [SMALL_M, SMALL_M // 20])
def test_exact_ldp_with_perturbation_is_tight_at_epsilon_prime(gamma: float, s: int) -> None:
    """The exact ε of 1BitMean with γ equals ε′ of 000 §4 (tight), and epsilon_report says so."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=s, gamma=gamma)
    dists = [fresh_device_distribution(mech, x) for x in range(SMALL_M + 1)]
    assert dists == [mech.output_distribution(x) for x in range(SMALL_M + 1)]
    assert_tight_ldp(dists, epsilon_prime(1.0, gamma))
    assert math.isclose(mech.epsilon_report, epsilon_prime(1.0, gamma), rel_tol=1e-12)
    assert mech.epsilon_report < mech.epsilon


# --------------------------------------------------------- 2. α-point rounding, Theorem 3


def rounded_indices_via_privatize(mech: OneBitMean, xs: npt.NDArray[np.int64], alphas: npt.NDArray[np.int64]) -> Any:
    """The point each (x, α) rounds to, read off privatize_many with threshold memo tables."""
    n, points = xs.size, mech.points
    index = np.zeros(n, dtype=np.int64)
    for k in range(1, points):
        memo = np.broadcast_to(np.arange(points) >= k, (n, points)).copy()
        states = OneBitMeanStates(alphas=alphas, memo=memo, m=mech.m, s=mech.segment, epsilon=mech.epsilon)
        index += OneBitMeanServer(mech).privatize_many(xs, states, SeededRandom(0)).bits
    return index


@pytest.mark.parametrize("s", [SMALL_M, SMALL_M // 2, SMALL_M // 20])
def test_alpha_point_rounding_reproduces_eq1_exactly(s: int) -> None:
    """000 Thm 3: over all α, Pr[send 1 | x] is the interpolation of the grid coins, within 2^-63 of eq. (1)."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=s)
    xs = np.repeat(np.arange(SMALL_M + 1, dtype=np.int64), s)
    alphas = np.tile(np.arange(s, dtype=np.int64), SMALL_M + 1)
    index = rounded_indices_via_privatize(mech, xs, alphas).reshape(SMALL_M + 1, s)
    grid = [mech.memo_probability(ell) for ell in range(mech.points)]
    for ell, p in enumerate(grid):
        assert abs(Decimal(p.numerator) / Decimal(p.denominator) - eq1(1.0, ell * s, SMALL_M)) < Decimal(2) ** -64
    for x in range(SMALL_M + 1):
        hits = Counter(index[x].tolist())
        prob = sum((count * grid[ell] for ell, count in hits.items()), Fraction(0)) / s
        ell, d = divmod(x, s)
        interpolated = grid[ell] if d == 0 else ((s - d) * grid[ell] + d * grid[ell + 1]) / s
        assert prob == interpolated == mech.output_distribution(x)[1]
        assert abs(Decimal(prob.numerator) / Decimal(prob.denominator) - eq1(1.0, x, SMALL_M)) < Decimal(2) ** -63


def test_rounding_rule_matches_the_paper_and_single_path() -> None:
    """000 §3.1 step 4: x in [L, R) goes to L iff x + α < R; x = m goes to m; privatize agrees."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    rng = SeededRandom(5)
    for x in range(SMALL_M + 1):
        for alpha in range(12):
            low = (x // 12) * 12
            expected = low if x + alpha < low + 12 else low + 12
            assert mech.rounded_index(x, alpha) * 12 == (SMALL_M if x == SMALL_M else expected)
    server = OneBitMeanServer(mech)
    states = server.setup_many(50, rng)
    xs = np.arange(50, dtype=np.int64) * 4
    many = server.privatize_many(xs, states, rng).bits
    singles = [mech.privatize(int(x), states.state(i), rng)[0].bit for i, x in enumerate(xs)]
    assert many.tolist() == singles


@pytest.mark.parametrize("gamma", [0.0, 0.2])
@pytest.mark.parametrize("s", [SMALL_M, 12, 1])
def test_device_half_draws_what_the_vectorised_paths_draw(s: int, gamma: float) -> None:
    """The device's pure setup is setup_many's state for one device from the same seed, and its
    privatize, value after value, gives privatize_many's records from the same coins."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=s, gamma=gamma)
    server = OneBitMeanServer(mech)
    for seed in range(20):
        assert mech.setup(SeededRandom(seed)) == server.setup_many(1, SeededRandom(seed)).state(0)
    states = server.setup_many(300, SeededRandom(30))
    xs = np.arange(300, dtype=np.int64) * 37 % (SMALL_M + 1)
    rng = SeededRandom(31)
    records = [mech.privatize(int(x), states.state(i), rng)[0] for i, x in enumerate(xs)]
    many = server.privatize_many(xs, states, SeededRandom(31))
    assert server.batch(records).bits.tolist() == many.bits.tolist()
    assert mech.encode_records(records) == many.bits.tolist()


def test_setup_draws_alpha_and_memo_with_the_implemented_probabilities() -> None:
    """α is uniform on {0..s-1} and each memo bit has its exact coin probability (5 SE, n = 2·10^5)."""
    mech = OneBitMean(epsilon=1.0, m=DAY, s=DAY // 20)
    n = 200_000
    states = OneBitMeanServer(mech).setup_many(n, SeededRandom(11))
    assert states.alphas.min() >= 0
    assert states.alphas.max() < mech.segment
    # α in 20 equal bins of width s/20.
    counts = np.bincount(states.alphas * 20 // mech.segment, minlength=20)
    assert np.all(np.abs(counts - n / 20) <= 5 * math.sqrt(n / 20 * (1 - 1 / 20)))
    for ell in range(mech.points):
        p = float(mech.memo_probability(ell))
        assert abs(states.memo[:, ell].sum() - n * p) <= 5 * math.sqrt(n * p * (1 - p))


# -------------------------------------------------------------------------- 3. memoization


def test_same_value_same_answer_across_rounds_and_restore() -> None:
    """γ = 0: a device answers a value identically for 1,000 rounds and after a msgpack round trip."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    rng = SeededRandom(21)
    for _ in range(10):
        state = mech.setup(rng)
        restored = OneBitMeanState.from_plain(mech, msgpack.unpackb(msgpack.packb(state.to_plain())))
        assert restored == state
        answers = [mech.privatize(x, state, rng)[0].bit for x in range(SMALL_M + 1)]
        assert answers == [mech.privatize(x, restored, rng)[0].bit for x in range(SMALL_M + 1)]
        for x in (0, 7, 100, SMALL_M):
            assert {mech.privatize(x, state, rng)[0].bit for _ in range(1000)} == {answers[x]}


def test_values_rounding_to_one_point_share_its_bit() -> None:
    """Every value that rounds to the same point answers with that point's memoized bit."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=24)
    rng = SeededRandom(22)
    for _ in range(20):
        state = mech.setup(rng)
        by_point: dict[int, set[int]] = {}
        for x in range(SMALL_M + 1):
            ell = mech.rounded_index(x, state.alpha)
            bit = mech.privatize(x, state, rng)[0].bit
            assert bit == state.bit(ell)
            by_point.setdefault(ell, set()).add(bit)
        assert all(len(bits) == 1 for bits in by_point.values())


def test_perturbation_flips_fresh_coins_and_never_touches_the_memo() -> None:
    """γ > 0: reports flip with probability γ (5 SE) while the memoized state stays identical."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12, gamma=0.2)
    rng = SeededRandom(23)
    state = mech.setup(rng)
    before = state.to_plain()
    rounds = 4000
    flips = 0
    for _ in range(rounds):
        record, after = mech.privatize(100, state, rng)
        assert after is state
        flips += record.bit != state.bit(mech.rounded_index(100, state.alpha))
    assert state.to_plain() == before
    assert abs(flips - rounds * 0.2) <= 5 * math.sqrt(rounds * 0.2 * 0.8)


def test_states_columns_round_trip() -> None:
    """Columnar states split into single states and stack back unchanged."""
    mech = OneBitMean(epsilon=2.0, m=SMALL_M, s=12)
    states = OneBitMeanServer(mech).setup_many(30, SeededRandom(24))
    singles = [states.state(i) for i in range(30)]
    again = OneBitMeanStates.from_states(mech, singles)
    assert np.array_equal(again.alphas, states.alphas)
    assert np.array_equal(again.memo, states.memo)
    assert len(OneBitMeanStates.from_states(mech, [])) == 0


# ------------------------------------------------- 4. unbiasedness and honest standard error


def paper_datasets(n: int) -> dict[str, npt.NDArray[np.int64]]:
    """000 §5's synthetic data: constant 12 h, uniform(0, 24 h), normal(12 h, 2 h) truncated to [0, 24 h]."""
    gen = np.random.Generator(np.random.PCG64(2017))
    normal = gen.normal(12 * 3600, 2 * 3600, size=2 * n)
    normal = normal[(normal >= 0) & (normal <= DAY)][:n]
    return {
        "constant": np.full(n, 12 * 3600, dtype=np.int64),
        "uniform": gen.integers(0, DAY, size=n, endpoint=True),
        "normal": np.rint(normal).astype(np.int64),
    }


@pytest.mark.slow
@pytest.mark.parametrize("s", [DAY, DAY // 20])
def test_unbiased_with_honest_standard_error(s: int) -> None:
    """Seeded Monte Carlo, n = 10^5 devices, 300 reps: within 5 SE, mean SE within 15% of the spread.

    Each repetition draws every device's α and memo afresh (setup_many); the three data sets
    and γ ∈ {0, 0.2} report from the same devices, which leaves each configuration's
    repetitions independent.
    """
    n, reps = 100_000, 300
    data = paper_datasets(n)
    mechs = [OneBitMean(epsilon=1.0, m=DAY, s=s, gamma=g) for g in (0.0, 0.2)]
    rng = SeededRandom(1000 + s)
    results: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for _ in range(reps):
        states = OneBitMeanServer(mechs[0]).setup_many(n, rng)
        for mech in mechs:
            server = OneBitMeanServer(mech)
            for name, values in data.items():
                agg = server.new_aggregate()
                agg.add(server.privatize_many(values, states, rng))
                est = agg.estimate()
                results.setdefault((name, mech.gamma), []).append((est.value, est.standard_error))
    for (name, gamma), pairs in results.items():
        truth = float(data[name].mean())
        est_values = np.array([v for v, _ in pairs])
        ses = np.array([se for _, se in pairs])
        assert np.all(np.abs(est_values - truth) <= 5 * ses), (name, gamma)
        spread = float(np.std(est_values, ddof=1))
        assert abs(float(ses.mean()) / spread - 1) < 0.15, (name, gamma, float(ses.mean()), spread)


def test_standard_error_is_the_jensen_bound() -> None:
    """The plug-in SE bounds the exact SE from above, by under 4% for uniform data at ε = 1."""
    mech = OneBitMean(epsilon=1.0, m=DAY, s=DAY // 20)
    values = paper_datasets(100_000)["uniform"]
    a, c = (float(t) for t in mech.affine_coefficients)
    q = a + c * values / DAY
    exact = DAY / c * math.sqrt(float(np.sum(q * (1 - q)))) / values.size
    agg = OneBitMeanAggregate(mech, ones=round(float(q.sum())), n=values.size)
    reported = agg.estimate().standard_error
    assert exact <= reported <= 1.04 * exact


def test_estimator_is_eq2_for_exact_coins_and_inverts_perturbation() -> None:
    """At λ̂ = E[λ̂] the estimate is the true mean exactly; with γ = 0 the formula is 000 eq. (2)."""
    for gamma in (0.0, 0.2):
        mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12, gamma=gamma)
        values = list(range(SMALL_M + 1)) * 3
        total = sum((mech.output_distribution(x)[1] for x in values), Fraction(0))
        a, c = mech.affine_coefficients
        value = SMALL_M * (total / len(values) - a) / c
        assert value == Fraction(sum(values), len(values))
    mech = OneBitMean(epsilon=1.0, m=SMALL_M)
    agg = OneBitMeanAggregate(mech, ones=600, n=1000)
    e = math.e
    assert math.isclose(agg.estimate().value, SMALL_M * (0.6 * (e + 1) - 1) / (e - 1), rel_tol=1e-12)
    empty = OneBitMeanServer(mech).new_aggregate().estimate()
    assert math.isnan(empty.value)
    assert empty.n == 0


# ------------------------------------------------------- 5. errors, wire, aggregates, state


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0, "m": 10}, "epsilon"),
        ({"epsilon": -1.0, "m": 10}, "epsilon"),
        ({"epsilon": math.nan, "m": 10}, "epsilon"),
        ({"epsilon": 1.0, "m": 0}, "m"),
        ({"epsilon": 1.0, "m": -5}, "m"),
        ({"epsilon": 1.0, "m": 2.5}, "m"),
        ({"epsilon": 1.0, "m": True}, "m"),
        ({"epsilon": 1.0, "m": 10, "s": 3}, "s"),
        ({"epsilon": 1.0, "m": 10, "s": 0}, "s"),
        ({"epsilon": 1.0, "m": 10, "s": 20}, "s"),
        ({"epsilon": 1.0, "m": 10, "s": -5}, "s"),
        ({"epsilon": 1.0, "m": 10, "s": 5.0}, "s"),
        ({"epsilon": 1.0, "m": 1 << 30, "s": 1}, "s"),
        ({"epsilon": 1.0, "m": 10, "gamma": 0.5}, "gamma"),
        ({"epsilon": 1.0, "m": 10, "gamma": -0.01}, "gamma"),
        ({"epsilon": 1.0, "m": 10, "gamma": 0.7}, "gamma"),
        ({"epsilon": 1.0, "m": 10, "gamma": math.nan}, "gamma"),
        ({"epsilon": 1.0, "m": 10, "gamma": "0.1"}, "gamma"),
    ],
)
def test_bad_parameters_name_the_parameter(kwargs: dict[str, Any], name: str) -> None:
    """Each invalid parameter is refused with a ParameterError that names it."""
    with pytest.raises(ParameterError, match=name) as info:
        OneBitMean(**kwargs)
    assert info.value.name == name


def test_default_segment_is_m_and_parameters_normalise() -> None:
    """s defaults to m (two points), and equal settings give equal mechanisms."""
    mech = OneBitMean(epsilon=1, m=21_600)
    assert mech.s == 21_600
    assert mech.points == 2
    assert mech == OneBitMean(epsilon=1.0, m=21_600, s=21_600, gamma=0)


@pytest.mark.parametrize("bad", [-1, SMALL_M + 1, 1.5, 3.0, True, False, np.bool_(True), "3", None, [3]])
def test_bad_values_are_refused(bad: object, rng: SeededRandom) -> None:
    """Only integers in [0, m] can be privatized."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    state = mech.setup(rng)
    with pytest.raises(InputError):
        mech.privatize(bad, state, rng)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "values", [np.array([1.0, 2.0]), np.array([True, False]), np.array([-1, 3]), np.array([0, SMALL_M + 1]), ["a", "b"]]
)
def test_bad_batches_are_refused(values: Any, rng: SeededRandom) -> None:
    """privatize_many refuses non-integer or out-of-range arrays."""
    server = OneBitMeanServer(OneBitMean(epsilon=1.0, m=SMALL_M, s=12))
    with pytest.raises(InputError):
        server.privatize_many(values, server.setup_many(2, rng), rng)


def test_numpy_integers_are_values(rng: SeededRandom) -> None:
    """numpy integer scalars are accepted like ints; uint arrays like int arrays."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    state = mech.setup(rng)
    assert mech.privatize(np.int64(5), state, rng)[0] == mech.privatize(5, state, rng)[0]
    server = OneBitMeanServer(mech)
    states = server.setup_many(3, rng)
    bits = server.privatize_many(np.array([0, 5, SMALL_M], dtype=np.uint16), states, rng).bits
    assert bits.tolist() == server.privatize_many(np.array([0, 5, SMALL_M]), states, rng).bits.tolist()


def test_states_of_other_parameters_are_refused(rng: SeededRandom) -> None:
    """A state drawn for other m, s or ε cannot be used or restored: memo bits are never reinterpreted."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    server = OneBitMeanServer(mech)
    for other in (OneBitMean(epsilon=1.0, m=SMALL_M, s=24), OneBitMean(epsilon=0.5, m=SMALL_M, s=12)):
        state = other.setup(rng)
        with pytest.raises(StateError):
            mech.privatize(3, state, rng)
        with pytest.raises(StateError):
            OneBitMeanState.from_plain(mech, state.to_plain())
        with pytest.raises(StateError):
            server.privatize_many(np.array([1]), OneBitMeanServer(other).setup_many(1, rng), rng)
    with pytest.raises(StateError):
        server.privatize_many(np.array([1, 2]), server.setup_many(3, rng), rng)
    # γ does not change the memo: a state serves every γ.
    OneBitMean(epsilon=1.0, m=SMALL_M, s=12, gamma=0.2).privatize(3, mech.setup(rng), rng)


def _good_state_plain() -> dict[str, Any]:
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    return mech.setup(SeededRandom(3)).to_plain()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("alpha"),
        lambda d: d.pop("memo"),
        lambda d: d.update(alpha=12),
        lambda d: d.update(alpha=-1),
        lambda d: d.update(alpha=True),
        lambda d: d.update(alpha=1.0),
        lambda d: d.update(memo=b"\x00\x00"),
        lambda d: d.update(memo=b"\x00\x00\x00\x00"),
        lambda d: d.update(memo=b"\x00\x00\xe0"),  # padding bits beyond point 20
        lambda d: d.update(memo=[0] * 21),
        lambda d: d.update(m=480),
        lambda d: d.update(s=24),
        lambda d: d.update(epsilon=2.0),
        lambda d: d.update(epsilon=1),
        lambda d: d.update(value=5),
    ],
)
def test_malformed_state_is_refused(mutate: Any) -> None:
    """Restoring a malformed or mismatched state raises StateError (never a fresh draw)."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    data = _good_state_plain()
    mutate(data)
    with pytest.raises(StateError):
        OneBitMeanState.from_plain(mech, data)


@pytest.mark.parametrize("data", [None, [], "x", 5, {"ones": 3, "n": 2}, {"ones": -1, "n": 2}, {"ones": True, "n": 2}])
def test_malformed_aggregate_is_refused(data: object) -> None:
    """Restoring a malformed aggregate raises StateError."""
    with pytest.raises(StateError):
        OneBitMeanAggregate.from_plain(OneBitMean(epsilon=1.0, m=10), data)


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        (None, "bad-type", "records"),
        ({"bits": [1]}, "bad-type", "records"),
        (b"\x01", "bad-type", "records"),
        ("01", "bad-type", "records"),
        ([0, 1, "1"], "bad-type", "records[2]"),
        ([0, True], "bad-type", "records[1]"),
        ([1.0], "bad-type", "records[0]"),
        ([None], "bad-type", "records[0]"),
        ([[1]], "bad-type", "records[0]"),
        ([0, 2], "out-of-range", "records[1]"),
        ([-1], "out-of-range", "records[0]"),
        ([1 << 70], "out-of-range", "records[0]"),
    ],
)
def test_wire_decode_is_strict(raw: object, reason: str, field: str) -> None:
    """Malformed record lists raise MalformedReportError with the reason and the field."""
    with pytest.raises(MalformedReportError) as info:
        OneBitMeanServer(OneBitMean(epsilon=1.0, m=10)).decode_records(raw)
    assert (info.value.reason, info.value.field) == (reason, field)


def test_wire_round_trip(rng: SeededRandom) -> None:
    """encode_records → msgpack → decode_records gives the batch of the records."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12, gamma=0.2)
    state = mech.setup(rng)
    records = [mech.privatize(x, state, rng)[0] for x in range(0, SMALL_M + 1, 7)]
    server = OneBitMeanServer(mech)
    decoded = server.decode_records(msgpack.unpackb(msgpack.packb(mech.encode_records(records))))
    assert decoded.bits.tolist() == server.batch(records).bits.tolist()


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@given(_plain)
def test_decode_is_total(raw: object) -> None:
    """Any msgpack-shaped object either decodes to bits or raises MalformedReportError."""
    try:
        batch = OneBitMeanServer(OneBitMean(epsilon=1.0, m=10)).decode_records(raw)
    except MalformedReportError:
        return
    assert set(batch.bits.tolist()) <= {0, 1}


@given(st.lists(st.lists(st.integers(0, 1), max_size=50), min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[int]]) -> None:
    """Aggregates are exact sums: any merge order gives the same aggregate, and it round-trips."""
    mech = OneBitMean(epsilon=1.0, m=DAY, s=DAY // 20, gamma=0.2)
    aggs = []
    for bits in parts:
        agg = OneBitMeanServer(mech).new_aggregate()
        agg.add(OneBitMeanBatch(np.array(bits, dtype=np.uint8)))
        aggs.append(agg)
    a, b, c = aggs
    left = a.merge(b).merge(c).to_plain()
    assert left == a.merge(b.merge(c)).to_plain() == c.merge(a).merge(b).to_plain()
    restored = OneBitMeanAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(left)))
    assert restored.to_plain() == left
    assert restored.n == sum(len(p) for p in parts)


def test_merge_refuses_other_mechanisms() -> None:
    """Aggregates of different parameters do not merge."""
    a = OneBitMeanServer(OneBitMean(epsilon=1.0, m=10)).new_aggregate()
    b = OneBitMeanServer(OneBitMean(epsilon=1.0, m=10, gamma=0.1)).new_aggregate()
    with pytest.raises(ValueError, match="different"):
        a.merge(b)


@settings(max_examples=50)
@given(st.integers(0, 11), st.lists(st.booleans(), min_size=21, max_size=21))
def test_state_round_trip(alpha: int, bits: list[bool]) -> None:
    """Any valid state survives to_plain → msgpack → from_plain unchanged."""
    mech = OneBitMean(epsilon=1.0, m=SMALL_M, s=12)
    memo = np.packbits(np.array(bits, dtype=np.bool_), bitorder="little").tobytes()
    state = OneBitMeanState(alpha=alpha, memo=memo, m=SMALL_M, s=12, epsilon=1.0)
    restored = OneBitMeanState.from_plain(mech, msgpack.unpackb(msgpack.packb(state.to_plain())))
    assert restored == state
    assert [restored.bit(i) for i in range(21)] == [int(b) for b in bits]


# ----------------------------------------------------------------- 6. privacy accounting


def test_epsilon_prime_and_theorem5_values() -> None:
    """ε′(1, 0.2) = 0.56945 (≈ 0.57) by 000 §4's formula; Thm 5 maps 0.686 to the deployment's 1.672."""
    assert math.isclose(epsilon_prime(1.0, 0.2), 0.5697, abs_tol=5e-4)
    assert math.isclose(epsilon_prime(1.0, 0.2), 0.56945, abs_tol=1e-5)
    assert math.isclose(epsilon_prime(1.0, 0.0), 1.0, rel_tol=1e-12)
    assert math.isclose(theorem5_epsilon(0.686), 1.672, abs_tol=5e-4)
    eps_prime = epsilon_prime(1.0, 0.2)
    assert theorem5_epsilon(eps_prime) == eps_prime + math.expm1(eps_prime)
    assert math.isclose(theorem5_epsilon(eps_prime), 1.3367, abs_tol=5e-4)
    mech = OneBitMean(epsilon=1.0, m=21_600, gamma=0.2)
    assert math.isclose(mech.epsilon_report, epsilon_prime(1.0, 0.2), rel_tol=1e-12)
    assert math.isclose(mech.epsilon_counters, theorem5_epsilon(mech.epsilon_report), rel_tol=1e-12)


def test_the_papers_0686_is_the_formula_without_the_1_minus_2gamma_factor() -> None:
    """000 §6's 0.686 is ln((p+γ)/(q+γ)), i.e. flipping with probability γ/(1+2γ) = 1/7, not γ = 0.2."""
    p, q = math.e / (math.e + 1), 1 / (math.e + 1)
    dropped = math.log((p + 0.2) / (q + 0.2))
    assert math.isclose(dropped, 0.686, abs_tol=5e-4)
    assert math.isclose(epsilon_prime(1.0, 0.2 / 1.4), dropped, rel_tol=1e-12)
    assert not math.isclose(epsilon_prime(1.0, 0.2), 0.686, abs_tol=0.05)


def test_longitudinal_epsilon_is_width_times_epsilon() -> None:
    """000 Thm 4: a behaviour pattern of width w costs w·ε; widths outside [1, m/s + 1] are refused."""
    mech = OneBitMean(epsilon=1.0, m=DAY, s=DAY // 20, gamma=0.2)
    assert math.isclose(mech.epsilon_longitudinal(3), 3.0, rel_tol=1e-12)
    assert mech.epsilon_longitudinal(1) <= 1.0
    for bad in (0, 22):
        with pytest.raises(ParameterError, match="width"):
            mech.epsilon_longitudinal(bad)


@pytest.mark.parametrize(("epsilon", "gamma", "name"), [(0.0, 0.1, "epsilon"), (1.0, 0.5, "gamma"), (1.0, -1, "gamma")])
def test_epsilon_prime_checks_its_arguments(epsilon: float, gamma: float, name: str) -> None:
    """epsilon_prime validates like the mechanism."""
    with pytest.raises(ParameterError, match=name):
        epsilon_prime(epsilon, gamma)
