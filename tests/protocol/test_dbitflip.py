"""dBitFlip / dBitFlipPM: exact ε, permanent memo, unbiased histogram with honest SE, strict wire form."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.buckets import LinearBuckets
from protocol.dbitflip import DBitFlip, DBitFlipRecord, DBitFlipState
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.randomness import SeededRandom
from protocol.server.buckets import buckets_of
from protocol.server.dbitflip import DBitFlipAggregate, DBitFlipBatch, DBitFlipServer, DBitFlipStates
from tests.protocol.ldp import assert_tight_ldp

DAY = 86_400
"""000 §5: counters range over 24 hours, in seconds."""

DAY_BUCKETS = LinearBuckets(low=0, high=DAY, count=32)
"""000 §5: k = 32 buckets of even width on [0, 24 h]."""

SIX = LinearBuckets(low=0, high=6, count=6)
"""k = 6 buckets; counter value v falls in bucket v."""


def _mech(d: int, *, epsilon: float = 1.0, memoize: bool = True, buckets: LinearBuckets = DAY_BUCKETS) -> DBitFlip:
    return DBitFlip(epsilon=epsilon, buckets=buckets, d=d, memoize=memoize)


# -- privacy ------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 3, 6])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(3), 4.0])
def test_exact_ldp_is_tight(d: int, epsilon: float) -> None:
    """Over every pair of buckets the ratio reaches exactly e^epsilon_report: ε for d >= 2, ε/2 for d = 1."""
    for memoize in (True, False):
        mech = DBitFlip(epsilon=epsilon, buckets=SIX, d=d, memoize=memoize)
        dists = [mech.output_distribution(v) for v in range(6)]
        assert len(dists[0]) == math.comb(6, d) * 2**d
        assert_tight_ldp(dists, mech.epsilon_report)
        target = epsilon / 2 if d == 1 else epsilon
        assert mech.epsilon_report <= target + 1e-12
        assert mech.epsilon_report == pytest.approx(target, rel=1e-12)


def test_coins_are_complements_and_round_down() -> None:
    """q = 1 - p exactly and p does not exceed e^{ε/2}/(e^{ε/2}+1)."""
    mech = _mech(4)
    assert mech.p + mech.q == 1
    e = math.exp(0.5)
    assert float(mech.p) <= e / (e + 1)
    assert abs(float(mech.p) - e / (e + 1)) < 1e-15


@pytest.mark.parametrize(("d", "memoize"), [(2, True), (3, True), (2, False)])
def test_fresh_device_report_matches_the_exact_distribution(d: int, memoize: bool) -> None:
    """Seeded: reports of freshly set-up devices (setup_many then privatize_many) follow output_distribution (5 SE)."""
    mech = DBitFlip(epsilon=2.0, buckets=SIX, d=d, memoize=memoize)
    server = DBitFlipServer(mech)
    rng = SeededRandom(11)
    n = 60_000
    for value in (0, 4):
        exact = mech.output_distribution(value)
        states = server.setup_many(n, rng)
        batch = server.privatize_many(np.full(n, value), rng, states=states)
        seen = Counter(zip(map(tuple, batch.buckets.tolist()), map(tuple, batch.bits.tolist()), strict=True))
        assert set(seen) <= set(exact)
        for outcome, prob in exact.items():
            p = float(prob)
            assert abs(seen[outcome] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9, outcome


def test_single_setup_and_privatize_match_the_exact_distribution() -> None:
    """Seeded: setup() + privatize() one device at a time follows output_distribution (5 SE)."""
    mech = DBitFlip(epsilon=2.0, buckets=SIX, d=2, memoize=True)
    rng = SeededRandom(12)
    n = 6_000
    seen: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for _ in range(n):
        record, _ = mech.privatize(3, mech.setup(rng), rng)
        seen[(record.buckets, record.bits)] += 1
    for outcome, prob in mech.output_distribution(3).items():
        p = float(prob)
        assert abs(seen[outcome] - n * p) <= 5 * math.sqrt(n * p * (1 - p)), outcome


def test_fresh_path_matches_fresh_bits_for_a_fixed_state() -> None:
    """Seeded: dBitFlip without memo draws fresh bits each report, with the exact coin probabilities (5 SE)."""
    mech = DBitFlip(epsilon=2.0, buckets=SIX, d=3, memoize=False)
    rng = SeededRandom(13)
    state = DBitFlipState((1, 2, 5), None)
    n = 20_000
    ones = np.zeros(3)
    for _ in range(n):
        record, same = mech.privatize(2, state, rng)
        assert record.buckets == (1, 2, 5)
        assert same is state
        ones += record.bits
    for p_index, prob in enumerate([mech.q, mech.p, mech.q]):
        p = float(prob)
        assert abs(ones[p_index] - n * p) <= 5 * math.sqrt(n * p * (1 - p))


def test_bucket_sets_are_uniform() -> None:
    """Seeded: every d-subset of [k] is chosen equally often (5 SE), for drawn and complement-drawn sizes."""
    rng = SeededRandom(14)
    n = 120_000
    for k, d in [(6, 2), (6, 5), (7, 3), (20, 10), (20, 18)]:
        mech = DBitFlip(epsilon=1.0, buckets=LinearBuckets(low=0, high=k, count=k), d=d, memoize=False)
        sets = DBitFlipServer(mech).setup_many(n, rng).buckets
        assert np.all(np.diff(sets, axis=1) > 0)
        if math.comb(k, d) <= 200:
            p = 1 / math.comb(k, d)
            counts = Counter(map(tuple, sets.tolist()))
            assert len(counts) == math.comb(k, d)
            assert all(abs(c - n * p) <= 5 * math.sqrt(n * p * (1 - p)) for c in counts.values())
        pairs = np.bincount(sets[:, 0] * k + sets[:, -1], minlength=k * k)
        assert pairs.sum() == n
        per_bucket = np.bincount(sets.ravel(), minlength=k)
        p = d / k
        assert np.all(np.abs(per_bucket - n * p) <= 5 * math.sqrt(n * p * (1 - p)))


# -- memoization --------------------------------------------------------------------------


def test_memoized_answer_never_changes() -> None:
    """dBitFlipPM: f_d is drawn once; 1,000 rounds and a msgpack state round trip give the same answers."""
    mech = _mech(4)
    rng = SeededRandom(21)
    state = mech.setup(rng)
    first = {v: mech.privatize(v * 2700 + 5, state, rng)[0] for v in range(32)}
    for round_ in range(1_000):
        value = int(rng.words(1)[0] % np.uint64(DAY))
        bucket = DAY_BUCKETS.bucket_of(value)
        record, state = mech.privatize(value, state, rng)
        assert record == first[bucket], round_
    restored = DBitFlipState.from_plain(mech, msgpack.unpackb(msgpack.packb(state.to_plain())))
    assert restored == state
    for v in range(32):
        assert mech.privatize(v * 2700 + 2000, restored, rng)[0] == first[v]
    assert all(r.buckets == state.buckets for r in first.values())


def test_memo_table_is_keyed_by_bucket_and_holds_no_counter() -> None:
    """The state is the chosen buckets plus k·d memo bits; nothing in it depends on a counter value."""
    mech = _mech(4)
    state = mech.setup(SeededRandom(22))
    plain = state.to_plain()
    assert set(plain) == {"buckets", "memo"}
    assert isinstance(plain["memo"], bytes)
    assert len(plain["memo"]) == 32 * 4 // 8
    before = msgpack.packb(plain)
    for value in (0, 12_345, 86_399):
        _, after = mech.privatize(value, state, SeededRandom(value))
        assert msgpack.packb(after.to_plain()) == before


@pytest.mark.parametrize(
    ("k", "d"),
    # every way of drawing the buckets: all of them, by rejection of repeats, by a partial
    # Fisher-Yates shuffle, and through the complement of either
    [(6, 6), (32, 1), (32, 4), (6, 5), (20, 10), (20, 18), (64, 40)],
)
@pytest.mark.parametrize("memoize", [True, False])
def test_device_half_draws_what_the_vectorised_paths_draw(k: int, d: int, memoize: bool) -> None:
    """The device's pure setup is setup_many's state for one device from the same seed, and its
    privatize, value after value, gives privatize_many's records (with the same states) from the same coins."""
    mech = DBitFlip(epsilon=1.0, buckets=LinearBuckets(low=0, high=k, count=k), d=d, memoize=memoize)
    server = DBitFlipServer(mech)
    for seed in range(20):
        assert mech.setup(SeededRandom(seed)) == server.setup_many(1, SeededRandom(seed)).row(0)
    states = server.setup_many(200, SeededRandom(40))
    values = np.arange(200) * 7 % k
    rng = SeededRandom(41)
    records = [mech.privatize(int(values[i]), states.row(i), rng)[0] for i in range(200)]
    many = server.privatize_many(values, SeededRandom(41), states=states)
    assert mech.encode_records(records) == server.encode_batch(many)


