"""Count Mean Sketch: exact ε, exact coins, unbiased counts with honest standard errors, strict wire form."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from fractions import Fraction
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.cms import CMSRecord, CountMeanSketch
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.randomness import SeededRandom, SystemRandom, random_bytes
from protocol.server.cms import CMSAggregate, CMSBatch, CMSServer
from tests.protocol.ldp import assert_tight_ldp
from tests.protocol.sketch_coins import EdgeRandom, cms_record

SEED = b"cms-test-seed-0123456789"


def _mech(**overrides: Any) -> CountMeanSketch:
    params: dict[str, Any] = {"epsilon": 2.0, "k": 16, "m": 32, "seed": SEED}
    params.update(overrides)
    return CountMeanSketch(**params)


class ScriptedRandom:
    """Returns the given words in order (to exercise every branch of the coins)."""

    def __init__(self, words: list[int]) -> None:
        self._words = list(words)

    def draw(self, n: int) -> list[int]:
        out, self._words = self._words[:n], self._words[n:]
        return out + [0] * (n - len(out))

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        return np.array(self.draw(n), dtype=np.uint64)


class NoRandom:
    """A source that must not be used."""

    def draw(self, n: int) -> list[int]:
        raise AssertionError("no randomness may be drawn here")

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        raise AssertionError("no randomness may be drawn here")


def _naive_ones(mech: CountMeanSketch, batch: CMSBatch) -> npt.NDArray[np.int64]:
    ones = np.zeros((mech.k, mech.m), dtype=np.int64)
    np.add.at(ones, batch.indices, np.unpackbits(batch.bits, axis=1, count=mech.m).astype(np.int64))
    out: npt.NDArray[np.int64] = ones
    return out


# ------------------------------------------------------------------------- privacy


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_exact_ldp_is_tight(epsilon: float) -> None:
    """Enumerating every (j, vector) output for m = 8, k = 4: the worst ratio over values is exactly e**ε."""
    mech = _mech(epsilon=epsilon, k=4, m=8)
    values: list[str | bytes] = ["a", "b", "c", "d", "e", b"\x00\xff"]
    dists = [mech.output_distribution(v) for v in values]
    assert_tight_ldp(dists, epsilon)
    assert mech.epsilon_report <= epsilon + 1e-12
    assert mech.epsilon_report == pytest.approx(epsilon, abs=1e-12)


def test_output_is_index_times_independent_coordinates() -> None:
    """j is uniform whatever the value, and given j the coordinates are independent with the keep coin."""
    mech = _mech(k=4, m=8)
    p = mech.keep_coin.probability
    dist = mech.output_distribution("zebra")
    for j in range(4):
        row = {bits: pr for (jj, bits), pr in dist.items() if jj == j}
        assert sum(row.values()) == Fraction(1, 4)
        h = mech.family.evaluate_value("zebra", j)
        one_hot = np.zeros(8, dtype=np.uint8)
        one_hot[h] = 1
        for bits, pr in row.items():
            v = np.unpackbits(np.frombuffer(bits, dtype=np.uint8))
            agree = int((v == one_hot).sum())
            assert pr == Fraction(1, 4) * p**agree * (1 - p) ** (8 - agree)


def test_exact_coins_resolve_ties_with_a_fresh_remainder() -> None:
    """The byte-first coin flips exactly when byte < T's top byte, or on a tie when the 56-bit rest is below T's."""
    mech = _mech(k=4, m=8)
    server = CMSServer(mech)
    threshold = mech.flip_coin.numerator
    high, low = threshold >> 56, threshold & ((1 << 56) - 1)
    coin_bytes = [high - 1, high, high + 1, high, 0, 255, high, high]
    word0 = int.from_bytes(bytes(coin_bytes), "little")
    j_word = 3 << 62  # k = 4: the top two bits give j = 3
    ties = [(low - 1) << 8, low << 8, 0, (1 << 64) - 1]  # flip, keep, flip, keep
    script = [word0, j_word, *ties]
    expected_flips = [1, 1, 0, 0, 1, 0, 1, 0]
    h = mech.family.evaluate_value("v", 3)
    expected = list(expected_flips)
    expected[h] ^= 1
    want = CMSRecord(3, np.packbits(np.array(expected, dtype=np.uint8)).tobytes())
    single, _ = mech.privatize("v", None, ScriptedRandom(script))
    assert single == want
    batch = server.privatize_many(["v"], ScriptedRandom(script))
    assert int(batch.indices[0]) == 3
    assert batch.bits[0].tobytes() == want.bits


@pytest.mark.parametrize("path", ["single", "batch"])
def test_sampler_matches_the_exact_distribution(path: str, rng: SeededRandom) -> None:
    """Reports drawn by privatize / privatize_many match output_distribution output by output (5 SE)."""
    mech = _mech(epsilon=1.5, k=3, m=3)
    server = CMSServer(mech)
    n = 20_000
    if path == "single":
        batch = server.batch([mech.privatize("v", None, rng)[0] for _ in range(n)])
    else:
        batch = server.privatize_many(["v"] * n, rng)
    seen = Counter(zip(batch.indices.tolist(), [row.tobytes() for row in batch.bits], strict=True))
    dist = mech.output_distribution("v")
    assert set(seen) <= set(dist)
    for output, prob in dist.items():
        p = float(prob)
        assert abs(seen[output] - n * p) <= 5 * math.sqrt(n * p * (1 - p)), output


def test_the_os_source_gives_well_formed_records() -> None:
    """With the device's OS source (the coin bytes come straight from the kernel) every record
    decodes strictly (zero padding, indices in range) and every index occurs."""
    mech = _mech(k=7, m=13)
    rng = SystemRandom()
    records = [mech.privatize(f"v{i}", None, rng)[0] for i in range(500)]
    batch = CMSServer(mech).decode_records(mech.encode_records(records))
    assert len(batch) == 500
    assert set(batch.indices.tolist()) == set(range(7))


def test_pre_drawn_words_must_match_the_report(rng: SeededRandom) -> None:
    """A caller that draws a report's words itself must pass exactly draw_words of them."""
    mech = _mech(k=4, m=8)
    drawn = random_bytes(rng, 8 * mech.draw_words)
    record = mech.privatize_bytes(b"v", rng, drawn=drawn)
    assert record == mech.privatize_bytes(b"v", rng, drawn=drawn)
    with pytest.raises(ValueError, match="pre-drawn"):
        mech.privatize_bytes(b"v", rng, drawn=drawn[:-8])


