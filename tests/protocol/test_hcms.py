"""Hadamard Count Mean Sketch: exact ε, the transform, unbiased counts with honest standard errors."""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.hcms import HadamardCountMeanSketch, HCMSRecord
from protocol.randomness import SeededRandom
from protocol.server.hadamard import hadamard_rows, sylvester
from protocol.server.hashing import Fingerprints, family_fingerprints
from protocol.server.hcms import HCMSAggregate, HCMSBatch, HCMSServer
from protocol.server.parallel import Threads
from tests.protocol.ldp import assert_tight_ldp
from tests.protocol.sketch_coins import EdgeRandom, hcms_record

SEED = b"tests/hcms/public-seed"
UNIVERSE: list[str | bytes] = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", b"\x00\xff", ""]


def small(epsilon: float = 1.0, k: int = 3, m: int = 8) -> HadamardCountMeanSketch:
    return HadamardCountMeanSketch(epsilon=epsilon, k=k, m=m, seed=SEED)


def random_batch(mech: HadamardCountMeanSketch, size: int, rng: SeededRandom) -> HCMSBatch:
    return HCMSBatch(
        j=(rng.words(size) % np.uint64(mech.k)).astype(np.int64),
        ell=(rng.words(size) % np.uint64(mech.m)).astype(np.int64),
        bits=(rng.words(size) & np.uint64(1)).astype(np.uint8),
    )


def reference_fwht(table: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Textbook radix-2 butterflies, one stage at a time (the check for large m)."""
    out = np.array(table, dtype=np.float64)
    k, m = out.shape
    h = 1
    while h < m:
        v = out.reshape(k, m // (2 * h), 2, h)
        lo, hi = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :] = lo + hi
        v[:, :, 1, :] = lo - hi
        h *= 2
    return out


# ------------------------------------------------------------------------ privacy


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, math.log(3), 4.0, 8.0])
def test_exact_ldp_is_tight(epsilon: float) -> None:
    """Over a small universe the implemented coins leak at most ε and exactly ε (003 Thm 4.3)."""
    mech = small(epsilon)
    assert_tight_ldp([mech.output_distribution(v) for v in UNIVERSE], epsilon)
    assert mech.epsilon_report <= epsilon + 1e-12
    assert mech.epsilon_report == pytest.approx(epsilon, rel=1e-12)


def test_bound_is_reached_exactly_where_hadamard_entries_differ() -> None:
    """Pr[o | d] / Pr[o | d'] is p/(1-p) where H[ℓ, h_j(d)] != H[ℓ, h_j(d')] and 1 elsewhere."""
    mech = small(2.0)
    p = mech.keep_coin.probability
    hmat = sylvester(mech.m)
    dists = {v: mech.output_distribution(v) for v in UNIVERSE}
    hashes = {v: [mech.family.evaluate_value(v, j) for j in range(mech.k)] for v in UNIVERSE}
    reached = 0
    for d in UNIVERSE:
        for d2 in UNIVERSE:
            for (j, ell, bit), prob in dists[d].items():
                ratio = prob / dists[d2][(j, ell, bit)]
                differ = hmat[ell, hashes[d][j]] != hmat[ell, hashes[d2][j]]
                if differ:
                    assert ratio in (p / (1 - p), (1 - p) / p)
                    reached += 1
                else:
                    assert ratio == 1
    assert reached > 0


def test_output_distribution_puts_the_likely_bit_on_the_hadamard_entry() -> None:
    """The more likely bit of (j, ℓ) is 1 exactly when (H_m e_{h_j(d)})_ℓ = +1 (003 Alg. 6 step 4)."""
    mech = small(1.0, k=4, m=16)
    hmat = sylvester(mech.m)
    for v in UNIVERSE:
        dist = mech.output_distribution(v)
        assert sum(dist.values()) == 1
        for j in range(mech.k):
            column = hmat[:, mech.family.evaluate_value(v, j)]
            for ell in range(mech.m):
                likely = 1 if dist[(j, ell, 1)] > dist[(j, ell, 0)] else 0
                assert likely == (1 if column[ell] > 0 else 0)


@pytest.mark.parametrize("path", ["single", "batch"])
def test_reports_carry_the_hadamard_entry_when_coins_never_flip(path: str, rng: SeededRandom) -> None:
    """At ε = 64 (b = -1 has probability 2**-64) every report's bit is (H_m e_{h_j(d)})_ℓ, for both paths."""
    mech = HadamardCountMeanSketch(epsilon=64.0, k=37, m=64, seed=SEED)
    server = HCMSServer(mech)
    hmat = sylvester(mech.m)
    values: list[str | bytes] = [f"value-{i}" for i in range(500)]
    values += [b"raw-bytes", "\u00e9t\u00e9"]
    if path == "single":
        records = [mech.privatize(v, None, rng)[0] for v in values]
    else:
        b = server.privatize_many(values, rng)
        records = [HCMSRecord(int(j), int(e), int(x)) for j, e, x in zip(b.j, b.ell, b.bits, strict=True)]
    for v, rec in zip(values, records, strict=True):
        h = mech.family.evaluate_value(v, rec.j)
        assert rec.bit == (1 if hmat[rec.ell, h] > 0 else 0)


