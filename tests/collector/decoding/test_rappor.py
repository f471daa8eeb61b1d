"""RAPPOR decoding (004 §4): the Lasso solves its problem, the refit is least squares, the numbers are honest."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from collector.decoding.lasso import lasso, weights_from, wls
from collector.decoding.rappor import (
    RapporDecoder,
    _design,
    _variances,
    decode_categories,
    load_candidates,
)
from collector.decoding.release import ReleaseRule, release
from protocol.randomness import SeededRandom, uniform_ints
from protocol.rappor import Rappor
from protocol.server.rappor import RapporAggregate, RapporServer
from tests.collector.decoding.support import exponential_counts, simulate_counts

SEED = b"tests/collector/decoding/rappor"
PARAMS = {"k": 64, "h": 2, "cohorts": 8, "f": 0.5, "p": 0.5, "q": 0.75}
CANDIDATES = [f"v{i}" for i in range(60)]
PRESENT = 30  # v0 .. v29 carry the reports, v30 .. v59 never occur


def _mech(seed: int = 0, **changes: object) -> Rappor:
    params = {**PARAMS, **changes}
    return Rappor(seed=SEED + bytes([seed]), **params)  # type: ignore[arg-type]


def _truth(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(CANDIDATES))
    out[:PRESENT] = counts
    return out


def _problem(seed: int) -> tuple[Rappor, RapporAggregate, np.ndarray]:
    gen = np.random.default_rng(seed)
    mech = _mech(seed)
    counts = exponential_counts(1_000_000, PRESENT, gen)
    return mech, simulate_counts(mech, CANDIDATES[:PRESENT], counts, gen), _truth(counts)


def _dense(design: object, columns: np.ndarray) -> np.ndarray:
    d = design
    a = np.zeros((d.size, columns.size))  # type: ignore[attr-defined]
    for j, c in enumerate(columns):
        np.add.at(a[:, j], d.rows[c], d.vals[c])  # type: ignore[attr-defined]
    return a


def test_gram_matches_the_dense_centred_product() -> None:
    """The sparse Gram equals (PA)'W(PA) computed densely, intercepts profiled out."""
    mech, agg, _ = _problem(1)
    design = _design(RapporServer(mech), agg.estimate_bits(), CANDIDATES)
    gen = np.random.default_rng(2)
    design.set_weights(gen.uniform(0.5, 2.0, design.size))
    cols = np.arange(0, 60, 3)
    a = _dense(design, cols)
    pa = np.column_stack([design.center(a[:, j]) for j in range(cols.size)])
    expected = pa.T @ (design.weights[:, None] * pa)
    assert np.allclose(design.gram(cols), expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
    assert np.allclose(design.col_norm2[cols], np.diag(expected), rtol=1e-10)


def test_lasso_meets_its_kkt_conditions() -> None:
    """Non-negative weighted Lasso: active scores equal the penalty, inactive ones stay below it."""
    mech, agg, _ = _problem(3)
    design = _design(RapporServer(mech), agg.estimate_bits(), CANDIDATES)
    one, zero = (float(x) for x in mech.coordinate_probabilities("report"))
    n_j_rows = np.repeat(design.n_j, design.k)
    design.set_weights(weights_from(_variances(design, np.zeros(design.size), one, zero), n_j_rows))
    lam = 1.5
    coef = lasso(design, lam)
    active = np.flatnonzero(coef > 0)
    resid = design.y - design.predict(active, coef[active])
    z = design.scores(resid) / np.sqrt(design.col_norm2)
    assert (coef >= 0).all()
    assert active.size > 5
    assert np.allclose(z[active], lam, atol=2e-3)
    assert (z[coef == 0] <= lam + 2e-3).all()


def test_refit_is_weighted_least_squares_with_cohort_intercepts() -> None:
    """The refit equals numpy's least squares on the dense design with one intercept per cohort."""
    mech, agg, _ = _problem(4)
    design = _design(RapporServer(mech), agg.estimate_bits(), CANDIDATES)
    design.set_weights(np.random.default_rng(5).uniform(0.5, 2.0, design.size))
    cols = np.arange(PRESENT)
    coef, inv = wls(design, cols)
    cohort_dummies = np.kron(np.eye(design.cohorts), np.ones((design.k, 1)))
    x = np.hstack([_dense(design, cols), cohort_dummies])
    sw = np.sqrt(design.weights)
    full, *_ = np.linalg.lstsq(x * sw[:, None], design.y * sw, rcond=None)
    assert np.allclose(coef, full[: cols.size], rtol=1e-7, atol=1e-6)
    cov = np.linalg.inv((x * design.weights[:, None]).T @ x)
    assert np.allclose(inv, cov[: cols.size, : cols.size], rtol=1e-7)


def test_decoder_finds_the_heavy_strings_and_no_absent_one() -> None:
    """A scaled-down 004 §5.2: every string above 8 SE is found, no absent candidate is (Bonferroni)."""
    _, agg, truth = _problem(6)
    result = RapporDecoder().decode(agg, CANDIDATES)
    heavy = truth > 8 * np.median(result.standard_errors[result.selected])
    assert heavy.sum() >= 10
    assert result.detected[heavy].all()
    assert not result.detected[truth == 0].any()
    found = result.found()
    assert [d.count for d in found] == sorted((d.count for d in found), reverse=True)
    assert all(d.low < d.count < d.high and d.p_value < 0.05 / len(CANDIDATES) for d in found)


def test_estimates_are_unbiased_and_standard_errors_honest() -> None:
    """Over 30 seeds, (estimate - truth) / SE of the 10 largest strings has mean 0 and SD 1 (5 SE)."""
    zs = []
    for seed in range(30):
        _, agg, truth = _problem(100 + seed)
        result = RapporDecoder(control="bh").decode(agg, CANDIDATES)
        top = np.argsort(-truth)[:10]
        assert result.selected[top].all()
        zs.extend((result.counts[top] - truth[top]) / result.standard_errors[top])
    z = np.asarray(zs)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.std(ddof=1) - 1) < 5 / math.sqrt(2 * z.size)