# Sizes that take every branch of the device path: k a power of two (1 and 65,536 included) or
# not (rejection), m below, at and past a byte boundary (padding bits), m = 1,024 (spare words).
DEVICE_SIZES = [(1, 8), (4, 8), (7, 13), (3, 2), (16, 64), (65_536, 1024), (5, 1000)]


def _edge_words(mech: CountMeanSketch) -> list[int]:
    """Every coin byte on the flip threshold's top byte (eight ties), no word accepted as ``j``, all zeros."""
    high = mech.flip_coin.numerator >> 56
    return [int.from_bytes(bytes([high]) * 8, "little"), (1 << 64) - 1, 0]


@pytest.mark.parametrize(("k", "m"), DEVICE_SIZES)
def test_pure_privatize_is_the_numpy_path_record_for_record(k: int, m: int) -> None:
    """Seeded and edge coins (ties past the spare words, rejected indices): the pure device path gives
    the numpy path's records, record for record, and leaves the stream where it did."""
    mech = _mech(k=k, m=m)
    edges = _edge_words(mech)
    for seed in range(30):
        pairs: list[tuple[SeededRandom | EdgeRandom, SeededRandom | EdgeRandom]] = [
            (SeededRandom(seed), SeededRandom(seed)),
            (EdgeRandom(seed, edges), EdgeRandom(seed, edges)),
        ]
        for pure, numpy_path in pairs:
            for i in range(4):
                value = f"v{seed}-{i}"
                assert mech.privatize(value, None, pure)[0] == cms_record(mech, value.encode(), numpy_path)
            assert pure.draw(1) == numpy_path.draw(1)