def test_memo_paths_agree() -> None:
    """privatize, privatize_many(states=...) and DBitFlipState.answer give the same memoized bits."""
    mech = _mech(3)
    rng = SeededRandom(23)
    server = DBitFlipServer(mech)
    states = server.setup_many(200, rng)
    values = np.arange(200) * 431 % DAY
    batch = server.privatize_many(values, rng, states=states)
    again = server.privatize_many(values, rng, states=states)
    assert np.array_equal(batch.bits, again.bits)
    for i in range(200):
        record, _ = mech.privatize(int(values[i]), states.row(i), rng)
        assert record.buckets == tuple(batch.buckets[i])
        assert record.bits == tuple(batch.bits[i])
    stacked = DBitFlipStates.stack([states.row(i) for i in range(200)], mech)
    assert np.array_equal(stacked.buckets, states.buckets)
    assert stacked.memo is not None
    assert states.memo is not None
    assert np.array_equal(stacked.memo, states.memo)


def test_without_memo_bits_are_fresh_but_buckets_fixed() -> None:
    """dBitFlip (memoize=False) keeps its buckets for good and redraws only the bits."""
    mech = _mech(8, memoize=False)
    rng = SeededRandom(24)
    state = mech.setup(rng)
    assert state.memo is None
    records = [mech.privatize(43_200, state, rng)[0] for _ in range(50)]
    assert {r.buckets for r in records} == {state.buckets}
    assert len({r.bits for r in records}) > 1