@pytest.mark.parametrize("path", ["single", "batch"])
def test_paths_sample_the_exact_output_distribution(path: str, rng: SeededRandom) -> None:
    """privatize and privatize_many hit every (j, ℓ, bit) at its exact probability (5 SE per cell)."""
    mech = small(1.0, k=3, m=8)
    server = HCMSServer(mech)
    value = "gamma"
    draws = 24_000
    if path == "single":
        recs = [mech.privatize(value, None, rng)[0] for _ in range(draws)]
        b = server.batch(recs)
    else:
        b = server.privatize_many([value] * draws, rng)
    counts: dict[tuple[int, int, int], int] = {}
    for key in zip(b.j.tolist(), b.ell.tolist(), b.bits.tolist(), strict=True):
        counts[key] = counts.get(key, 0) + 1
    dist = mech.output_distribution(value)
    assert set(counts) <= set(dist)
    for key, prob in dist.items():
        q = float(prob)
        assert abs(counts.get(key, 0) - draws * q) <= 5 * math.sqrt(draws * q * (1 - q))


# ----------------------------------------------------------------- the transform


@pytest.mark.parametrize(("k", "m"), [(1, 2), (3, 8), (5, 2), (16, 64), (1024, 32_768)])
def test_pure_privatize_is_the_numpy_path_record_for_record(k: int, m: int) -> None:
    """Seeded and edge coins (rejected indices, a word on the keep threshold): the pure device path
    gives the numpy path's records, record for record, and leaves the stream where it did. (The
    server half's privatize_many draws its coins column by column over many values instead.)"""
    mech = HadamardCountMeanSketch(epsilon=1.0, k=k, m=m, seed=SEED)
    edges = [(1 << 64) - 1, mech.keep_coin.numerator, 0]
    for seed in range(30):
        pairs: list[tuple[SeededRandom | EdgeRandom, SeededRandom | EdgeRandom]] = [
            (SeededRandom(seed), SeededRandom(seed)),
            (EdgeRandom(seed, edges), EdgeRandom(seed, edges)),
        ]
        for pure, numpy_path in pairs:
            for value in UNIVERSE:
                assert mech.privatize(value, None, pure)[0] == hcms_record(mech, value, numpy_path)
            assert pure.draw(1) == numpy_path.draw(1)


