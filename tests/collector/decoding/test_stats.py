"""Normal tails and multiple-testing control agree with SciPy's and with their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as sps

from collector.decoding.stats import normal_quantile, normal_sf, reject, storey_pi0, z_interval


def test_normal_tail_matches_scipy() -> None:
    """erfc-based Pr[Z >= z] equals scipy.stats.norm.sf to 1e-12 relative, tails included."""
    z = np.array([-40.0, -3.0, -1.0, 0.0, 0.5, 1.96, 5.0, 12.0, 37.0])
    assert np.allclose(normal_sf(z), sps.norm.sf(z), rtol=1e-12, atol=0)
    assert normal_sf(np.array([np.inf, -np.inf])).tolist() == [0.0, 1.0]
    assert np.isnan(normal_sf(np.array([np.nan]))[0])


def test_quantile_and_interval() -> None:
    """Φ⁻¹ and the interval multiplier match SciPy; bad levels are refused."""
    assert normal_quantile(0.975) == pytest.approx(sps.norm.ppf(0.975), rel=1e-12)
    assert z_interval(0.95) == pytest.approx(1.959963984540054, rel=1e-12)
    with pytest.raises(ValueError, match="confidence"):
        z_interval(1.0)
    with pytest.raises(ValueError, match="probability"):
        normal_quantile(0.0)


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=60), st.sampled_from([0.01, 0.05, 0.2]))
def test_benjamini_hochberg_matches_scipy(p: list[float], alpha: float) -> None:
    """BH rejects exactly the hypotheses whose BH-adjusted p-value is at most α (SciPy's adjustment)."""
    arr = np.array(p)
    adjusted = sps.false_discovery_control(arr, method="bh")
    expected = adjusted <= alpha
    got = reject(arr, alpha=alpha, control="bh")
    # Ties at the boundary may differ by rounding of the adjustment: allow only those.
    boundary = np.isclose(adjusted, alpha, rtol=1e-12)
    assert np.array_equal(got[~boundary], expected[~boundary])


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=60))
def test_procedures_are_nested(p: list[float]) -> None:
    """Bonferroni ⊆ BH ⊆ Storey's adaptive BH (π̂0 <= 1), and Bonferroni ⊆ pfer at the same α."""
    arr = np.array(p)
    bonf = reject(arr, alpha=0.05, control="bonferroni")
    assert not (bonf & ~reject(arr, alpha=0.05, control="pfer")).any()
    bh = reject(arr, alpha=0.05, control="bh")
    storey = reject(arr, alpha=0.05, control="storey")
    assert not (bonf & ~bh).any()
    assert not (bh & ~storey).any()


def test_bonferroni_is_alpha_over_m() -> None:
    """Bonferroni rejects p <= α/M, with NaN as 1."""
    p = np.array([0.001, 0.0101, 0.01, np.nan, 0.5])
    assert reject(p, alpha=0.05, control="bonferroni").tolist() == [True, False, True, False, False]


def test_storey_pi0() -> None:
    """π̂0 = (1 + #{p > 1/2}) / (M/2), capped at 1."""
    assert storey_pi0(np.array([0.01, 0.02, 0.6, 0.7])) == pytest.approx(3 / 2 if 3 / 2 < 1 else 1.0)
    assert storey_pi0(np.array([0.01] * 9 + [0.9])) == pytest.approx(2 / 5)
    assert storey_pi0(np.array([])) == 1.0


def test_bad_control_and_alpha() -> None:
    """Unknown procedures and levels outside (0, 1) are refused."""
    with pytest.raises(ValueError, match="control"):
        reject(np.array([0.1]), alpha=0.05, control="holm")
    with pytest.raises(ValueError, match="alpha"):
        reject(np.array([0.1]), alpha=0.0, control="bh")
    assert reject(np.array([]), alpha=0.05, control="bh").size == 0


def test_pfer_rejects_below_alpha_over_estimated_nulls() -> None:
    """pfer rejects p <= α / (π̂0 M); α may exceed 1 (it counts false positives), not 0 or less."""
    p = np.array([0.001, 0.02, 0.03, 0.06, 0.6, 0.7, 0.8, 0.9])
    m0 = storey_pi0(p) * p.size  # π̂0 = (1 + 4) / (8/2), capped at 1: m0 = 8
    assert m0 == 8
    assert reject(p, alpha=2, control="pfer").tolist() == (p <= 2 / 8).tolist()
    q = np.array([1e-6] * 6 + [0.3, 0.9])  # π̂0 = (1 + 1) / 4 = 1/2: m0 = 4
    assert reject(q, alpha=1.2, control="pfer").tolist() == (q <= 1.2 / 4).tolist()
    with pytest.raises(ValueError, match="expected number of false positives"):
        reject(p, alpha=0, control="pfer")
    with pytest.raises(ValueError, match="alpha"):
        reject(p, alpha=float("nan"), control="pfer")


def _mean_false_positives(signal_z: float, families: int, seed: int) -> tuple[float, float]:
    """Mean and SE of the false positives of pfer at α = 2 over families of 150 nulls + 50 signals."""
    gen = np.random.default_rng(seed)
    counts = np.empty(families)
    for f in range(families):
        nulls = gen.uniform(size=150)
        signals = normal_sf(gen.normal(signal_z, 1.0, size=50))
        counts[f] = reject(np.concatenate([nulls, signals]), alpha=2.0, control="pfer")[:150].sum()
    return float(counts.mean()), float(counts.std(ddof=1) / np.sqrt(families))


def test_pfer_keeps_expected_false_positives_at_alpha() -> None:
    """Seeded: mean false positives match the exact expectation, which is at most α.

    With strong signals (none above λ) the bound of the stats docstring is an equality:
    ``E[V] = M0 (α/M) M(1-λ) E[1/(1 + Bin(M0 - 1, 1/2))] = 150 (2/200) 100 (1 - 2^-150)/75 = 2``.
    With weak signals, some of them count towards π̂0 and ``E[V] < α``.
    """
    mean, se = _mean_false_positives(5.0, 4000, 20261122)
    assert abs(mean - 2.0) < 4 * se
    weak_mean, weak_se = _mean_false_positives(0.5, 4000, 20261123)
    assert weak_mean + 4 * weak_se < 2.0
