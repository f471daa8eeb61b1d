"""RAPPOR's server half (004 §4): unbiased t_ij with honest SE, strict wire decoding, mergeable aggregates."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import MalformedReportError, ParameterError, StateError
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import SeededRandom
from protocol.rappor import Rappor, RapporRecord
from protocol.server.contract import candidate_server
from protocol.server.randomized_response import RRServer
from protocol.server.rappor import RapporAggregate, RapporBatch, RapporServer
from tests.protocol.test_rappor import CHROME, SEED, basic, reference_bloom

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
    server = RapporServer(mech)
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
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, cohorts, rng))
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
    server = RapporServer(mech)
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
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, cohorts, rng))
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
    server = RapporServer(mech)
    rng = SeededRandom(3 if variant == "basic" else 4)
    n, reps = 30_000, 40
    data = np.repeat(np.arange(5), [12_000, 9_000, 6_000, 3_000, 0])
    values = [cats[i] for i in data]
    cohorts = np.arange(n) % 3
    truth = np.bincount(data, minlength=5)
    runs = []
    for _ in range(reps):
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, cohorts, rng))
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
    server = RapporServer(mech)
    agg = server.new_aggregate()
    agg.add(server.decode_records(wire))
    est = agg.estimate_bits()
    assert (np.abs(est.values - truth) <= 5 * est.standard_errors).all()


def test_aggregate_counts_bits_exactly(rng: SeededRandom) -> None:
    """add() gives the same c_ij and N_j as counting unpacked bits, for k not a multiple of 8."""
    mech = Rappor(k=13, h=2, cohorts=5, seed=SEED, **CHROME)
    server = RapporServer(mech)
    batch = server.privatize_many([f"s{i % 17}" for i in range(3000)], np.arange(3000) % 5, rng)
    agg = server.new_aggregate()
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
    server = RapporServer(mech)
    bits = server.candidate_bits(cands)
    pos = server.candidate_positions(cands)
    assert bits.shape == (30, 8, 128)
    assert pos.shape == (30, 8, 2)
    for m, cand in enumerate(cands):
        for c in range(8):
            assert set(np.flatnonzero(bits[m, c]).tolist()) == reference_bloom(mech, cand, c)
            assert set(pos[m, c].tolist()) == reference_bloom(mech, cand, c)


def test_empty_and_degenerate_estimates() -> None:
    """An empty cohort estimates 0 ± 0; f = 1 carries no signal (NaN ± inf); Bloom variants refuse direct decoding."""
    mech = Rappor(k=8, h=2, cohorts=2, seed=SEED, **CHROME)
    est = RapporServer(mech).new_aggregate().estimate_bits()
    assert (est.values == 0).all()
    assert (est.standard_errors == 0).all()
    with pytest.raises(ParameterError, match="variant"):
        RapporServer(mech).new_aggregate().estimate_categories()
    flat = Rappor(k=8, h=2, cohorts=2, seed=SEED, f=1.0, p=0.5, q=0.75)
    assert flat.epsilon_one == 0
    assert flat.epsilon_infinity == 0
    est = RapporServer(flat).new_aggregate().estimate_bits()
    assert np.isnan(est.values).all()
    assert np.isinf(est.standard_errors).all()


# ----- wire form -------------------------------------------------------------------------


WIRE_MECH = Rappor(k=12, h=2, cohorts=3, seed=SEED, **CHROME)
WIRE_SERVER = RapporServer(WIRE_MECH)


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
        WIRE_SERVER.decode_records(raw)
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
    got = WIRE_SERVER.decode_records(wire)
    want = WIRE_SERVER.batch(records)
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
        batch = WIRE_SERVER.decode_records(raw)
    except MalformedReportError:
        return
    assert batch.bits.shape == (len(batch), 2)


# ----- aggregates: merge and persistence -------------------------------------------------


AGG_MECH = Rappor(k=10, h=2, cohorts=3, seed=SEED, **CHROME)
AGG_SERVER = RapporServer(AGG_MECH)


def aggregate_of(records: list[RapporRecord]) -> RapporAggregate:
    """An aggregate holding ``records``."""
    agg = AGG_SERVER.new_aggregate()
    agg.add(AGG_SERVER.batch(records))
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
        AGG_SERVER.new_aggregate().merge(RapporServer(other).new_aggregate())


def test_aggregate_from_plain_is_strict() -> None:
    """Malformed or impossible saved aggregates raise StateError."""
    good: Any = aggregate_of([RapporRecord(0, b"\xff\xc0"), RapporRecord(2, b"\x01\x00")]).to_plain()
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


def test_the_server_half_meets_its_contract() -> None:
    """Bloom variants are CandidateServers (basic ones are not); another mechanism's aggregate is refused."""
    server = candidate_server(RapporServer(AGG_MECH))
    q_star, p_star = server.bit_probabilities
    assert (q_star, p_star) == tuple(float(x) for x in AGG_MECH.coordinate_probabilities("report"))
    assert server.estimate_bits(AGG_SERVER.new_aggregate()).n == 0
    with pytest.raises(TypeError):
        server.estimate_bits(RRServer(RandomizedResponse(epsilon=1.0)).new_aggregate())
    with pytest.raises(TypeError):
        candidate_server(RapporServer(basic()))