def test_sylvester_follows_the_recursion_and_is_orthogonal() -> None:
    """sylvester(m) is 003 eq. (3), symmetric, and H_m H_m = m I."""
    assert np.array_equal(sylvester(1), [[1.0]])
    for m in [2, 4, 8, 16, 64, 256, 1024]:
        h = sylvester(m)
        half = sylvester(m // 2)
        assert np.array_equal(h, np.block([[half, half], [half, -half]]))
        assert np.array_equal(h, h.T)
        assert np.array_equal(h @ h, m * np.eye(m))
    with pytest.raises(ValueError, match="power of two"):
        sylvester(12)


@pytest.mark.parametrize("m", [2, 4, 8, 16, 32, 64, 128, 512, 1024, 2048, 8192])
def test_fwht_equals_the_explicit_sylvester_product(m: int) -> None:
    """hadamard_rows(s) is exactly s @ H_m (integer inputs stay exact) and returns Σ s**2."""
    gen = np.random.default_rng(m)
    table = gen.integers(-1000, 1001, size=(5, m)).astype(np.int32)
    out, sum_sq = hadamard_rows(table)
    assert out.dtype == np.float64
    assert np.array_equal(out, table.astype(np.float64) @ sylvester(m))
    assert sum_sq == float((table.astype(np.int64) ** 2).sum())


def test_fwht_threaded_path_matches_butterflies() -> None:
    """A 64 x 16,384 table's blocked transform, alone or split over the caller's threads, is radix-2 butterflies."""
    gen = np.random.default_rng(5)
    table = gen.integers(-50, 51, size=(64, 16_384)).astype(np.int64)
    expected = reference_fwht(table.astype(np.float64))
    with ThreadPoolExecutor(max_workers=2) as pool:
        for threads in (None, Threads(pool, 1), Threads(pool, 2)):
            out, _ = hadamard_rows(table, threads=threads)
            assert np.array_equal(out, expected)
    back, _ = hadamard_rows(expected[:3])
    assert np.array_equal(back, 16_384 * table[:3])  # H H = m I on the rows


def test_sketch_and_estimate_follow_algorithms_7_and_4(rng: SeededRandom) -> None:
    """sketch_matrix() is Alg. 7 built densely, and estimate() is Alg. 4 applied to it."""
    mech = small(1.5, k=5, m=16)
    server = HCMSServer(mech)
    batch = server.privatize_many([UNIVERSE[i % 3] for i in range(400)], rng)
    agg = server.new_aggregate()
    agg.add(batch)
    k, m, c = mech.k, mech.m, server.c_epsilon
    dense = np.zeros((k, m))
    for j, ell, bit in zip(batch.j, batch.ell, batch.bits, strict=True):
        dense[j, ell] += k * c * (1 if bit else -1)  # Alg. 7 step 2-5
    dense = dense @ sylvester(m).T  # step 6
    np.testing.assert_allclose(agg.sketch_matrix(), dense, rtol=1e-12, atol=1e-9)
    est = agg.estimate(UNIVERSE)
    for i, v in enumerate(UNIVERSE):
        gathered = sum(dense[j, mech.family.evaluate_value(v, j)] for j in range(k))
        alg4 = (m / (m - 1)) * (gathered / k - len(batch) / m)
        assert est.values[i] == pytest.approx(alg4, rel=1e-12, abs=1e-9)


# ----------------------------------------------------------- mean and variance


def test_per_record_moments_are_exact() -> None:
    """For fixed hashes, X = c_ε w̃ H[ℓ, h_j(d)] has E[X] = (1/k) Σ_j 1{h_j(d) = h_j(d_i)} and E[X**2] = c_ε**2.

    These two identities give Var[Z | hashes] = Σ_i (c_ε**2 - μ_i**2) and, averaged over the hash
    family, the last line before the bound in 003 App. B (HadamardCountMeanSketch.variance).
    """
    mech = small(1.0, k=3, m=8)
    p = mech.keep_coin.probability
    c = 1 / (2 * p - 1)
    hmat = sylvester(mech.m).astype(int)
    hashes = {v: [mech.family.evaluate_value(v, j) for j in range(mech.k)] for v in UNIVERSE}
    for d in UNIVERSE:
        for di in UNIVERSE:
            mean = Fraction(0)
            second = Fraction(0)
            for (j, ell, bit), prob in mech.output_distribution(di).items():
                x = c * (1 if bit else -1) * int(hmat[ell, hashes[d][j]])
                mean += prob * x
                second += prob * x * x
            mu = Fraction(sum(hashes[d][j] == hashes[di][j] for j in range(mech.k)), mech.k)
            assert mean == mu
            assert second == c * c


def test_exact_variance_never_exceeds_theorem_4_4() -> None:
    """App. B's exact variance is at most Thm 4.4's bound, and meets it when f(d) = 0 and k m is large."""
    for epsilon in (0.5, 2.0, 4.0, 8.0):
        for k, m in ((1, 2), (3, 8), (64, 512), (1024, 32_768)):
            mech = HadamardCountMeanSketch(epsilon=epsilon, k=k, m=m, seed=SEED)
            server = HCMSServer(mech)
            for n in (1.0, 1e3, 1e6, 1e9):
                for share in (0.0, 0.01, 0.5, 1.0):
                    f = share * n
                    for others in (0.0, (n - f) ** 2 / 100, (n - f) ** 2):
                        exact = server.variance(n=n, count=f, others_sum_sq=others)
                        bound = server.variance_bound(n=n, sum_sq=others + f * f)
                        assert 0 <= exact <= bound * (1 + 1e-12)
    mech = HadamardCountMeanSketch(epsilon=4.0, k=1024, m=32_768, seed=SEED)
    server = HCMSServer(mech)
    n = 1e8
    assert server.variance(n=n, count=0.0, others_sum_sq=1e14) == pytest.approx(
        server.variance_bound(n=n, sum_sq=1e14), rel=1e-3
    )


def zipf_counts(n: int, universe: int, s: float) -> npt.NDArray[np.int64]:
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -s
    counts: npt.NDArray[np.int64] = np.floor(weights / weights.sum() * n).astype(np.int64)
    counts[0] += n - int(counts.sum())
    return counts


@pytest.mark.slow
def test_unbiased_with_honest_standard_error() -> None:
    """Zipf(1.2), n = 10^5, 600 hash seeds: estimates within 5 SE, unbiased, SE within 15% of the spread.

    The seed is redrawn each repetition because 003's mean and variance are over the hash
    family: with one seed a value's collisions are a fixed offset, part of the reported
    error through the Σ f(d')**2 / (k m) term. The same loop checks that the sketch's
    second-moment estimate (the plug-in for Σ f(d')**2) is unbiased. k = 128, m = 256 makes
    that term ~18% of the variance while a collision with the top value (23% of n) moves an
    estimate by only f/k ≈ 0.5 SE, so the error stays close to normal.
    """
    n, universe, reps = 100_000, 1_000, 600
    counts = zipf_counts(n, universe, 1.2)
    names = [f"site-{i}.example" for i in range(universe)]
    codes = np.repeat(np.arange(universe), counts)
    ranks = [0, 1, 2, 3, 5, 10, 30, 100, 300, 999]
    dictionary = [names[r] for r in ranks] + [f"absent-{i}.example" for i in range(5)]
    truth = np.array([counts[r] for r in ranks] + [0] * 5, dtype=np.float64)
    f2 = float((counts.astype(np.float64) ** 2).sum())
    rng = SeededRandom(44)
    estimates = np.empty((reps, len(dictionary)))
    ses = np.empty_like(estimates)
    moments = np.empty(reps)
    for r in range(reps):
        seed = hashlib.blake2b(r.to_bytes(4, "little"), digest_size=16, person=b"hcms-test").digest()
        mech = HadamardCountMeanSketch(epsilon=4.0, k=128, m=256, seed=seed)
        server = HCMSServer(mech)
        fp = family_fingerprints(mech.family, names)
        agg = server.new_aggregate()
        agg.add(server.privatize_fingerprints(Fingerprints(lo=fp.lo[codes], hi=fp.hi[codes]), rng))
        est = agg.estimate(dictionary)
        estimates[r] = est.values
        ses[r] = est.standard_errors
        moments[r] = agg.second_moment()
    assert np.all(np.abs(estimates - truth) <= 5 * ses)
    spread = estimates.std(axis=0, ddof=1)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= 5 * spread / math.sqrt(reps))
    assert np.all(np.abs(ses.mean(axis=0) / spread - 1) < 0.15)
    pooled = math.sqrt(float((ses**2).mean()) / float((spread**2).mean()))
    assert abs(pooled - 1) < 0.05
    exact = np.sqrt([server.variance(n=n, count=t, others_sum_sq=f2 - t * t) for t in truth])
    assert np.all(np.abs(exact / spread - 1) < 0.15)
    assert exact[0] < 0.9 * math.sqrt(server.variance_bound(n=n, sum_sq=f2))  # Thm 4.4 overstates the top value
    assert abs(moments.mean() - f2) <= 5 * moments.std(ddof=1) / math.sqrt(reps)