# -- accuracy: 000 §5 ---------------------------------------------------------------------


def _population(kind: str, n: int) -> npt.NDArray[Any]:
    """000 §5's synthetic counters (seconds): constant 12 h, uniform on [0, 24 h), normal(12 h, 2 h) truncated."""
    data = np.random.default_rng(5)  # the population, not device randomness
    if kind == "constant":
        return np.full(n, 12 * 3600, dtype=np.int64)
    if kind == "uniform":
        return data.integers(0, DAY, size=n, dtype=np.int64)
    draws = data.normal(12 * 3600, 2 * 3600, size=2 * n)
    return draws[(draws >= 0) & (draws <= DAY)][:n]


def _monte_carlo(mech: DBitFlip, values: npt.NDArray[Any], reps: int, seed: int) -> dict[str, Any]:
    """``reps`` independent rounds of fresh devices: the truth and both estimators' values and SEs per round."""
    truth = np.bincount(buckets_of(mech.buckets, values), minlength=mech.k) / values.size
    rng = SeededRandom(seed)
    server = DBitFlipServer(mech)
    out = {name: (np.empty((reps, mech.k)), np.empty((reps, mech.k))) for name in ("eq3", "normalised")}
    for r in range(reps):
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, rng))
        for name, (est, se) in out.items():
            e = agg.estimate(normalised=name == "normalised")
            est[r], se[r] = e.values, e.standard_errors
    return {"truth": truth} | out


