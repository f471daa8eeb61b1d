"""Projective geometry response: its points, its sampler's geometry, and the reconstruction.

The Fourier reconstruction of every category's support count (protocol/server/pgr.py) is
checked against summing each hyperplane directly; the pure and vectorised point codecs
against each other; the default (q, t) against the variance it is chosen by.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocol.pgr import (
    BEYOND_TABLE_GAIN,
    DEFAULT_POINTS,
    ENUMERATION_WORK,
    WORK_CELLS,
    Geometry,
    ProjectiveGeometryResponse,
    choose_geometry,
    is_prime,
)
from protocol.randomness import SeededRandom
from protocol.server.pgr import PGRServer, canonical_index, hyperplane_sums, inverse_mod, points
from protocol.ss import SubsetSelection


def _mech(q: int, t: int, k: int | None = None, epsilon: float = 2.0) -> ProjectiveGeometryResponse:
    size = Geometry(q, t).points if k is None else k
    return ProjectiveGeometryResponse(epsilon=epsilon, categories=tuple(f"c{i}" for i in range(size)), q=q, t=t)


@pytest.mark.parametrize(("q", "t"), [(2, 2), (2, 4), (3, 3), (5, 3), (7, 2), (3, 5)])
def test_points_are_a_bijection_and_both_codecs_agree(q: int, t: int) -> None:
    """Every index maps to a canonical vector and back; numpy's points/canonical_index give the same."""
    mech = _mech(q, t)
    k = mech.geometry.points
    pure = [mech.point_of(i) for i in range(k)]
    assert len(set(pure)) == k
    assert all(v[next(j for j, x in enumerate(v) if x)] == 1 for v in pure)
    assert [mech.index_of_point(v) for v in pure] == list(range(k))
    vectors = points(np.arange(k, dtype=np.int64), q, t)
    assert [tuple(r) for r in vectors.tolist()] == pure
    # A multiple of a canonical vector names the same point.
    assert canonical_index(vectors * (q - 1), q, t).tolist() == list(range(k))


@pytest.mark.parametrize(("q", "t"), [(2, 3), (3, 3), (5, 3), (3, 4), (2, 5), (7, 2), (11, 3)])
def test_fourier_reconstruction_equals_summing_each_hyperplane(q: int, t: int) -> None:
    """C_v from the transform equals Σ_{u on v's hyperplane} H[u] for every category, for a random histogram."""
    mech = _mech(q, t)
    server = PGRServer(mech)
    k = mech.geometry.points
    hist = np.random.default_rng(q * 100 + t).integers(0, 1000, size=k).astype(np.int64)
    got = server.support_counts(hist, int(hist.sum()))
    vectors = points(np.arange(k, dtype=np.int64), q, t)
    on = (vectors @ vectors.T) % q == 0
    want = (on * hist[None, :]).sum(axis=1)
    np.testing.assert_array_equal(got, want)
    assert np.all(on.sum(axis=1) == mech.geometry.h)