@pytest.mark.parametrize(("k", "m"), DEVICE_SIZES)
def test_pure_privatize_equals_the_server_batch_path(k: int, m: int) -> None:
    """One value at a time, the server half's privatize_many draws a report's words as the device
    does (coin bytes, the word for j, the spares), so it gives the very same record."""
    mech = _mech(k=k, m=m)
    server = CMSServer(mech)
    for seed in range(30):
        value = f"v{seed}"
        record, _ = mech.privatize(value, None, SeededRandom(seed))
        batch = server.privatize_many([value], SeededRandom(seed))
        assert record == CMSRecord(int(batch.indices[0]), batch.bits[0].tobytes())


@pytest.mark.parametrize("m", [8, 13, 1000, 1024])
def test_scalar_hash_matches_the_family(m: int) -> None:
    """The client's pure-Python hash equals HashFamily.evaluate_value (power-of-two m or not)."""
    mech = _mech(k=64, m=m)
    values: list[str | bytes] = ["", "a", "hello world", "ü", b"\x00\x01"]
    for value in values:
        data = value.encode() if isinstance(value, str) else value
        for j in (0, 1, 17, 63):
            assert mech.scalar_hash(data, j) == mech.family.evaluate_value(value, j)


# ---------------------------------------------------------------- client behaviour


def test_single_and_batch_paths_have_the_papers_distribution(rng: SeededRandom) -> None:
    """Single and batch reports: j uniform, coordinate h_j(d) is +1 with p, every other one with 1 - p (5 SE)."""
    mech = _mech(epsilon=1.0, k=8, m=16)
    server = CMSServer(mech)
    p = mech.keep_probability
    n = 20_000
    singles = server.batch([mech.privatize("word", None, rng)[0] for _ in range(n)])
    batched = server.privatize_many(["word"] * n, rng)
    for batch in (singles, batched):
        bits = np.unpackbits(batch.bits, axis=1, count=16)
        h = np.array([mech.family.evaluate_value("word", j) for j in range(8)])[batch.indices]
        at_h = bits[np.arange(n), h]
        assert abs(at_h.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n)
        others = (bits.sum(axis=1) - at_h).sum()
        cells = n * 15
        assert abs(others / cells - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / cells)
        counts = np.bincount(batch.indices, minlength=8)
        assert np.all(np.abs(counts - n / 8) <= 5 * math.sqrt(n * (1 / 8) * (7 / 8)))


def test_non_power_of_two_sizes_work(rng: SeededRandom) -> None:
    """k and m need not be powers of two: indices stay in range and padding bits stay zero."""
    mech = _mech(k=7, m=13)
    server = CMSServer(mech)
    batch = server.privatize_many([f"v{i}" for i in range(2000)], rng)
    assert set(np.unique(batch.indices).tolist()) == set(range(7))
    assert batch.bits.shape == (2000, 2)
    assert not np.any(batch.bits[:, -1] & 0b111)
    record, state = mech.privatize("x", None, rng)
    assert state is None
    assert 0 <= record.index < 7
    assert len(record.bits) == 2
    assert record.bits[-1] & 0b111 == 0


@pytest.mark.parametrize("bad", [3, None, 1.5, ["a"], "\ud800"])
def test_bad_value_is_refused(bad: object, rng: SeededRandom) -> None:
    """Only str (UTF-8 encodable) and bytes values can be privatized."""
    mech = _mech()
    server = CMSServer(mech)
    with pytest.raises(InputError):
        mech.privatize(bad, None, rng)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        server.privatize_many(["fine", bad], rng)  # type: ignore[list-item]


def test_setup_has_no_state() -> None:
    """CMS is event-level: no permanent per-device state (setup draws nothing)."""
    _mech().setup(NoRandom())  # returns None by its signature; nothing to persist