def test_second_moment_of_an_exact_table(rng: SeededRandom) -> None:
    """second_moment() applies Ĝ = n + k m c_ε**2 (Σ s**2 - n) and F2 = (Ĝ - n**2/m) / (1 - 1/m), clipped."""
    mech = small(2.0, k=4, m=32)
    server = HCMSServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(["alpha"] * 3000 + ["beta"] * 1000, rng))
    s = agg.sums.astype(np.int64)
    n, k, m, c = agg.n, mech.k, mech.m, server.c_epsilon
    g = n + k * m * c * c * (float((s * s).sum()) - n)
    expected = min(max((g - n * n / m) / (1 - 1 / m), 0.0), float(n * n))
    assert agg.second_moment() == pytest.approx(expected, rel=1e-12)
    assert server.new_aggregate().second_moment() == 0.0


# ------------------------------------------------------------------- aggregate


def test_large_batch_counting_path_equals_scatter_add(rng: SeededRandom) -> None:
    """A batch larger than the table (bincount path) gives the same sums as small batches (np.add.at)."""
    mech = small(1.0, k=4, m=16)
    server = HCMSServer(mech)
    batch = random_batch(mech, 1000, rng)
    whole = server.new_aggregate()
    whole.add(batch)
    pieces = server.new_aggregate()
    for start in range(0, 1000, 10):
        pieces.add(
            HCMSBatch(batch.j[start : start + 10], batch.ell[start : start + 10], batch.bits[start : start + 10])
        )
    assert whole.n == pieces.n == 1000
    assert np.array_equal(whole.sums, pieces.sums)
    signs = np.where(batch.bits == 1, 1, -1)
    dense = np.zeros((mech.k, mech.m), dtype=np.int64)
    for j, ell, w in zip(batch.j, batch.ell, signs, strict=True):
        dense[j, ell] += w
    assert np.array_equal(whole.sums, dense)


