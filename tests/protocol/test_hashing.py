"""The shared hash family: client and server agree, outputs are uniform, collisions are rare."""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocol.errors import ParameterError
from protocol.hashing import HashFamily, derive_seed, fingerprint
from protocol.server.hashing import evaluate, evaluate_row, family_fingerprints

SEED = b"use-case-seed-0123456789"


@pytest.mark.parametrize("range_", [1, 2, 1024, 1000, 65_536, 3])
def test_scalar_and_vector_evaluation_agree(range_: int) -> None:
    """A device's single-value hash equals the server's vectorised one, for every index."""
    family = HashFamily(SEED, count=50, range=range_)
    values = [f"value-{i}" for i in range(40)]
    fp = family_fingerprints(family, values)
    for j in range(family.count):
        out = np.empty(len(fp), dtype=np.uint64)
        row = evaluate_row(family, fp, j, out=out, scratch=np.empty(len(fp), dtype=np.uint64))
        vec = evaluate(family, fp, np.full(len(fp), j))
        scalar = [family.evaluate_value(v, j) for v in values]
        assert row.astype(np.int64).tolist() == vec.tolist() == scalar
        assert all(0 <= x < range_ for x in scalar)


def test_pairwise_collision_rate_is_one_over_m() -> None:
    """Over many functions, two fixed distinct values collide with probability ~1/m (5 SE)."""
    m, count = 64, 200_000
    family = HashFamily(SEED, count=count, range=m)
    fp = family_fingerprints(family, ["alpha", "beta"])
    idx = np.arange(count)
    a = evaluate(family, type(fp)(lo=fp.lo[:1], hi=fp.hi[:1]), idx)
    b = evaluate(family, type(fp)(lo=fp.lo[1:], hi=fp.hi[1:]), idx)
    rate = float(np.mean(a == b))
    se = math.sqrt((1 / m) * (1 - 1 / m) / count)
    assert abs(rate - 1 / m) <= 5 * se


def test_outputs_are_uniform() -> None:
    """One function over many values fills every bucket evenly (chi-square within 5 SD)."""
    m = 128
    family = HashFamily(SEED, count=1, range=m)
    fp = family_fingerprints(family, [str(i) for i in range(200_000)])
    counts = np.bincount(evaluate(family, fp, 0), minlength=m)
    expected = 200_000 / m
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert abs(chi2 - (m - 1)) <= 5 * math.sqrt(2 * (m - 1))


def test_seeds_separate_families() -> None:
    """Different seeds and derived labels give different fingerprints and functions."""
    assert fingerprint("x", seed=SEED) != fingerprint("x", seed=derive_seed(SEED, "other"))
    assert derive_seed(SEED, "a") != derive_seed(SEED, "b")
    f1 = HashFamily(SEED, count=8, range=1 << 20)
    f2 = HashFamily(derive_seed(SEED, "x"), count=8, range=1 << 20)
    assert [f1.evaluate_value("v", j) for j in range(8)] != [f2.evaluate_value("v", j) for j in range(8)]


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("seed", {"seed": b"short"}), ("count", {"count": 0}), ("range", {"range": 0})],
)
def test_bad_parameters_are_named(field: str, kwargs: dict[str, object]) -> None:
    """A bad seed, count or range is refused naming the field."""
    args: dict[str, object] = {"seed": SEED, "count": 4, "range": 16, **kwargs}
    with pytest.raises(ParameterError, match=field):
        HashFamily(**args)  # type: ignore[arg-type]