# -------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("epsilon", 0),
        ("epsilon", -1.0),
        ("epsilon", math.nan),
        ("epsilon", 65.0),
        ("epsilon", "2"),
        ("k", 0),
        ("k", True),
        ("k", 2.0),
        ("k", 1 << 25),
        ("m", 1),
        ("m", 0),
        ("m", 8.0),
        ("m", (1 << 20) + 1),
        ("seed", b"short"),
        ("seed", "a string seed, long enough"),
    ],
)
def test_bad_parameters_name_the_field(field: str, bad: object) -> None:
    """A bad parameter is a ParameterError naming that parameter."""
    with pytest.raises(ParameterError, match=field) as info:
        _mech(**{field: bad})
    assert info.value.name == field


# --------------------------------------------------------------------- aggregate


@pytest.mark.parametrize(("k", "m", "n"), [(1, 8, 500), (16, 32, 5000), (4096, 64, 3000), (64, 1024, 3000)])
def test_add_counts_exactly(k: int, m: int, n: int, rng: SeededRandom) -> None:
    """The vectorised fold (dense, sparse with repeated rows, threaded) equals a naive per-record count."""
    mech = _mech(k=k, m=m)
    server = CMSServer(mech)
    batch = server.privatize_many([f"v{i % 50}" for i in range(n)], rng)
    agg = server.new_aggregate()
    agg.add(batch.take(np.arange(n // 3)))
    agg.add(batch.take(np.arange(n // 3, n)))
    assert np.array_equal(agg.ones, _naive_ones(mech, batch))
    assert np.array_equal(agg.row_counts, np.bincount(batch.indices, minlength=k))
    assert agg.n == n


@pytest.mark.parametrize(("k", "m", "step"), [(16, 32, 1250), (4096, 64, 200)])  # dense and sparse adds
def test_second_moment_kept_across_adds_equals_one_computed_afresh(
    k: int, m: int, step: int, rng: SeededRandom
) -> None:
    """Refreshing only the rows an add touched gives the very second moment a restored aggregate computes."""
    mech = _mech(k=k, m=m)
    server = CMSServer(mech)
    batch = server.privatize_many([f"v{i % 30}" for i in range(6000)], rng)
    agg = server.new_aggregate()  # kept from empty
    restored = CMSAggregate.from_plain(mech, agg.to_plain())  # computed at the first query
    restored.second_moment()
    for start in range(0, 6000, step):
        restored.add(batch.take(np.arange(start, min(start + step, 6000))))
        agg.add(batch.take(np.arange(start, min(start + step, 6000))))
        fresh = CMSAggregate.from_plain(mech, agg.to_plain())
        assert agg.second_moment() == fresh.second_moment() == restored.second_moment()


def test_add_refuses_a_batch_that_does_not_fit(rng: SeededRandom) -> None:
    """A batch with out-of-range indices or the wrong vector width is refused and changes nothing."""
    mech = _mech()
    server = CMSServer(mech)
    agg = server.new_aggregate()
    good = server.privatize_many(["a", "b"], rng)
    with pytest.raises(ValueError, match="indices"):
        agg.add(CMSBatch(indices=np.array([0, 16]), bits=good.bits))
    with pytest.raises(ValueError, match="shape"):
        agg.add(CMSBatch(indices=good.indices, bits=good.bits[:, :2]))
    assert agg.n == 0
    assert not agg.ones.any()


def test_sketch_matrix_is_algorithm_3(rng: SeededRandom) -> None:
    """sketch_matrix equals Alg. 3's M = Σ k (c_ε ṽ / 2 + 1/2) built record by record."""
    mech = _mech(k=4, m=8)
    server = CMSServer(mech)
    batch = server.privatize_many([f"v{i}" for i in range(300)], rng)
    agg = server.new_aggregate()
    agg.add(batch)
    c = server.c_epsilon
    want = np.zeros((4, 8))
    for j, packed in zip(batch.indices, batch.bits, strict=True):
        v = np.unpackbits(packed, count=8).astype(np.float64) * 2 - 1
        want[j] += mech.k * (c / 2 * v + 0.5)
    assert np.allclose(agg.sketch_matrix(), want, rtol=1e-12, atol=1e-9)
    # Alg. 4 on that matrix gives the same counts as the gather on the integer table.
    values = ["v1", "v2", "nobody"]
    est = agg.estimate(values)
    for i, value in enumerate(values):
        gathered = sum(want[j, mech.family.evaluate_value(value, j)] for j in range(4))
        alg4 = (8 / 7) * (gathered / 4 - agg.n / 8)
        assert est.values[i] == pytest.approx(alg4, rel=1e-9, abs=1e-6)


def test_cells_widen_before_they_could_overflow(rng: SeededRandom) -> None:
    """A row about to exceed 2**32 - 1 records switches the table to uint64 instead of wrapping."""
    mech = _mech(k=1, m=8)
    server = CMSServer(mech)
    full = 2**32 - 1
    plain: Any = server.new_aggregate().to_plain()
    plain["n"] = full
    plain["row_counts"]["data"] = np.array([full], dtype="<i8").tobytes()
    plain["ones"]["data"] = np.full(8, full, dtype="<u4").tobytes()
    agg = CMSAggregate.from_plain(mech, plain)
    batch = CMSBatch(indices=np.zeros(1, dtype=np.int64), bits=np.full((1, 1), 0xFF, dtype=np.uint8))
    agg.add(batch)
    assert agg.ones.dtype == np.uint64
    assert np.all(agg.ones == 2**32)
    assert CMSAggregate.from_plain(mech, agg.to_plain()).ones.dtype == np.uint64


def test_empty_aggregate_estimates_nan() -> None:
    """No reports: the estimate is NaN with n = 0, not a division error."""
    est = CMSServer(_mech()).new_aggregate().estimate(["a"])
    assert est.n == 0
    assert math.isnan(est.values[0])
    assert math.isnan(est.standard_errors[0])


def test_top_keeps_frequent_values_above_threshold(rng: SeededRandom) -> None:
    """top() returns the candidates at or above the threshold, largest first."""
    mech = _mech(epsilon=8.0, k=64, m=256)
    server = CMSServer(mech)
    values = ["often"] * 3000 + ["sometimes"] * 1500 + ["rarely"] * 20
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, rng))
    top = agg.top(["never", "rarely", "sometimes", "often"], threshold=500)
    assert [v for v, _ in top] == ["often", "sometimes"]
    assert top[0][1].value > top[1][1].value
    assert [v for v, _ in agg.top(["never", "sometimes", "often"], n_top=1)] == ["often"]


# ---------------------------------------------------------------- statistics


def _zipf_counts(n: int, universe: int, exponent: float) -> npt.NDArray[np.int64]:
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -exponent
    counts: npt.NDArray[np.int64] = np.floor(n * weights / weights.sum()).astype(np.int64)
    return counts


@pytest.mark.slow
def test_unbiased_with_honest_standard_error() -> None:
    """Zipf(1.2), n ~ 10^5, 200 seeds: every estimate within 5 SE; reported SE within 15% of the spread.

    003's expectation and variance are over the hash family too, so every repetition draws
    a new public seed (with a fixed seed, collisions are a fixed offset, not noise). With
    k m = 8,192 the collision term (Σ f**2 / (k m)) is as large as the coin term, so both
    parts of the variance, and the sketch's estimate of Σ f**2, are checked.
    """
    counts = _zipf_counts(100_000, 1000, 1.2)
    values = [f"item-{r}" for r, c in enumerate(counts.tolist(), start=1) for _ in range(c)]
    n = len(values)
    ranks = [1, 2, 3, 5, 10, 30, 100, 300, 1000]
    dictionary = [f"item-{r}" for r in ranks] + [f"absent-{i}" for i in range(5)]
    truth = np.array([counts[r - 1] for r in ranks] + [0] * 5, dtype=np.float64)
    f2 = float(np.sum(counts.astype(np.float64) ** 2))
    rng = SeededRandom(3)
    reps = 200
    z = np.empty((reps, len(dictionary)))
    f2_hat = np.empty(reps)
    for rep in range(reps):
        seed = hashlib.sha256(f"cms-monte-carlo-{rep}".encode()).digest()[:16]
        mech = CountMeanSketch(epsilon=2.0, k=512, m=16, seed=seed)
        server = CMSServer(mech)
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, rng))
        est = agg.estimate(dictionary)
        assert est.n == n
        z[rep] = (est.values - truth) / est.standard_errors
        f2_hat[rep] = agg.second_moment()
    assert np.all(np.abs(z) <= 5)
    per_value = np.sqrt(np.mean(z**2, axis=0))  # empirical spread / reported SE, per value
    assert np.all(np.abs(per_value - 1) < 0.15), per_value
    assert abs(float(np.sqrt(np.mean(z**2))) - 1) < 0.05
    # Unbiased counts: the mean error of each value is within 5 SE of the mean.
    assert np.all(np.abs(z.mean(axis=0)) <= 5 / math.sqrt(reps))
    # The plug-in for Σ f**2 is unbiased (5 SE of the mean).
    assert abs(f2_hat.mean() - f2) <= 5 * f2_hat.std(ddof=1) / math.sqrt(reps)


def test_reported_error_matches_theorem_4_2() -> None:
    """The reported variance is the proof's exact expression, bounded by Thm 4.2's and equal to it up to O(1/m)."""
    mech = _mech(epsilon=4.0, k=65_536, m=1024)
    server = CMSServer(mech)
    n, sum_sq = 10**8, 3e14
    exact = server.variance(n=n, count=0.0, others_sum_sq=sum_sq)
    bound = server.variance_bound(n=n, sum_sq=sum_sq)
    assert exact <= bound
    assert exact == pytest.approx(bound, rel=2e-3)
    e = math.exp(2.0)
    paper = (1024 / 1023) ** 2 * (e / (e - 1) ** 2 + 1 / 1024 + sum_sq / (n * 65_536 * 1024)) * n
    assert bound == pytest.approx(paper, rel=1e-12)


# -------------------------------------------------------------------- wire form


def test_records_round_trip_through_msgpack(rng: SeededRandom) -> None:
    """encode_records -> msgpack -> decode_records gives back the same batch."""
    mech = _mech(k=7, m=13)
    server = CMSServer(mech)
    records = [mech.privatize(f"v{i}", None, rng)[0] for i in range(50)]
    wire = msgpack.unpackb(msgpack.packb(mech.encode_records(records)))
    decoded = server.decode_records(wire)
    want = server.batch(records)
    assert np.array_equal(decoded.indices, want.indices)
    assert np.array_equal(decoded.bits, want.bits)
    assert server.decode_records([]).bits.shape == (0, 2)


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        ({"a": 1}, "bad-type", "records"),
        ([[1, b"\x00\x00"], 5], "bad-type", "records[1]"),
        ([[1]], "bad-length", "records[0]"),
        ([[1, b"\x00\x00", 0]], "bad-length", "records[0]"),
        ([[True, b"\x00\x00"]], "bad-type", "records[0].index"),
        ([[1.0, b"\x00\x00"]], "bad-type", "records[0].index"),
        ([[-1, b"\x00\x00"]], "out-of-range", "records[0].index"),
        ([[7, b"\x00\x00"]], "out-of-range", "records[0].index"),
        ([[2**70, b"\x00\x00"]], "out-of-range", "records[0].index"),
        ([[1, "\x00\x00"]], "bad-type", "records[0].bits"),
        ([[1, [0, 0]]], "bad-type", "records[0].bits"),
        ([[1, b"\x00"]], "bad-length", "records[0].bits"),
        ([[1, b"\x00\x00\x00"]], "bad-length", "records[0].bits"),
        ([[1, b"\x00\x01"]], "bad-padding", "records[0].bits"),
        ([[1, b"\xff\xf8"], [2, b"\x00\x04"]], "bad-padding", "records[1].bits"),
    ],
)
def test_malformed_records_are_refused_with_a_reason(raw: object, reason: str, field: str) -> None:
    """Each kind of malformed wire record raises MalformedReportError with its reason and field."""
    mech = _mech(k=7, m=13)
    server = CMSServer(mech)
    with pytest.raises(MalformedReportError) as info:
        server.decode_records(raw)
    assert info.value.reason == reason
    assert info.value.field == field