def test_standard_error_matches_the_plan_formula() -> None:
    """The decoded SE of a heavy string is the Bloom-count SE sqrt(p*(1-p*) N/h̄)/(q*-p*) within 10%."""
    mech, agg, truth = _problem(7)
    result = RapporDecoder().decode(agg, CANDIDATES)
    one, zero = (float(x) for x in mech.coordinate_probabilities("report"))
    h_bar = mech.k * (1 - (1 - 1 / mech.k) ** mech.h)
    formula = math.sqrt(zero * (1 - zero) * agg.n / h_bar) / (one - zero)
    se = float(np.median(result.standard_errors[np.argsort(-truth)[:10]]))
    assert formula <= se < 1.1 * formula, se / formula


def test_absent_candidates_rarely_pass_bonferroni() -> None:
    """With no candidate present, the family-wise error stays near 5% (at most 5 of 20 seeds, a 5-SE bound)."""
    others = [f"outside{i}" for i in range(20)]
    hits = 0
    for seed in range(20):
        gen = np.random.default_rng(300 + seed)
        mech = _mech(seed)
        agg = simulate_counts(mech, others, exponential_counts(100_000, len(others), gen), gen)
        hits += bool(RapporDecoder().decode(agg, CANDIDATES).detected.any())
    assert hits <= 5


def test_benjamini_hochberg_and_storey_find_at_least_what_bonferroni_finds() -> None:
    """The FDR procedures are less conservative than Bonferroni on the same fit."""
    _, agg, _ = _problem(8)
    bonf = RapporDecoder(control="bonferroni").decode(agg, CANDIDATES).detected
    bh = RapporDecoder(control="bh").decode(agg, CANDIDATES).detected
    storey = RapporDecoder(control="storey").decode(agg, CANDIDATES).detected
    assert bonf.sum() <= bh.sum() <= storey.sum()
    assert not (bonf & ~bh).any()


def test_unexplained_reports_are_estimated() -> None:
    """Reports of strings outside the candidates, and of candidates left out of the fit, show up
    as the unexplained count and share (5 SE)."""
    gen = np.random.default_rng(9)
    mech = _mech(9)
    values = [*CANDIDATES[:10], *(f"outside{i}" for i in range(10))]
    counts = np.full(20, 10_000)
    agg = simulate_counts(mech, values, counts, gen)
    result = RapporDecoder(selection_z=3.0).decode(agg, CANDIDATES)
    assert result.selected[:10].sum() >= 8
    # A present candidate left out of the fit is unexplained too: its bits join the intercepts.
    expected = 100_000 + 10_000 * int((~result.selected[:10]).sum())
    un = result.unexplained
    assert abs(un.value - expected) < 5 * un.standard_error
    assert un.standard_error < 20_000
    share = result.unexplained_share
    assert share.value == pytest.approx(un.value / 200_000)
    assert share.standard_error == pytest.approx(un.standard_error / 200_000)


def test_privatized_reports_decode_like_the_exact_simulation(rng: SeededRandom) -> None:
    """End to end through privatize_many (SeededRandom): the heavy strings are found and covered."""
    mech = _mech(10)
    gen = np.random.default_rng(10)
    counts = exponential_counts(150_000, PRESENT, gen)
    values = [CANDIDATES[i] for i in np.repeat(np.arange(PRESENT), counts)]
    server = RapporServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, uniform_ints(rng, mech.cohorts, len(values)), rng))
    result = RapporDecoder().decode(agg, CANDIDATES)
    truth = _truth(counts)
    top = np.argsort(-truth)[:5]
    assert result.detected[top].all()
    assert (np.abs(result.counts[top] - truth[top]) < 5 * result.standard_errors[top]).all()