def _check_unbiased_and_honest(truth: Any, est: Any, se: Any) -> None:
    """Every bucket within 5 SE in every round; reported SE matches the spread over rounds."""
    assert np.all(np.abs(est - truth) <= 5 * se)
    reps = est.shape[0]
    spread = est.std(axis=0, ddof=1)
    ratio = np.sqrt((se**2).mean(axis=0)) / spread
    # Pooled over the k buckets: within 15%. Per bucket: within 5 standard errors of a
    # sample standard deviation over `reps` rounds (1/sqrt(2(reps-1)) relative).
    assert abs(float(ratio.mean()) - 1) < 0.15, ratio
    assert np.all(np.abs(ratio - 1) < 5 / math.sqrt(2 * (reps - 1))), ratio
    # The mean over rounds is unbiased: within 5 SE of the mean.
    assert np.all(np.abs(est.mean(axis=0) - truth) <= 5 * spread / math.sqrt(reps) + 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "d"),
    [("constant", 1), ("uniform", 1), ("normal", 1), ("constant", 4), ("uniform", 4), ("normal", 4), ("uniform", 32)],
)
def test_histogram_unbiased_with_honest_se(kind: str, d: int) -> None:
    """000 §5 (k = 32 on 24 h, n = 10^5, 150 rounds): eq. (3) and the normalised variant are unbiased, SEs honest.

    d = k = 32 runs on one data set only: every device then reports every bucket, so the
    variance c/n does not depend on the data.
    """
    mech = _mech(d)
    mc = _monte_carlo(mech, _population(kind, 100_000), 150, seed=100 * d + len(kind))
    for name in ("eq3", "normalised"):
        _check_unbiased_and_honest(mc["truth"], *mc[name])


@pytest.mark.slow
def test_occupied_bucket_variance_term() -> None:
    """At ε = 4 with constant data the occupied bucket's variance has the extra (k/d - 1)·h term, and it is right."""
    mech = _mech(4, epsilon=4.0)
    mc = _monte_carlo(mech, _population("constant", 100_000), 150, seed=31)
    for name in ("eq3", "normalised"):
        _check_unbiased_and_honest(mc["truth"], *mc[name])
    # eq. (3): the occupied bucket's SE is far above the empty ones' (about 2.5x), so the
    # per-bucket check above tests the h term of the variance.
    _, se = mc["eq3"]
    assert se[:, 16].mean() > 2 * se[:, 0].mean()


def test_estimate_of_memoized_devices_is_unbiased() -> None:
    """Seeded: devices set up with setup_many answering from their memo give an unbiased histogram (5 SE)."""
    mech = _mech(4)
    values = _population("normal", 50_000)
    rng = SeededRandom(51)
    server = DBitFlipServer(mech)
    states = server.setup_many(values.size, rng)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, rng, states=states))
    est = agg.estimate()
    truth = np.bincount(buckets_of(DAY_BUCKETS, values), minlength=32) / values.size
    assert np.all(np.abs(est.values - truth) <= 5 * est.standard_errors)
    assert agg.n == values.size


def test_empty_aggregate_estimates_nan() -> None:
    """No reports: NaN estimates, n = 0."""
    est = DBitFlipServer(_mech(2)).new_aggregate().estimate()
    assert est.n == 0
    assert np.all(np.isnan(est.values))