@pytest.mark.parametrize(("q", "t"), [(2, 2), (2, 3), (3, 3), (5, 3), (3, 4), (2, 5), (11, 3), (5, 4), (3, 5)])
def test_hyperplane_sums_equal_summing_each_hyperplane(q: int, t: int) -> None:
    """The enumeration past the table gives every category's C_v exactly, whatever v's last non-zero coordinate."""
    k = Geometry(q, t).points
    hist = np.random.default_rng(q * 10 + t).integers(0, 1000, size=k).astype(np.int64)
    vectors = points(np.arange(k, dtype=np.int64), q, t)
    want = (((vectors @ vectors.T) % q == 0) * hist[None, :]).sum(axis=1)
    np.testing.assert_array_equal(hyperplane_sums(hist, vectors, q, t), want)
    # Categories in any order and any subset.
    pick = np.random.default_rng(t).permutation(k)[: max(1, k // 3)]
    np.testing.assert_array_equal(hyperplane_sums(hist, vectors[pick], q, t), want[pick])


def test_a_geometry_past_the_table_is_summed_hyperplane_by_hyperplane() -> None:
    """k = 65,536 at ε = 8: q = 2,039, t = 3 (q**3 far past any table), and its counts are the direct sums."""
    mech = ProjectiveGeometryResponse(epsilon=8.0, categories=tuple(f"c{i}" for i in range(65_536)))
    g = mech.geometry
    assert (mech.q, mech.t, mech.reconstruction) == (2_039, 3, "enumeration")
    assert g.points <= DEFAULT_POINTS
    assert g.enumeration_work(mech.k) <= ENUMERATION_WORK
    server = PGRServer(mech)
    hist = np.zeros(g.points, dtype=np.int64)
    rng = np.random.default_rng(8)
    hist[rng.integers(0, g.points, size=5_000)] += 1
    got = server.support_counts(hist, int(hist.sum()))
    check = rng.choice(mech.k, size=40, replace=False)
    every = points(np.arange(g.points, dtype=np.int64), mech.q, mech.t)
    for c in check.tolist():
        on = (every @ server.category_vectors[c]) % mech.q == 0
        assert int(got[c]) == int(hist[on].sum())


def test_reported_points_lie_where_the_coin_says() -> None:
    """On the hyperplane when the coin says so, off it otherwise, and uniform within each."""
    mech = _mech(3, 3)
    v = mech.point_of(4)
    g = mech.geometry
    on_counts: dict[int, int] = {}
    off_counts: dict[int, int] = {}
    rng = SeededRandom(5)
    for _ in range(6_000):
        for on, counts in ((True, on_counts), (False, off_counts)):
            u = mech.reported_point(v, on, rng.draw(1)[0], rng)
            counts[u] = counts.get(u, 0) + 1
    dot = {i: sum(a * b for a, b in zip(mech.point_of(i), v, strict=True)) % 3 for i in range(g.points)}
    assert all(dot[u] == 0 for u in on_counts)
    assert len(on_counts) == g.h
    assert all(dot[u] != 0 for u in off_counts)
    assert len(off_counts) == g.points - g.h
    for counts, size in ((on_counts, g.h), (off_counts, g.points - g.h)):
        p = 1 / size
        for c in counts.values():
            assert abs(c / 6_000 - p) <= 5 * math.sqrt(p * (1 - p) / 6_000)


def test_the_default_geometry_is_the_least_variance_within_the_table() -> None:
    """choose_geometry's (q, t) has no larger variance than any other qualifying (q, t), and t = 2 is k-RR."""
    for k, eps in ((8, 1.0), (843, 4.0), (843, 1.0), (65_536, 4.0), (843, 8.0)):
        best = choose_geometry(k, eps)
        assert best.points >= k
        assert best.t == 2 or best.q**best.t <= WORK_CELLS
        for t in range(3, 8):
            for q in (p for p in range(2, 300) if is_prime(p) and p**t <= WORK_CELLS):
                g = Geometry(q, t)
                if g.points >= k:
                    assert best.variance(eps) <= g.variance(eps) * (1 + 1e-12), (k, eps, q, t)
    rr = Geometry(7, 2)
    assert (rr.points, rr.h, rr.h2) == (8, 1, 0)


@pytest.mark.parametrize(("k", "epsilon"), [(65_536, 8.0), (65_536, 6.0), (20_000, 7.0)])
def test_past_the_table_the_default_is_the_least_variance_and_far_better(k: int, epsilon: float) -> None:
    """Where the table keeps q far below e^ε + 1, the default is the least-variance geometry within the
    points and work limits, and it beats the table's best by more than BEYOND_TABLE_GAIN."""
    best = choose_geometry(k, epsilon)
    assert best.t >= 3
    assert best.table_cells > WORK_CELLS
    assert best.points <= DEFAULT_POINTS
    assert best.enumeration_work(k) <= ENUMERATION_WORK
    within = [
        Geometry(q, t)
        for t in range(3, 6)
        for q in range(2, 2_100)
        if is_prime(q) and q**t <= WORK_CELLS and Geometry(q, t).points >= k
    ]
    table_best = min([Geometry(_rr_field(k), 2), *within], key=lambda g: g.variance(epsilon))
    assert best.variance(epsilon) < BEYOND_TABLE_GAIN * table_best.variance(epsilon)
    for t in (3, 4, 5):
        for q in (p for p in range(2, 2_100) if is_prime(p)):
            g = Geometry(q, t)
            past = g.table_cells > WORK_CELLS and g.enumeration_work(k) <= ENUMERATION_WORK
            if past and k <= g.points <= DEFAULT_POINTS:
                assert best.variance(epsilon) <= g.variance(epsilon) * (1 + 1e-12), (q, t)


def _rr_field(k: int) -> int:
    q = max(2, k - 1)
    while not is_prime(q):
        q += 1
    return q


@pytest.mark.parametrize(
    ("k", "epsilon"), [(843, 4.0), (843, 2.0), (843, 8.0), (65_536, 4.0), (65_536, 2.0), (65_536, 8.0)]
)
def test_the_error_matches_subset_selection(k: int, epsilon: float) -> None:
    """With q near e^ε + 1 (in a table or past it), PGR's unheld-count variance is within 10 % of subset selection's."""
    cats = tuple(f"c{i}" for i in range(k))
    a, b = ProjectiveGeometryResponse(epsilon=epsilon, categories=cats).support_probabilities
    s_a, s_b = SubsetSelection(epsilon=epsilon, categories=cats).support_probabilities
    pgr = b * (1 - b) / (a - b) ** 2
    ss = s_b * (1 - s_b) / (s_a - s_b) ** 2
    assert pgr <= 1.10 * ss, (pgr, ss)


def test_the_inverse_mod_q_is_fermats_at_any_field_size() -> None:
    """inverse_mod gives x * x^-1 = 1 in F_q for small and 2^31-sized primes, without a table of q entries."""
    for q in (2, 3, 53, 65_537, 2_147_483_647):
        x = np.array(sorted({1, q - 1, max(1, q // 2), max(1, q // 3)}), dtype=np.int64)
        assert np.all((inverse_mod(x, q) * x) % q == 1)


@pytest.mark.parametrize(("q", "t"), [(65_537, 2), (0, 0)])
def test_a_geometry_over_a_large_field_privatizes_in_bulk(q: int, t: int) -> None:
    """t = 2 over q = 65,537, and the default at k = 65,536, ε = 8 (q = 2,039, t = 3): the bulk path is the device's."""
    mech = ProjectiveGeometryResponse(epsilon=8.0, categories=tuple(f"c{i}" for i in range(65_536)), q=q, t=t)
    values = [f"c{i * 101 % 65_536}" for i in range(200)]
    device, bulk = SeededRandom(3), SeededRandom(3)
    assert [mech.privatize(v, None, device)[0] for v in values] == PGRServer(mech).privatize_records(values, bulk)
