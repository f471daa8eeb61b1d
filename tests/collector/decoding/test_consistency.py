"""Consistency post-processing: the exact weighted projection onto {x >= 0, Σx = t}."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from collector.decoding.consistency import make_consistent, project_simplex
from protocol.buckets import LinearBuckets
from protocol.dbitflip import DBitFlip
from protocol.randomness import SeededRandom
from protocol.server.buckets import buckets_of
from protocol.server.dbitflip import DBitFlipServer
from protocol.server.estimate import VectorEstimate

finite = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False)


def _reference(v: np.ndarray, total: float, w: np.ndarray) -> np.ndarray:
    """The same problem by SLSQP (slow, generic)."""
    res = minimize(
        lambda x: float(np.sum(w * (x - v) ** 2)),
        x0=np.full(v.size, total / v.size),
        jac=lambda x: 2 * w * (x - v),
        bounds=[(0, None)] * v.size,
        constraints=[{"type": "eq", "fun": lambda x: float(x.sum() - total), "jac": lambda x: np.ones(v.size)}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return np.asarray(res.x)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(finite, min_size=1, max_size=12),
    st.floats(min_value=0.0, max_value=200.0),
    st.integers(min_value=0, max_value=2**31),
)
def test_projection_solves_the_weighted_problem(values: list[float], total: float, seed: int) -> None:
    """Matches a generic constrained optimiser on the weighted objective."""
    v = np.array(values)
    w = np.random.default_rng(seed).uniform(0.2, 5.0, v.size)
    got = project_simplex(v, total, weights=w)
    ref = _reference(v, total, w)
    assert got.min() >= 0
    assert got.sum() == pytest.approx(total, abs=1e-9 * max(1.0, total))
    objective = float(np.sum(w * (got - v) ** 2))
    assert objective <= float(np.sum(w * (ref - v) ** 2)) + 1e-6 * max(1.0, objective)


@given(st.lists(finite, min_size=1, max_size=30), st.floats(min_value=0.0, max_value=100.0))
def test_projection_is_idempotent_and_never_moves_away_from_the_simplex(values: list[float], total: float) -> None:
    """Projecting twice changes nothing, and every consistent point gets no farther (convexity)."""
    v = np.array(values)
    x = project_simplex(v, total)
    assert np.allclose(project_simplex(x, total), x, atol=1e-9)
    point = np.full(v.size, total / v.size)
    assert np.linalg.norm(x - point) <= np.linalg.norm(v - point) + 1e-9


def test_at_most_only_clips_when_the_sum_is_already_small() -> None:
    """With Σ <= t allowed, a vector whose positive part fits is just clipped at 0."""
    assert project_simplex([3.0, -1.0, 2.0], 10.0, at_most=True).tolist() == [3.0, 0.0, 2.0]
    assert project_simplex([8.0, -1.0, 6.0], 10.0, at_most=True).sum() == pytest.approx(10.0)


def test_norm_sub_example() -> None:
    """Unit weights: negatives go to 0 and the positives share the excess equally (Norm-Sub)."""
    assert project_simplex([5.0, 3.0, -2.0, 1.0], 6.0).tolist() == pytest.approx([4.0, 2.0, 0.0, 0.0])


def test_bad_inputs() -> None:
    """A negative total or non-positive weights are refused."""
    with pytest.raises(ValueError, match="total"):
        project_simplex([1.0], -1.0)
    with pytest.raises(ValueError, match="weights"):
        project_simplex([1.0, 2.0], 1.0, weights=[1.0, 0.0])


def test_make_consistent_reports_raw_and_projected_with_bootstrap_errors() -> None:
    """The projection sits next to the raw estimate; its bootstrap SE is deterministic and not above the raw SE."""
    gen = np.random.default_rng(1)
    truth = np.array([0.5, 0.3, 0.2] + [0.0] * 13)
    se = np.full(truth.size, 0.02)
    raw = VectorEstimate(truth + gen.normal(0, 0.02, truth.size), se, 1000)
    a = make_consistent(raw, total=1.0)
    b = make_consistent(raw, total=1.0)
    assert a.raw is raw
    assert np.array_equal(a.standard_errors, b.standard_errors)
    assert a.values.sum() == pytest.approx(1.0)
    assert a.values.min() >= 0
    assert np.abs(a.values - truth).max() <= np.abs(raw.values - truth).max() + 1e-12
    assert (a.standard_errors <= se * 1.05).all()
    assert a.as_estimate().n == 1000


def test_projection_lowers_dbitflip_max_error() -> None:
    """A scaled-down 000 §5 histogram (k = 32, d = 4, ε = 1): the projection lowers the mean max error."""
    mech = DBitFlip(epsilon=1.0, buckets=LinearBuckets(low=0, high=86_400, count=32), d=4)
    server = DBitFlipServer(mech)
    rng, gen = SeededRandom(16), np.random.default_rng(16)
    raw_err, cons_err = [], []
    for _ in range(20):
        x = np.clip(gen.normal(43_200, 7_200, 20_000), 0, 86_399)
        truth = np.bincount(buckets_of(mech.buckets, x), minlength=32) / x.size
        agg = server.new_aggregate()
        agg.add(server.privatize_many(x, rng))
        est = agg.estimate()
        raw_err.append(np.abs(est.values - truth).max())
        cons_err.append(np.abs(make_consistent(est, total=1.0, draws=0).values - truth).max())
    assert np.mean(cons_err) < np.mean(raw_err)