# -- parameters and inputs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"d": 33}, "d"),
        ({"d": 0}, "d"),
        ({"d": 2.0}, "d"),
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"buckets": {"kind": "linear", "low": 0, "high": 1, "count": 2}}, "buckets"),
        ({"memoize": 1}, "memoize"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    """Invalid parameters raise ParameterError naming the parameter."""
    args: dict[str, Any] = {"epsilon": 1.0, "buckets": DAY_BUCKETS, "d": 4, "memoize": True} | kwargs
    with pytest.raises(ParameterError) as info:
        DBitFlip(**args)
    assert info.value.name == field


def test_memo_size_is_bounded() -> None:
    """dBitFlipPM refuses a memo table above 2**20 bits, naming d; without memo the same d is fine."""
    big = LinearBuckets(low=0, high=4096, count=4096)
    with pytest.raises(ParameterError, match="'d'"):
        DBitFlip(epsilon=1.0, buckets=big, d=512, memoize=True)
    DBitFlip(epsilon=1.0, buckets=big, d=512, memoize=False)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "5", None])
def test_bad_values_are_refused(bad: object) -> None:
    """Negative, NaN, infinite and non-numeric counters raise InputError, singly and in batches."""
    mech = _mech(2)
    rng = SeededRandom(61)
    state = mech.setup(rng)
    with pytest.raises(InputError):
        mech.privatize(bad, state, rng)  # type: ignore[arg-type]
    if isinstance(bad, float):
        with pytest.raises(InputError):
            DBitFlipServer(mech).privatize_many(np.array([1.0, bad]), rng)


def test_foreign_state_is_refused() -> None:
    """A state of another d or memo mode raises StateError instead of reporting."""
    rng = SeededRandom(62)
    with pytest.raises(StateError):
        _mech(2).privatize(5, _mech(3).setup(rng), rng)
    with pytest.raises(StateError):
        _mech(2).privatize(5, _mech(2, memoize=False).setup(rng), rng)
    states = DBitFlipServer(_mech(2, memoize=False)).setup_many(1, rng)
    with pytest.raises(StateError):
        DBitFlipServer(_mech(2)).privatize_many(np.array([5]), rng, states=states)


@pytest.mark.parametrize(
    "plain",
    [
        None,
        {"buckets": [1, 2]},
        {"buckets": [2, 1], "memo": bytes(8)},
        {"buckets": [1, 1], "memo": bytes(8)},
        {"buckets": [1, 32], "memo": bytes(8)},
        {"buckets": [1, True], "memo": bytes(8)},
        {"buckets": [1], "memo": bytes(8)},
        {"buckets": [1, 2], "memo": bytes(7)},
        {"buckets": [1, 2], "memo": None},
        {"buckets": [1, 2], "memo": "x" * 8},
        {"buckets": [1, 2], "memo": bytes(8), "extra": 1},
    ],
)
def test_malformed_state_is_refused(plain: object) -> None:
    """A saved state that is malformed or does not fit the parameters raises StateError."""
    with pytest.raises(StateError):
        DBitFlipState.from_plain(_mech(2), plain)


def test_state_padding_must_be_zero() -> None:
    """k·d not a multiple of 8: the memo's padding bits must be zero."""
    mech = DBitFlip(epsilon=1.0, buckets=SIX, d=3)  # 18 bits -> 3 bytes, 6 padding bits
    good: Any = mech.setup(SeededRandom(63)).to_plain()
    assert DBitFlipState.from_plain(mech, good).memo == good["memo"]
    bad = dict(good, memo=good["memo"][:-1] + bytes([good["memo"][-1] | 1]))
    with pytest.raises(StateError, match="padding"):
        DBitFlipState.from_plain(mech, bad)
    assert DBitFlipState.from_plain(_mech(2, memoize=False), {"buckets": [0, 7], "memo": None}).memo is None