def test_add_refuses_out_of_range_batches() -> None:
    """A batch with an index outside the sketch never reaches the sums."""
    mech = small()
    server = HCMSServer(mech)
    agg = server.new_aggregate()
    one = np.array([0], dtype=np.int64)
    for bad in (
        HCMSBatch(np.array([3]), one, np.array([1], dtype=np.uint8)),
        HCMSBatch(one, np.array([-1]), np.array([1], dtype=np.uint8)),
        HCMSBatch(one, one, np.array([2], dtype=np.uint8)),
    ):
        with pytest.raises(ValueError, match="out of range"):
            agg.add(bad)
    assert agg.n == 0
    assert not agg.sums.any()


def test_sums_widen_before_int32_could_overflow() -> None:
    """Sums are int32 while n < 2**31 and become int64 before n passes it, surviving merge and plain form."""
    mech = small()
    server = HCMSServer(mech)
    limit = 2**31 - 1
    agg = HCMSAggregate(mech, n=limit - 1)
    assert agg.sums.dtype == np.int32
    agg.add(HCMSBatch(np.array([0, 0, 1]), np.array([2, 2, 3]), np.array([1, 1, 0], dtype=np.uint8)))
    assert agg.sums.dtype == np.int64
    assert agg.n == limit + 2
    assert agg.sums[0, 2] == 2
    assert agg.sums[1, 3] == -1
    merged = agg.merge(HCMSAggregate(mech, n=4))
    assert merged.sums.dtype == np.int64
    restored = HCMSAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(merged.to_plain())))
    assert restored.n == merged.n
    assert np.array_equal(restored.sums, merged.sums)
    restored_plain: Any = restored.to_plain()
    empty_plain: Any = server.new_aggregate().to_plain()
    assert restored_plain["sums"]["dtype"] == "<i8"
    assert empty_plain["sums"]["dtype"] == "<i4"


def test_transform_cache_is_dropped_on_add(rng: SeededRandom) -> None:
    """The transformed sketch is reused between queries and rebuilt after new records arrive."""
    mech = small(1.0, k=4, m=16)
    server = HCMSServer(mech)
    agg = server.new_aggregate()
    agg.add(random_batch(mech, 50, rng))
    first = agg.transformed()
    assert np.shares_memory(agg.transformed(), first)
    agg.add(random_batch(mech, 50, rng))
    assert not np.shares_memory(agg.transformed(), first)
    assert np.array_equal(agg.transformed(), agg.sums.astype(np.float64) @ sylvester(mech.m))