def test_one_time_variant_decodes_with_its_own_probabilities() -> None:
    """One-time RAPPOR (B' reported) goes through the same decoder; heavy strings are found."""
    gen = np.random.default_rng(11)
    mech = _mech(11, variant="one-time", f=0.5)
    counts = exponential_counts(100_000, PRESENT, gen)
    agg = simulate_counts(mech, CANDIDATES[:PRESENT], counts, gen)
    result = RapporDecoder().decode(agg, CANDIDATES)
    truth = _truth(counts)
    top = np.argsort(-truth)[:5]
    assert result.detected[top].all()
    assert (np.abs(result.counts[top] - truth[top]) < 5 * result.standard_errors[top]).all()
    assert not result.detected[truth == 0].any()


def test_basic_variant_is_decoded_directly() -> None:
    """Basic RAPPOR: category counts Σ_j t_ij, tests, and a consistent version summing to n."""
    cats = tuple(f"c{i}" for i in range(12))
    mech = Rappor(k=12, h=1, cohorts=2, f=0.0, p=0.5, q=0.75, seed=SEED, variant="basic", categories=cats)
    gen = np.random.default_rng(12)
    counts = np.array([20_000, 10_000, 5_000] + [0] * 9)
    agg = simulate_counts(mech, list(cats), counts, gen)
    out = decode_categories(agg, consistent=True)
    direct = agg.estimate_categories()
    assert np.array_equal(out.estimate.values, direct.values)
    assert out.detected[:2].all()
    assert not out.detected[3:].any()
    assert out.consistent is not None
    assert out.consistent.values.min() >= 0
    assert out.consistent.values.sum() == pytest.approx(agg.n)
    with pytest.raises(ValueError, match="decode_categories"):
        RapporDecoder().decode(agg, list(cats))


def test_empty_and_degenerate_inputs() -> None:
    """No reports, no candidates, or f = 1 give an empty decoding, not an error."""
    mech = _mech(0)
    empty = RapporDecoder().decode(RapporServer(mech).new_aggregate(), CANDIDATES)
    assert not empty.detected.any()
    assert empty.n == 0
    _, agg, _ = _problem(0)
    assert len(RapporDecoder().decode(agg, []).candidates) == 0
    noise = _mech(0, f=1.0)
    assert not RapporDecoder().decode(RapporServer(noise).new_aggregate(), CANDIDATES).detected.any()


def test_bad_arguments_are_refused() -> None:
    """Bad levels, controls, penalties or repeated candidates are caller errors naming the argument."""
    with pytest.raises(ValueError, match="alpha"):
        RapporDecoder(alpha=1.5)
    with pytest.raises(ValueError, match="control"):
        RapporDecoder(control="holm")
    with pytest.raises(ValueError, match="selection_z"):
        RapporDecoder(selection_z=-1.0)
    _, agg, _ = _problem(0)
    with pytest.raises(ValueError, match="distinct"):
        RapporDecoder().decode(agg, ["a", "a"])


def test_candidates_file(tmp_path: Path) -> None:
    """One candidate per line; blank lines skipped, spaces kept, repeats refused with line numbers."""
    path = tmp_path / "candidates.txt"
    path.write_text("alpha\n\n with space \r\nbeta", encoding="utf-8")
    assert load_candidates(path) == ["alpha", " with space ", "beta"]
    path.write_text("a\nb\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 repeats line 1"):
        load_candidates(path)


def test_more_candidates_than_rows_needs_the_lasso() -> None:
    """Scaled-down 004 §5.4: 600 candidates, 256 rows, Zipf(1) over 50: top strings found and covered, no absent one."""
    gen = np.random.default_rng(14)
    mech = Rappor(k=32, h=2, cohorts=8, f=0.75, p=0.5, q=0.75, seed=SEED + b"chrome")
    names = [f"home-{i}.example" for i in range(600)]
    w = 1.0 / np.arange(1, 51)
    counts = gen.multinomial(2_000_000, w / w.sum())
    agg = simulate_counts(mech, names[:50], counts, gen)
    result = RapporDecoder().decode(agg, names)
    truth = np.zeros(600)
    truth[:50] = counts
    assert result.selected.sum() < 256 // 4
    assert result.detected[:3].all()
    assert not result.detected[50:].any()
    top = np.argsort(-truth)[:5]
    assert (np.abs(result.counts[top] - truth[top]) < 5 * result.standard_errors[top]).all()