_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@given(_PLAIN)
def test_decoder_is_total(raw: object) -> None:
    """Any msgpack-shaped object either decodes into a well-formed batch or raises MalformedReportError."""
    mech = _mech(k=7, m=13)
    server = CMSServer(mech)
    try:
        batch = server.decode_records(raw)
    except MalformedReportError:
        return
    assert batch.bits.shape == (len(batch), 2)


@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.binary(min_size=2, max_size=2)).map(
            lambda t: [t[0], t[1][:1] + bytes([t[1][1] & 0xF8])]
        ),
        max_size=30,
    )
)
def test_any_well_formed_record_decodes(raw: list[list[Any]]) -> None:
    """Every in-range index with a zero-padded vector of the right length is accepted unchanged."""
    mech = _mech(k=7, m=13)
    server = CMSServer(mech)
    batch = server.decode_records(raw)
    assert batch.indices.tolist() == [r[0] for r in raw]
    assert [row.tobytes() for row in batch.bits] == [r[1] for r in raw]


# ------------------------------------------------------------ merge and restore


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 10**6), max_size=40), min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[int]]) -> None:
    """Aggregates are sums: any merge order gives the same aggregate, and it survives a plain round trip."""
    mech = _mech(k=8, m=13)
    server = CMSServer(mech)
    aggs = []
    for i, seeds in enumerate(parts):
        agg = server.new_aggregate()
        agg.add(server.privatize_many([f"v{s % 17}" for s in seeds], SeededRandom(i)))
        aggs.append(agg)
    a, b, c = aggs
    left = a.merge(b).merge(c).to_plain()
    right = a.merge(b.merge(c)).to_plain()
    assert left == right == c.merge(a).merge(b).to_plain()
    restored = CMSAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(left)))
    assert restored.to_plain() == left
    assert restored.n == sum(len(p) for p in parts)