def test_empty_aggregate_estimates_nan() -> None:
    """With no reports there is no estimate."""
    est = HCMSServer(small()).new_aggregate().estimate(["alpha", "beta"])
    assert est.n == 0
    assert np.isnan(est.values).all()
    assert np.isnan(est.standard_errors).all()


def test_merge_refuses_other_mechanisms() -> None:
    """Aggregates of different parameters never mix."""
    with pytest.raises(ValueError, match="different mechanisms"):
        HCMSServer(small(1.0)).new_aggregate().merge(HCMSServer(small(2.0)).new_aggregate())


batches = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7), st.integers(0, 1)), max_size=40)


@given(st.lists(batches, min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[tuple[int, int, int]]]) -> None:
    """Aggregates are sums: any merge order gives the same aggregate, and the plain form round-trips."""
    mech = small()
    server = HCMSServer(mech)
    aggs = []
    for records in parts:
        agg = server.new_aggregate()
        agg.add(server.batch([HCMSRecord(*r) for r in records]))
        aggs.append(agg)
    a, b, c = aggs
    left = a.merge(b).merge(c).to_plain()
    right = a.merge(b.merge(c)).to_plain()
    assert left == right == c.merge(a).merge(b).to_plain()
    restored = HCMSAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(left)))
    assert restored.to_plain() == left
    assert restored.n == sum(len(p) for p in parts)


def test_from_plain_refuses_impossible_state() -> None:
    """Saved aggregates with a wrong shape, dtype, count or sums no reports can produce raise StateError."""
    mech = small()
    server = HCMSServer(mech)
    good: Any = server.new_aggregate().to_plain()
    sums = np.zeros((3, 8), dtype=np.int32)
    sums[0, 0] = 3

    def with_sums(a: npt.NDArray[Any], n: int) -> dict[str, Any]:
        return {"n": n, "sums": {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}}

    bad: list[object] = [
        None,
        [],
        {"sums": good["sums"]},
        {"n": -1, "sums": good["sums"]},
        {"n": True, "sums": good["sums"]},
        {"n": 0, "sums": []},
        with_sums(np.zeros((3, 4), dtype=np.int32), 0),
        with_sums(np.zeros((3, 8), dtype=np.int64), 0),
        with_sums(sums, 2),  # Σ|s| > n
        with_sums(sums, 4),  # parity: Σ s and n differ mod 2
        with_sums(np.full((3, 8), -(2**31), dtype=np.int32), 2**31 - 1),
        {"n": 0, "sums": {**good["sums"], "data": b"\x00"}},
    ]
    for data in bad:
        with pytest.raises(StateError):
            HCMSAggregate.from_plain(mech, data)
    assert HCMSAggregate.from_plain(mech, with_sums(sums, 5)).sums[0, 0] == 3


# ------------------------------------------------------------------- wire form


records = st.lists(st.builds(HCMSRecord, st.integers(0, 2), st.integers(0, 7), st.integers(0, 1)), max_size=30)


@given(records)
def test_wire_round_trip(recs: list[HCMSRecord]) -> None:
    """encode_records -> msgpack -> decode_records gives back the batch of the records."""
    mech = small()
    server = HCMSServer(mech)
    raw = msgpack.unpackb(msgpack.packb(mech.encode_records(recs)))
    got = server.decode_records(raw)
    want = server.batch(recs)
    assert np.array_equal(got.j, want.j)
    assert np.array_equal(got.ell, want.ell)
    assert np.array_equal(got.bits, want.bits)