# -- wire ---------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 3, 8, 9, 32])
def test_wire_round_trip(d: int) -> None:
    """encode_records / encode_batch -> msgpack -> decode_records reproduces the batch."""
    mech = _mech(d)
    server = DBitFlipServer(mech)
    rng = SeededRandom(71)
    values = np.arange(100) * 977 % DAY
    states = server.setup_many(100, rng)
    batch = server.privatize_many(values, rng, states=states)
    records = [mech.privatize(int(values[i]), states.row(i), rng)[0] for i in range(100)]
    wire = mech.encode_records(records)
    assert wire == server.encode_batch(batch)
    assert all(len(w[1]) == (d + 7) // 8 for w in wire)
    back = server.decode_records(msgpack.unpackb(msgpack.packb(wire)))
    assert np.array_equal(back.buckets, batch.buckets)
    assert np.array_equal(back.bits, batch.bits)
    assert back.buckets.dtype == np.int64
    assert back.bits.dtype == np.uint8
    same = server.batch(records)
    assert np.array_equal(same.buckets, batch.buckets)
    assert np.array_equal(same.bits, batch.bits)
    empty = server.decode_records([])
    assert len(empty) == 0
    assert empty.buckets.shape == (0, d)


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        ({"a": 1}, "bad-type", "records"),
        ([[[1, 2, 3], b"\x00"], 5], "bad-type", "records[1]"),
        ([[[1, 2, 3]]], "bad-length", "records[0]"),
        ([[[1, 2, 3], b"\x00", 0]], "bad-length", "records[0]"),
        ([[(1, 2, 3), b"\x00"]], "bad-type", "records[0].buckets"),
        ([[[1, 2], b"\x00"]], "bad-length", "records[0].buckets"),
        ([[[1, 2, 3, 4], b"\x00"]], "bad-length", "records[0].buckets"),
        ([[[1, 2.0, 3], b"\x00"]], "bad-type", "records[0].buckets[1]"),
        ([[[1, True, 3], b"\x00"]], "bad-type", "records[0].buckets[1]"),
        ([[[1, 2, None], b"\x00"]], "bad-type", "records[0].buckets[2]"),
        ([[[1, 2, 32], b"\x00"]], "out-of-range", "records[0].buckets[2]"),
        ([[[-1, 2, 3], b"\x00"]], "out-of-range", "records[0].buckets[0]"),
        ([[[1, 2, 2**70], b"\x00"]], "out-of-range", "records[0].buckets[2]"),
        ([[[1, 2, 1], b"\x00"]], "duplicate", "records[0].buckets"),
        ([[[1, 2, 3], "\x00"]], "bad-type", "records[0].bits"),
        ([[[1, 2, 3], [0, 1, 0]]], "bad-type", "records[0].bits"),
        ([[[1, 2, 3], b""]], "bad-length", "records[0].bits"),
        ([[[1, 2, 3], b"\x00\x00"]], "bad-length", "records[0].bits"),
        ([[[1, 2, 3], b"\x10"]], "bad-padding", "records[0].bits"),
        ([[[1, 2, 3], b"\x01"]], "bad-padding", "records[0].bits"),
    ],
)
def test_strict_decode(raw: object, reason: str, field: str) -> None:
    """Each malformed record is refused with its reason and field."""
    with pytest.raises(MalformedReportError) as info:
        DBitFlipServer(_mech(3)).decode_records(raw)
    assert (info.value.reason, info.value.field) == (reason, field)


def test_decode_accepts_any_order_of_distinct_buckets() -> None:
    """Bucket order is not meaningful; distinct in-range buckets in any order decode with their bits."""
    batch = DBitFlipServer(_mech(3)).decode_records([[[5, 1, 3], b"\xa0"]])
    assert batch.buckets.tolist() == [[5, 1, 3]]
    assert batch.bits.tolist() == [[1, 0, 1]]


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=20,
)


@given(_msgpack_values)
def test_decode_is_total(raw: object) -> None:
    """Any object msgpack can produce either decodes or raises MalformedReportError, nothing else."""
    mech = _mech(2)
    try:
        batch = DBitFlipServer(mech).decode_records(raw)
    except MalformedReportError:
        return
    assert batch.buckets.shape == batch.bits.shape == (len(batch), 2)


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 5), min_size=2, max_size=2, unique=True), st.integers(0, 3)),
        max_size=40,
    )
)
def test_decode_of_valid_records_is_exact(rows: list[tuple[list[int], int]]) -> None:
    """Valid records (any distinct bucket pair, any bits) decode to exactly those buckets and bits."""
    mech = DBitFlip(epsilon=1.0, buckets=SIX, d=2)
    raw = [[js, bytes([bits << 6])] for js, bits in rows]
    batch = DBitFlipServer(mech).decode_records(raw)
    assert batch.buckets.tolist() == [js for js, _ in rows]
    assert batch.bits.tolist() == [[bits >> 1, bits & 1] for _, bits in rows]


