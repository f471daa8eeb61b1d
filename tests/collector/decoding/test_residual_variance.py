"""RAPPOR's residual-based standard errors (collector/decoding/residual_variance.py): the sparse
sums are the dense sandwich, unbiased when the model is right, and wider where an unfitted
string's reports sit on a candidate's bits."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from collector.decoding.lasso import Design, wls
from collector.decoding.rappor import RapporDecoder, _design
from collector.decoding.residual_variance import (
    excess_threshold,
    residual_scale,
    robust_score_variances,
    sandwich_variances,
)
from protocol.rappor import Rappor
from protocol.server.rappor import RapporServer
from tests.collector.decoding.support import simulate_counts

SEED = b"tests/collector/decoding/residual-variance"
CANDIDATES = [f"v{i}" for i in range(60)]
PRESENT = 30


def _mech(seed: int, **changes: object) -> Rappor:
    params: dict[str, object] = {"k": 128, "h": 2, "cohorts": 32, "f": 0.5, "p": 0.5, "q": 0.75, **changes}
    return Rappor(seed=SEED + bytes([seed]), **params)  # type: ignore[arg-type]


def _dense(design: Design, columns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    a = np.zeros((design.size, columns.size))
    for j, c in enumerate(columns):
        np.add.at(a[:, j], design.rows[c], design.vals[c])
    return a


def _fitted_design(seed: int) -> tuple[Design, npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """A design with random weights, the first 20 columns fitted: (design, columns, inv, residual)."""
    mech = _mech(seed, cohorts=8, k=64)
    gen = np.random.default_rng(seed)
    agg = simulate_counts(mech, CANDIDATES[:PRESENT], gen.integers(1_000, 20_000, PRESENT), gen)
    design = _design(RapporServer(mech), agg.estimate_bits(), CANDIDATES)
    design.set_weights(gen.uniform(0.5, 2.0, design.size) * 1e-4)
    cols = np.arange(20, dtype=np.int64)
    coef, inv = wls(design, cols)
    return design, cols, inv, design.y - design.predict(cols, coef)


def test_the_sandwich_is_the_dense_hc2_formula() -> None:
    """diag(G⁻¹ X'W diag(r²/(1-h)) W X G⁻¹) with the cohort intercepts as explicit columns equals the
    sparse computation, leverages included."""
    design, cols, inv, resid = _fitted_design(1)
    x = np.hstack([_dense(design, cols), np.kron(np.eye(design.cohorts), np.ones((design.k, 1)))])
    w = design.weights
    full_inv = np.linalg.inv((x * w[:, None]).T @ x)
    hat = np.einsum("ij,jk,ik->i", x, full_inv, x) * w
    coef = full_inv @ (x * w[:, None]).T @ design.y
    r = design.y - x @ coef
    e2 = r**2 / (1 - hat)
    gains = (x * w[:, None]) @ full_inv
    expected = (gains**2 * e2[:, None]).sum(axis=0)[: cols.size]
    scale = residual_scale(design, cols, inv, resid)
    assert np.allclose(scale.e2, e2, rtol=1e-8, atol=1e-12 * e2.max())
    assert np.allclose(sandwich_variances(scale), expected, rtol=1e-8)


def test_the_robust_score_variance_is_the_dense_sum() -> None:
    """For the columns outside the fit, the sparse sums equal Σ (w (P A_c))² r²/(1-h) computed densely."""
    design, cols, inv, resid = _fitted_design(2)
    scale = residual_scale(design, cols, inv, resid)
    others = np.arange(20, 60, dtype=np.int64)
    pa = np.column_stack([design.center(col) for col in _dense(design, others).T])
    expected = ((design.weights[:, None] * pa) ** 2 * scale.e2[:, None]).sum(axis=0)
    assert np.allclose(robust_score_variances(design, others, scale), expected, rtol=1e-8)


def test_the_sandwich_is_unbiased_when_every_string_is_fitted() -> None:
    """Every string a candidate and heavy enough to be fitted (the model exact): the variance
    shown is never below the model's, and over it has mean 1.02 within 5 of its SEs: the
    residuals' variance (noise sqrt(2/64), 64 cells per candidate) is shown only where a
    one-sided test at 5 % finds it larger."""
    ratios = []
    for seed in range(6):
        mech = _mech(seed)
        gen = np.random.default_rng(seed)
        agg = simulate_counts(mech, CANDIDATES[:PRESENT], np.full(PRESENT, 40_000), gen)
        model = RapporDecoder(residual_variance=False, cross_fit=False).decode(agg, CANDIDATES)
        robust = RapporDecoder(cross_fit=False).decode(agg, CANDIDATES)
        assert model.selected[:PRESENT].all()
        sel = model.selected
        # The model's variance alone is the φ-scaled one over φ.
        alone = model.standard_errors[sel] ** 2 / model.dispersion
        ratios.extend((robust.standard_errors[sel] ** 2 / alone).tolist())
    r = np.asarray(ratios)
    # X 1{X > t} + 1{X <= t} with X ~ χ²_64/64 and t its 95th percentile: mean 1.020, spread 0.09.
    assert abs(r.mean() - 1.02) < 5 * 0.09 / math.sqrt(r.size), r.mean()
    assert (r >= 1 - 1e-9).all(), r.min()
    assert 0 < float(np.mean(r > 1 + 1e-9)) < 0.2  # about 5 % pass the test


def test_the_excess_threshold_is_the_upper_quantile_of_the_variance_noise() -> None:
    """excess_threshold(ν) is the 95th percentile of χ²_ν/ν: a seeded simulation of 4·10^5 draws
    exceeds it 5 % of the time within 5 binomial SEs (0.0017), and it is 1 for ν = ∞."""
    gen = np.random.default_rng(3)
    for nu in (8, 16, 64, 200):
        draws = gen.chisquare(nu, 400_000) / nu
        share = float(np.mean(draws > float(excess_threshold(nu))))
        assert abs(share - 0.05) < 5 * math.sqrt(0.05 * 0.95 / 400_000), (nu, share)
    assert float(excess_threshold(math.inf)) == 1.0


def test_an_unfitted_heavy_string_widens_the_candidates_on_its_bits() -> None:
    """A string outside the list with 13 % of the reports, over 20 problems: the candidates that
    share at least 3 of its bits have errors far above the model's SE and closer to the SE shown,
    which they more often get from the residuals than the others do; over every fitted candidate
    the RMS of error / SE shown is 1 within 5 of its SEs."""
    shown, model_only, shares_of, widened = [], [], [], []
    for seed in range(20):
        mech = _mech(seed)
        gen = np.random.default_rng(100 + seed)
        counts = np.concatenate([gen.integers(30_000, 60_000, 10), [100_000]])
        agg = simulate_counts(mech, [*CANDIDATES[:10], "outside"], counts, gen)
        truth = np.zeros(len(CANDIDATES))
        truth[:10] = counts[:10]
        robust = RapporDecoder().decode(agg, CANDIDATES)
        plain = RapporDecoder(residual_variance=False).decode(agg, CANDIDATES)
        # How many of each candidate's (cohort, bit) cells the outside string sets.
        pos = RapporServer(mech).candidate_positions([*CANDIDATES, "outside"])
        shares = (pos[:-1, :, :, None] == pos[-1][None, :, None, :]).any(axis=(2, 3)).sum(axis=1)
        sel = robust.selected
        shown.extend(((robust.counts[sel] - truth[sel]) / robust.standard_errors[sel]).tolist())
        model_only.extend(((plain.counts[sel] - truth[sel]) / plain.standard_errors[sel]).tolist())
        shares_of.extend(shares[sel].tolist())
        widened.extend(robust.widened[sel].tolist())
    z, zm, s, w = np.asarray(shown), np.asarray(model_only), np.asarray(shares_of), np.asarray(widened)
    assert abs(math.sqrt(float(np.mean(z**2))) - 1) < 5 / math.sqrt(2 * z.size), np.mean(z**2)
    many = s >= 3
    assert many.sum() >= 20
    assert float(np.mean(zm[many] ** 2)) > 1.5 * float(np.mean(z[many] ** 2)) > 0
    assert w[many].mean() > w[s == 0].mean()