def test_basic_distribution_is_learned_better_with_more_reports() -> None:
    """A scaled-down 004 §5.1: the total variation distance falls with N; the consistent estimate is never worse."""
    cats = tuple(str(i) for i in range(41))
    mech = Rappor(k=41, h=1, cohorts=1, f=0.0, p=0.5, q=0.75, seed=SEED, variant="basic", categories=cats)
    gen = np.random.default_rng(15)
    tv_raw, tv_cons = [], []
    for n in (10_000, 100_000, 1_000_000):
        values = np.clip(np.rint(gen.normal(20, 4, n)), 0, 40).astype(np.int64)
        truth = np.bincount(values, minlength=41)
        agg = simulate_counts(mech, list(cats), truth, gen)
        out = decode_categories(agg, consistent=True)
        assert out.consistent is not None
        tv_raw.append(0.5 * np.abs(out.estimate.values - truth).sum() / n)
        tv_cons.append(0.5 * np.abs(out.consistent.values - truth).sum() / n)
    assert tv_raw[0] > tv_raw[1] > tv_raw[2]
    assert all(c <= r for c, r in zip(tv_cons, tv_raw, strict=True))
    assert tv_raw[2] < 0.1


def test_pfer_holds_its_expected_false_positives_and_finds_more() -> None:
    """pfer at α = 1 over 20 seeds: false positives average at most 1 (a 5-SE Poisson bound), and
    every seed detects a superset of Bonferroni's strings."""
    false_positives = 0
    seeds = 20
    for seed in range(seeds):
        _, agg, truth = _problem(200 + seed)
        pfer = RapporDecoder(control="pfer", alpha=1.0).decode(agg, CANDIDATES)
        bonf = RapporDecoder(control="bonferroni").decode(agg, CANDIDATES)
        assert not (bonf.detected & ~pfer.detected).any()
        false_positives += int((pfer.detected & (truth == 0)).sum())
    assert false_positives <= seeds + 5 * math.sqrt(seeds)


def _released_figures(cross_fit: bool, seeds: range) -> tuple[list[bool], list[float], list[float]]:
    """Over ``seeds``: whether each released string's interval covers its count, its error over
    the SE shown, and the pooled z of every absent candidate."""
    covered: list[bool] = []
    errors: list[float] = []
    absent: list[float] = []
    rule = ReleaseRule(threshold=0.0, control="bh", alpha=0.05)
    for seed in seeds:
        gen = np.random.default_rng(seed)
        mech = _mech(seed % 200)
        counts = exponential_counts(150_000, PRESENT, gen)
        agg = simulate_counts(mech, CANDIDATES[:PRESENT], counts, gen)
        truth = _truth(counts)
        result = RapporDecoder(control="bh", cross_fit=cross_fit).decode(agg, CANDIDATES)
        detail = release(result.candidates, result.counts, result.standard_errors, n=result.n, rule=rule)
        idx = np.flatnonzero(detail.released)
        t = truth[idx]
        covered.extend(((detail.lows[idx] <= t) & (t <= detail.highs[idx])).tolist())
        errors.extend(((result.counts[idx] - t) / detail.selection_standard_errors[idx]).tolist())
        absent.extend(result.z[truth == 0].tolist())
    return covered, errors, absent


def test_cross_fitted_releases_cover_and_absent_candidates_stay_standard_normal() -> None:
    """Cross-fitting by cohort, 40 seeded problems near the detection limit: released strings'
    conditional intervals cover 0.95 within 4 binomial SEs, their RMS error is at most 1.15 of the SE
    shown, and the pooled z of the absent candidates has mean 0 and SD 1 (5 SE): their p-values,
    and so the release rule's error rate, are calibrated."""
    covered, errors, absent = _released_figures(True, range(500, 540))
    n = len(covered)
    assert n > 300
    assert abs(np.mean(covered) - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / n), np.mean(covered)
    assert math.sqrt(float(np.mean(np.square(errors)))) <= 1.15
    z = np.asarray(absent)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.std(ddof=1) - 1) < 5 / math.sqrt(2 * z.size)


def test_cross_fit_needs_two_cohorts_a_side() -> None:
    """With fewer than four cohorts holding reports the decoder selects and fits on all of them."""
    gen = np.random.default_rng(41)
    mech = _mech(41, cohorts=2)
    counts = exponential_counts(200_000, PRESENT, gen)
    agg = simulate_counts(mech, CANDIDATES[:PRESENT], counts, gen)
    split = RapporDecoder(cross_fit=True).decode(agg, CANDIDATES)
    whole = RapporDecoder(cross_fit=False).decode(agg, CANDIDATES)
    assert np.array_equal(split.counts, whole.counts)
    assert np.array_equal(split.standard_errors, whole.standard_errors)