# -- aggregate ----------------------------------------------------------------------------

_batches = st.lists(
    st.tuples(st.lists(st.integers(0, 5), min_size=2, max_size=2, unique=True), st.integers(0, 3)),
    max_size=30,
)


def _agg(mech: DBitFlip, rows: list[tuple[list[int], int]]) -> DBitFlipAggregate:
    agg = DBitFlipServer(mech).new_aggregate()
    agg.add(
        DBitFlipBatch(
            np.array([js for js, _ in rows], dtype=np.int64).reshape(-1, 2),
            np.array([[b >> 1, b & 1] for _, b in rows], dtype=np.uint8).reshape(-1, 2),
        )
    )
    return agg


@given(_batches, _batches, _batches)
def test_merge_is_associative_and_commutative(a: Any, b: Any, c: Any) -> None:
    """Aggregates are sums: any merge order gives the same aggregate, equal to adding everything at once."""
    mech = DBitFlip(epsilon=1.0, buckets=SIX, d=2)
    x, y, z = _agg(mech, a), _agg(mech, b), _agg(mech, c)
    left = x.merge(y).merge(z).to_plain()
    assert left == x.merge(y.merge(z)).to_plain() == z.merge(x).merge(y).to_plain()
    assert left == _agg(mech, a + b + c).to_plain()


@given(_batches)
@settings(max_examples=50)
def test_aggregate_round_trip(rows: Any) -> None:
    """to_plain -> msgpack -> from_plain restores the aggregate and its estimate."""
    mech = DBitFlip(epsilon=1.0, buckets=SIX, d=2)
    agg = _agg(mech, rows)
    back = DBitFlipAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(agg.to_plain())))
    assert back.to_plain() == agg.to_plain()
    assert back.n == agg.n == len(rows)
    if rows:
        assert np.array_equal(back.estimate().values, agg.estimate().values)


def test_aggregate_from_plain_checks_consistency() -> None:
    """A saved aggregate with ones > counts, counts not summing to n·d, or a bad field is refused."""
    mech = DBitFlip(epsilon=1.0, buckets=SIX, d=2)
    good = _agg(mech, [([0, 1], 3), ([2, 5], 1)]).to_plain()
    DBitFlipAggregate.from_plain(mech, good)
    bad_n = dict(good, n=3)
    bad_ones = dict(good, ones=_agg(mech, [([0, 1], 3), ([0, 1], 3), ([0, 1], 3)]).to_plain()["ones"])
    bad: object
    for bad in (bad_n, bad_ones, dict(good, n=True), {"ones": good["ones"]}, [], dict(good, counts=b"")):
        with pytest.raises(StateError):
            DBitFlipAggregate.from_plain(mech, bad)


def test_merge_refuses_other_mechanisms() -> None:
    """Aggregates of different parameters do not merge."""
    with pytest.raises(ValueError, match="different"):
        DBitFlipServer(_mech(2)).new_aggregate().merge(DBitFlipServer(_mech(3)).new_aggregate())


def test_record_and_batch_shapes() -> None:
    """A record carries d (bucket, bit) pairs; batch() stacks them into (N, d) arrays."""
    mech = _mech(4)
    rng = SeededRandom(81)
    record, _ = mech.privatize(100, mech.setup(rng), rng)
    assert isinstance(record, DBitFlipRecord)
    assert len(record.buckets) == len(record.bits) == 4
    assert set(record.bits) <= {0, 1}
    batch = DBitFlipServer(mech).batch([record, record])
    assert batch.buckets.shape == batch.bits.shape == (2, 4)
