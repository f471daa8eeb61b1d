"""Binary randomized response: exact ε, unbiased estimate, honest standard error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import InputError, ParameterError
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import SeededRandom
from protocol.server.randomized_response import RRAggregate, RRBatch, RRServer
from tests.protocol.ldp import assert_tight_ldp


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, math.log(3), 4.0, 10.0])
def test_exact_ldp_is_tight(epsilon: float) -> None:
    """The implemented coins leak at most ε and exactly ε."""
    mech = RandomizedResponse(epsilon=epsilon)
    assert_tight_ldp([mech.output_distribution(0), mech.output_distribution(1)], epsilon)
    assert mech.epsilon_report <= epsilon + 1e-12


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, 65.0, True, "1"])
def test_bad_epsilon_names_the_parameter(bad: object) -> None:
    """ε outside (0, 64] is refused with the parameter's name and range."""
    with pytest.raises(ParameterError, match="epsilon"):
        RandomizedResponse(epsilon=bad)  # type: ignore[arg-type]


def test_bad_value_is_refused(rng: SeededRandom) -> None:
    """Only bits can be privatized."""
    mech = RandomizedResponse(epsilon=1.0)
    with pytest.raises(InputError):
        mech.privatize(2, None, rng)


def test_unbiased_with_honest_standard_error() -> None:
    """Seeded Monte Carlo, n = 10^5: estimates within 5 SE, reported SE within 15% of the spread."""
    mech = RandomizedResponse(epsilon=1.0)
    n, truth, reps = 100_000, 0.3, 200
    rng = SeededRandom(7)
    values = (np.arange(n) < truth * n).astype(np.uint8)
    estimates, ses = [], []
    for _ in range(reps):
        server = RRServer(mech)
        agg = server.new_aggregate()
        agg.add(server.privatize_many(values, rng))
        est = agg.estimate()
        assert abs(est.value - truth) <= 5 * est.standard_error
        estimates.append(est.value)
        ses.append(est.standard_error)
    spread = float(np.std(estimates, ddof=1))
    assert abs(float(np.mean(ses)) / spread - 1) < 0.15


def test_single_privatize_matches_batch_distribution(rng: SeededRandom) -> None:
    """privatize() keeps the bit with the keep probability (5 SE)."""
    mech = RandomizedResponse(epsilon=1.0)
    n = 20_000
    kept = sum(mech.privatize(1, None, rng)[0].bit for _ in range(n))
    p = mech.keep_probability
    assert abs(kept - n * p) <= 5 * math.sqrt(n * p * (1 - p))


@given(st.lists(st.lists(st.integers(0, 1), max_size=50), min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[int]]) -> None:
    """Aggregates are sums: any merge order gives the same aggregate."""
    mech = RandomizedResponse(epsilon=2.0)
    aggs = []
    for bits in parts:
        agg = RRServer(mech).new_aggregate()
        agg.add(RRBatch(np.array(bits, dtype=np.uint8)))
        aggs.append(agg)
    a, b, c = aggs
    left = a.merge(b).merge(c).to_plain()
    right = a.merge(b.merge(c)).to_plain()
    assert left == right == c.merge(a).merge(b).to_plain()
    restored = RRAggregate.from_plain(mech, left)
    assert restored.to_plain() == left