def test_wire_record_is_a_few_bytes() -> None:
    """At the Safari parameters one record packs into at most 8 msgpack bytes."""
    mech = HadamardCountMeanSketch(epsilon=4.0, k=1024, m=32_768, seed=SEED)
    assert len(msgpack.packb(mech.encode_records([HCMSRecord(1023, 32_767, 1)])[0])) <= 8


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        ({"j": 0}, "bad-type", "records"),
        ((0, 1, 1), "bad-type", "records"),
        ([5], "bad-type", "records[0]"),
        ([[0, 1, 1], (0, 1, 1)], "bad-type", "records[1]"),
        ([[0, 1]], "bad-length", "records[0]"),
        ([[0, 1, 1, 0]], "bad-length", "records[0]"),
        ([[True, 1, 1]], "bad-type", "records[0].j"),
        ([[0, 1.0, 1]], "bad-type", "records[0].ell"),
        ([[0, 1, "1"]], "bad-type", "records[0].bit"),
        ([[0, 1, None]], "bad-type", "records[0].bit"),
        ([[3, 1, 1]], "out-of-range", "records[0].j"),
        ([[-1, 1, 1]], "out-of-range", "records[0].j"),
        ([[0, 8, 1]], "out-of-range", "records[0].ell"),
        ([[0, 2**70, 1]], "out-of-range", "records[0].ell"),
        ([[0, 1, 2]], "out-of-range", "records[0].bit"),
    ],
)
def test_strict_decode_names_reason_and_field(raw: object, reason: str, field: str) -> None:
    """Each kind of malformed record is refused with its reason and the offending field."""
    with pytest.raises(MalformedReportError) as info:
        HCMSServer(small()).decode_records(raw)
    assert info.value.reason == reason
    assert info.value.field == field


msgpack_objects = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300)
@given(msgpack_objects)
def test_decode_is_total(raw: object) -> None:
    """Any object msgpack can produce either decodes to an in-range batch or raises MalformedReportError."""
    mech = small()
    server = HCMSServer(mech)
    try:
        batch = server.decode_records(raw)
    except MalformedReportError:
        return
    assert ((batch.j >= 0) & (batch.j < mech.k)).all()
    assert ((batch.ell >= 0) & (batch.ell < mech.m)).all()
    assert (batch.bits <= 1).all()


# ------------------------------------------------------------ parameters, inputs


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"epsilon": 65.0}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"k": 0}, "k"),
        ({"k": 2.0}, "k"),
        ({"k": True}, "k"),
        ({"m": 1}, "m"),
        ({"m": 1000}, "m"),
        ({"m": 0}, "m"),
        ({"m": 2**33}, "m"),
        ({"m": 8.0}, "m"),
        ({"m": True}, "m"),
        ({"seed": b"short"}, "seed"),
        ({"seed": "a text seed of 16+ chars"}, "seed"),
    ],
)
def test_bad_parameters_name_the_parameter(kwargs: dict[str, object], name: str) -> None:
    """Each invalid parameter is refused with a ParameterError naming it."""
    params: dict[str, object] = {"epsilon": 1.0, "k": 3, "m": 8, "seed": SEED, **kwargs}
    with pytest.raises(ParameterError) as info:
        HadamardCountMeanSketch(**params)  # type: ignore[arg-type]
    assert info.value.name == name


def test_m_error_says_power_of_two() -> None:
    """The message for m says HCMS needs a power of two."""
    with pytest.raises(ParameterError, match=r"'m'.*power of two.*HCMS"):
        HadamardCountMeanSketch(epsilon=1.0, k=3, m=12, seed=SEED)


def test_bad_values_are_refused(rng: SeededRandom) -> None:
    """Only str and bytes can be privatized or queried."""
    mech = small()
    server = HCMSServer(mech)
    for bad in (3, None, 1.5, ["a"], bytearray(b"a")):
        with pytest.raises(InputError):
            mech.privatize(bad, None, rng)  # type: ignore[arg-type]
        with pytest.raises(InputError):
            server.privatize_many(["ok", bad], rng)  # type: ignore[list-item]
        with pytest.raises(InputError):
            server.new_aggregate().estimate(["ok", bad])  # type: ignore[list-item]


def test_no_permanent_state() -> None:
    """HCMS is event-level: setup draws no randomness and privatize keeps no state."""
    mech = small()
    rng, twin = SeededRandom(3), SeededRandom(3)
    mech.setup(rng)
    assert rng.words(4).tolist() == twin.words(4).tolist()
    record, state = mech.privatize("alpha", None, rng)
    assert state is None
    assert 0 <= record.j < mech.k
    assert 0 <= record.ell < mech.m
    assert mech.name == "hcms"
