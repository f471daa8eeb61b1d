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
    """Bonferroni ⊆ BH ⊆ Storey's adaptive BH (π̂0 <= 1)."""
    arr = np.array(p)
    bonf = reject(arr, alpha=0.05, control="bonferroni")
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