def test_merge_refuses_another_mechanism() -> None:
    """Aggregates of different parameters cannot be merged."""
    with pytest.raises(ValueError, match="different"):
        CMSServer(_mech()).new_aggregate().merge(CMSServer(_mech(epsilon=3.0)).new_aggregate())


def _corrupt(plain: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in plain.items()}
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("n",), _DELETE),
        (("n",), "3"),
        (("n",), 4),
        (("ones",), _DELETE),
        (("ones",), [1, 2]),
        (("ones", "dtype"), "<i8"),
        (("ones", "shape"), [8, 14]),
        (("ones", "data"), b"\x00"),
        (("row_counts", "dtype"), "<u4"),
        (("row_counts", "data"), np.array([-1, 1, 1, 1, 1, 0, 0, 0], dtype="<i8").tobytes()),
        (("ones", "data"), np.full(8 * 13, 9, dtype="<u4").tobytes()),
    ],
)
def test_from_plain_refuses_malformed_state(path: tuple[str, ...], value: object, rng: SeededRandom) -> None:
    """A malformed or inconsistent saved aggregate raises StateError."""
    mech = _mech(k=8, m=13)
    server = CMSServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(["a", "b", "c"], rng))
    with pytest.raises(StateError):
        CMSAggregate.from_plain(mech, _corrupt(agg.to_plain(), path, value))
    with pytest.raises(StateError):
        CMSAggregate.from_plain(mech, [1, 2])
