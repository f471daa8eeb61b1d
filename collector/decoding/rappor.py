"""RAPPOR decoding (004 §4 and Appendix): which candidate strings are present, how often, how sure.

**Input.** The per-cohort bit estimates ``t_ij`` (:meth:`RapporAggregate.estimate_bits`:
the unbiased estimate of ``T_ij``, the number of reports of cohort ``j`` whose Bloom filter
has bit ``i`` set, 004 §4 first step) and the candidates' Bloom bits
(:meth:`~protocol.server.rappor.RapporServer.candidate_positions`: 004 §4's design matrix
``X``, ``h`` ones per cohort), both asked of the server half
(:class:`~protocol.server.contract.CandidateServer`).

**Model.** A report holds exactly one value and its Bloom filter is a deterministic function
of (value, cohort), so ``T_ij = Σ_c N_cj X_cji`` exactly, ``N_cj`` being the reports of
candidate ``c`` in cohort ``j``. Cohorts are drawn independently of the value (004 §4), so
``N_cj ≈ C_c N_j / N`` with ``C_c`` the candidate's count; writing the coefficients as counts
makes them the numbers to report:

    t_ij = Σ_c C_c (N_j / N) X_cji + α_j + e_ij,
    Var e_ij = v_ij = (μ_ij q*(1-q*) + (N_j - μ_ij) p*(1-p*)) / (q* - p*)².

``v_ij`` is the binomial variance of ``c_ij`` (:mod:`protocol.rappor`; ``μ_ij = E t_ij``). The
per-cohort intercept ``α_j`` is not in 004 §4; it is the expected contribution of reports
whose value is not among the candidates (or not selected): their ``h`` bits land uniformly
over the ``k`` (the hash family is uniform), so on average they add the same amount to every
bit of a cohort. Without it every unmodelled report inflates every candidate's estimate
(in the Chrome setting of 004 §5.4 about a third of the reports belong to strings too rare
to be resolved). ``Σ_j α_j k / h̄`` (``h̄ = k(1 - (1 - 1/k)^h)``, the expected number of
distinct bits of a string) is reported as the *unexplained* count, with its SE. It is a
diagnostic, conditional on the selection: the weakest selected candidates were selected
partly for their positive noise, and what they over-claim is missing from it.

**Steps** (004 §4, with the choices below):

1. *Selection by the Lasso* (004 §4: "Use Lasso [26] regression to fit a model Y ~ X and
   select candidate strings corresponding to non-zero coefficients"), here the
   non-negative, weighted Lasso

       minimise ½ Σ w_ij (t_ij - Σ_c C_c A_c,ij - α_j)² + λ Σ_c s_c C_c   over C >= 0, α free,

   with weights ``w = 1/v`` (the ``t_ij`` are independent given the data but do not have equal
   variances: cohorts differ in size, and ``q*(1-q*) != p*(1-p*)``), and penalties ``λ s_c``
   where ``s_c`` is the weighted norm of column ``c`` after the intercepts are profiled out.
   Scaling the penalty by ``s_c`` puts ``λ`` in standard-normal units: a candidate enters the
   model exactly when its score statistic (its correlation with the current residual
   divided by that correlation's null standard deviation) exceeds ``λ``. Counts cannot be
   negative, so the constraint ``C >= 0`` (as in the reference decoder's ``glmnet(...,
   lower.limits = 0)``) only removes impossible fits. The solver (pathwise coordinate
   descent, checked against the KKT conditions) is :mod:`collector.decoding.lasso`. The default
   ``λ = Φ^-1(1 - 1/M)`` admits in expectation at most one *absent* candidate. A selected
   absent candidate is selected because its noise is positive; it then absorbs the
   positive noise of the cells it shares with present strings and biases them down (with
   ``λ = 2`` in the setting of 004 §5.4, about 180 absent candidates enter and the top
   strings come out 0.35 SE low). A present string left out costs almost nothing: its
   bits join ``α_j``, and its collisions with a selected string shift that string by a
   small fraction of its SE. A left-out candidate can still be released (step 3).
2. *Least squares on the selected candidates* (004 §4: "Fit a regular least-squares
   regression using the selected variables to estimate counts, their standard errors and
   p-values"), as weighted least squares with the intercepts, unconstrained, so the
   estimates are unbiased for the model and their normal-theory standard errors hold. The
   Lasso's coefficients are not reported: they are shrunk by ``λ s_c`` towards 0. The fit
   is done twice: first with the variances at ``μ = 0`` (weights that depend on ``N_j``
   only, so they are independent of the noise), then with the variances at the first
   fit's ``μ`` (one step of iteratively reweighted least squares; McCullagh and Nelder,
   *Generalized Linear Models*, 1989, ch. 9). The model's variance is ``diag((X'WX)^-1)``:
   the variance model is exact for the randomized response, so the dispersion
   ``φ = max(1, Pearson χ² / dof)`` measures what the model misses on average (strings outside
   the candidates, unequal hash loads), and is reported. What it misses is not spread evenly:
   an unfitted string's reports sit on its own bits. So the standard error is the variance
   the residuals at the candidate's own bits show where a one-sided test finds it larger than
   the model's, the model's otherwise (``residual_variance``;
   :mod:`collector.decoding.residual_variance`, docs/estimation.md "RAPPOR: what the
   candidates do not explain"); without them, the model's times ``φ``.
3. *Tests* (004 §4: "Compare p-values to a Bonferroni corrected level of α/M ... or the
   Benjamini-Hochberg procedure"): every candidate gets a one-sided p-value for
   ``C_c > 0``, all ``M`` of them enter the correction (:mod:`collector.decoding.stats`).
   For a selected candidate the Wald ``z = Ĉ / SE``; for one the Lasso left out, the score
   (Lagrange multiplier) statistic ``z = A_c' W r / sqrt(V)`` at the fitted model, with
   ``r`` the residual, ``V`` the residuals' variance of the score where the same test finds it
   larger than ``s_c²``, ``s_c²`` otherwise (``φ s_c²`` without them), and the one-step estimate
   ``A_c' W r / s_c²``. (``s_c`` ignores the small overlap with the selected columns, which
   makes that ``z`` conservative.) A left-out candidate
   that passes the correction is added to the model and the fit repeated, so every
   released string has a least-squares estimate.

**Selection, then fit** (docs/estimation.md, "RAPPOR: selection, then fit"). Steps 1 and 2
on the same bits carry the noise that made a candidate enter the model into its least-squares
estimate. A report's cohort is drawn independently of its value (004 §4), so the cohorts
with reports split into two alternating halves that are independent samples of the same
population. By default (``cross_fit``) the decoder runs step 1 on one half and steps 2-3 on
the other, both ways, and pools the two fits by inverse (model) variance: each half's estimate is
fitted on bits its own selection never saw, and the pooled SE is the full data's (each half's
is about ``√2`` times it). A candidate the pooled test finds joins both halves' models and
the fits are repeated, as in step 3. With fewer than four cohorts holding reports it selects
and fits on all of them. The release rule then conditions on the release itself
(:mod:`collector.decoding.selective`).

Since the Lasso picks the candidates whose score exceeds ``λ`` and the test rejects those
whose (almost the same) statistic exceeds a stricter threshold, an absent candidate is
released with about the probability its marginal test allows: correcting over all ``M``
candidates, not only the selected ones, is what keeps the false discoveries at the
nominal level.

**The basic variants** (004 §2.1) need no regression: category ``i`` has count ``Σ_j t_ij``
(:meth:`RapporAggregate.estimate_categories`, 004 Appendix ``T̂_i = (C_i - pN)/(q - p)``),
tested the same way; :func:`decode_categories` (in :mod:`collector.decoding.rappor_categories`,
re-exported here with :func:`load_candidates`). The one-time variants use the same
decoder: only ``q*`` and ``p*`` change (they are ``B'``'s probabilities), which
:meth:`Rappor.coordinate_probabilities` already accounts for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from collector.decoding.arrays import Array, BoolArray, IntArray
from collector.decoding.lasso import Design, lasso, weights_from, wls
from collector.decoding.plain import ValueEstimate
from collector.decoding.rappor_categories import CategoryDecoding, decode_categories, load_candidates
from collector.decoding.residual_variance import (
    excess_threshold,
    residual_scale,
    robust_score_variances,
    sandwich_degrees,
    sandwich_variances,
    score_degrees,
)
from collector.decoding.stats import check_level, normal_quantile, normal_sf, reject, z_interval
from protocol.interfaces import EstimateKind
from protocol.server.contract import CandidateServer
from protocol.server.estimate import BitEstimates, Estimate
from protocol.server.rappor import RapporAggregate, RapporServer

__all__ = [
    "RESIDUAL_STANDARD_ERRORS",
    "CategoryDecoding",
    "DecodedString",
    "RapporDecoder",
    "RapporDecoding",
    "decode_categories",
    "load_candidates",
]

RESIDUAL_STANDARD_ERRORS = (
    "the variance the residuals show at the candidate's own bits where a one-sided test at 5 % "
    "finds it larger than the randomized response's own (least squares), the latter otherwise"
)
"""What a decoded candidate's standard error is (``residual_variance``; docs/estimation.md)."""

_REFIT_ROUNDS = 3
"""How often left-out candidates that pass the test are added back before giving up."""


class DecodedString(ValueEstimate):
    """A RAPPOR candidate with its estimated count (fields: :class:`ValueEstimate`)."""


@dataclass(frozen=True, eq=False)
class RapporDecoding:
    """The result of :meth:`RapporDecoder.decode`: one entry per candidate, in input order.

    Attributes:
        candidates: the candidates, as given.
        counts: estimated counts (least squares for the selected, one-step score estimate
            for the others).
        standard_errors: their standard errors.
        z: test statistics.
        p_values: one-sided p-values of ``count > 0``.
        selected: whether the candidate is in the least-squares model.
        detected: whether it passed the multiple-testing correction.
        n: number of reports.
        unexplained: estimated number of reports not explained by the selected candidates.
        control: the correction used; ``alpha``: its level; ``confidence``: interval level.
        selection_z: the Lasso penalty ``λ`` (standard-normal units).
        dispersion: ``φ`` (Pearson χ² per degree of freedom of the final fit, at least 1).
        lasso_selected: how many candidates the Lasso kept (before any added back).
        widened: the candidates whose standard error is the residuals' variance at their own
            bits, where a one-sided test found it larger than the model's
            (:mod:`collector.decoding.residual_variance`).
    """

    candidates: tuple[str | bytes, ...]
    counts: Array
    standard_errors: Array
    z: Array
    p_values: Array
    selected: BoolArray
    detected: BoolArray
    n: int
    unexplained: Estimate
    control: str
    alpha: float
    confidence: float
    selection_z: float
    dispersion: float
    lasso_selected: int
    widened: BoolArray
    _z_crit: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_z_crit", z_interval(self.confidence))

    @property
    def unexplained_share(self) -> Estimate:
        """The share of the reports the fitted candidates do not explain (``unexplained / n``),
        with its standard error (docs/estimation.md, "RAPPOR: what the candidates do not explain")."""
        n = max(self.n, 1)
        return Estimate(self.unexplained.value / n, self.unexplained.standard_error / n, self.n)

    @property
    def lows(self) -> Array:
        """Lower ends of the confidence intervals."""
        out: Array = self.counts - self._z_crit * self.standard_errors
        return out

    @property
    def highs(self) -> Array:
        """Upper ends of the confidence intervals."""
        out: Array = self.counts + self._z_crit * self.standard_errors
        return out

    def entry(self, i: int) -> DecodedString:
        """Candidate ``i`` with its estimate."""
        c, se = float(self.counts[i]), float(self.standard_errors[i])
        return DecodedString(
            value=self.candidates[i],
            count=c,
            standard_error=se,
            low=c - self._z_crit * se,
            high=c + self._z_crit * se,
            z=float(self.z[i]),
            p_value=float(self.p_values[i]),
        )

    def found(self) -> list[DecodedString]:
        """The detected candidates, largest count first."""
        idx = np.flatnonzero(self.detected)
        idx = idx[np.argsort(-self.counts[idx], kind="stable")]
        return [self.entry(int(i)) for i in idx]


def _design(server: CandidateServer, bits: BitEstimates, candidates: Sequence[str | bytes]) -> Design:
    pos = server.candidate_positions(candidates)  # (M, cohorts, h)
    m_count, cohorts, h = pos.shape
    k = bits.values.shape[1]
    # A bit set by two of a candidate's hashes is set once (004 §2 step 1): drop repeats.
    srt = np.sort(pos, axis=2)
    first = np.ones_like(srt, dtype=np.bool_)
    first[:, :, 1:] = srt[:, :, 1:] != srt[:, :, :-1]
    n_j = bits.cohort_sizes.astype(np.float64)
    n = max(float(bits.n), 1.0)
    vals = np.where(first, (n_j / n)[None, :, None], 0.0).reshape(m_count, cohorts * h)
    rows = (srt + (np.arange(cohorts, dtype=np.int64) * k)[None, :, None]).reshape(m_count, cohorts * h)
    y = np.nan_to_num(bits.values.reshape(-1).astype(np.float64))
    return Design(rows=rows, vals=vals, cohorts=cohorts, k=k, h=h, y=y, n_j=n_j)


def _variances(design: Design, mean: Array, q_star: float, p_star: float) -> Array:
    """``v_ij`` at ``μ = mean`` (clipped to ``[0, N_j]``), as in :mod:`protocol.rappor`."""
    n_j = np.repeat(design.n_j, design.k)
    mu = np.clip(mean, 0.0, n_j)
    out: Array = (mu * q_star * (1 - q_star) + (n_j - mu) * p_star * (1 - p_star)) / (q_star - p_star) ** 2
    return out


def _halves(design: Design) -> tuple[BoolArray, BoolArray] | None:
    """Rows of the cohorts with reports split in two alternating halves; ``None`` when either
    half would have fewer than two such cohorts (too few to select on or to fit)."""
    used = np.flatnonzero(design.n_j > 0)
    if used.size < 4:
        return None
    first = np.zeros(design.cohorts, dtype=np.bool_)
    first[used[::2]] = True
    second = np.zeros(design.cohorts, dtype=np.bool_)
    second[used[1::2]] = True
    return np.repeat(first, design.k), np.repeat(second, design.k)


# ----------------------------------------------------------------------------------------
# The decoder


@dataclass(frozen=True, kw_only=True)
class RapporDecoder:
    """Decode Bloom-filter RAPPOR against candidate strings (004 §4; see the module docstring).

    Args:
        alpha: level of the multiple-testing correction, in (0, 1); for ``"pfer"`` the
            expected number of false positives (any positive number).
        control: ``"bonferroni"`` (004 §4), ``"bh"`` (Benjamini-Hochberg), ``"storey"``
            (adaptive BH) or ``"pfer"`` (expected false positives at most ``alpha``;
            :mod:`collector.decoding.stats`).
        confidence: level of the reported two-sided intervals.
        selection_z: the Lasso penalty ``λ`` in standard-normal units; ``None`` picks
            ``max(1, Φ^-1(1 - 1/M))`` (at most one absent candidate selected, in expectation).
        max_selected: most candidates in the least-squares fit (default ``rows // 4``); if the
            Lasso keeps more, those with the largest standardized coefficients are kept.
        reweight: refit once with the variances at the first fit (IRLS step).
        cross_fit: select on one half of the cohorts and fit on the other, both ways
            (module docstring, "Selection, then fit"); ``False`` selects and fits on all of
            them, as 004 §4 does.
        residual_variance: standard errors from the residuals' variance at each candidate's
            own bits where it is significantly larger than the least-squares variance
            (:mod:`collector.decoding.residual_variance`); ``False`` gives the least-squares
            variance times ``φ``, the misfit averaged over every bit.
    """

    alpha: float = 0.05
    control: str = "bonferroni"
    confidence: float = 0.95
    selection_z: float | None = None
    max_selected: int | None = None
    reweight: bool = True
    cross_fit: bool = True
    residual_variance: bool = True

    def __post_init__(self) -> None:
        check_level(self.alpha, self.control)
        z_interval(self.confidence)
        if self.selection_z is not None and not (math.isfinite(self.selection_z) and self.selection_z > 0):
            raise ValueError(f"selection_z must be a positive number; got {self.selection_z!r}")
        if self.max_selected is not None and (isinstance(self.max_selected, bool) or self.max_selected < 1):
            raise ValueError(f"max_selected must be a positive integer; got {self.max_selected!r}")

    def decode(self, aggregate: RapporAggregate, candidates: Sequence[str | bytes]) -> RapporDecoding:
        """Decode the reports in ``aggregate`` against ``candidates`` (distinct strings).

        Raises:
            ValueError: for the basic variants (use :func:`decode_categories`) or repeated candidates.
        """
        server = RapporServer(aggregate.mechanism)
        return self.decode_bits(server, server.estimate_bits(aggregate), candidates)

    def decode_bits(
        self, server: CandidateServer, bits: BitEstimates, candidates: Sequence[str | bytes]
    ) -> RapporDecoding:
        """As :meth:`decode`, from the ``t_ij`` already estimated by ``server`` (the server half
        of the use case: its candidates' Bloom bits and its variance model)."""
        if server.kind is not EstimateKind.CANDIDATES:
            raise ValueError("basic RAPPOR maps categories to bits: decode it with decode_categories")
        cands = tuple(candidates)
        if len(set(cands)) != len(cands):
            raise ValueError("candidates must be distinct")
        q_star, p_star = server.bit_probabilities
        m_count = len(cands)
        n = int(bits.n)
        if m_count == 0 or n == 0 or q_star == p_star:
            return self._empty(cands, n)
        design = _design(server, bits, cands)
        n_j_rows = np.repeat(design.n_j, design.k)
        lam = self._selection_z(m_count)
        halves = _halves(design) if self.cross_fit else None
        if halves is None:
            fit, lasso_selected = self._select_and_fit(design, lam, n_j_rows, n_j_rows, q_star=q_star, p_star=p_star)
        else:
            fit, lasso_selected = self._cross_fit(design, lam, n_j_rows, halves, q_star=q_star, p_star=p_star)
        detected = reject(fit.p, alpha=self.alpha, control=self.control)
        return RapporDecoding(
            candidates=cands,
            counts=fit.counts,
            standard_errors=fit.se,
            z=fit.z,
            p_values=fit.p,
            selected=fit.selected,
            detected=detected,
            n=n,
            unexplained=fit.unexplained,
            control=self.control,
            alpha=self.alpha,
            confidence=self.confidence,
            selection_z=lam,
            dispersion=fit.dispersion,
            lasso_selected=lasso_selected,
            widened=fit.widened,
        )

    def _select(self, design: Design, lam: float, n_j_rows: Array, *, q_star: float, p_star: float) -> IntArray:
        """Step 1 on the rows where ``n_j_rows > 0``: the Lasso's candidates, at most ``max_selected``."""
        rows_used = int(np.count_nonzero(n_j_rows > 0))
        design.set_weights(weights_from(_variances(design, np.zeros(design.size), q_star, p_star), n_j_rows))
        coef = lasso(design, lam)
        chosen = np.flatnonzero(coef > 0)
        limit = self.max_selected if self.max_selected is not None else max(1, rows_used // 4)
        if chosen.size > limit:
            strength = coef[chosen] * np.sqrt(design.col_norm2[chosen])
            chosen = np.sort(chosen[np.argsort(-strength, kind="stable")[:limit]])
        return chosen

    def _select_and_fit(
        self, design: Design, lam: float, select_rows: Array, fit_rows: Array, *, q_star: float, p_star: float
    ) -> tuple[_Fit, int]:
        """Steps 1-3: select on ``select_rows``, fit and test on ``fit_rows`` (the same rows
        without cross-fitting), adding back left-out candidates the fit's test finds."""
        chosen = self._select(design, lam, select_rows, q_star=q_star, p_star=p_star)
        lasso_selected = int(chosen.size)
        rows_used = int(np.count_nonzero(fit_rows > 0))
        limit = (
            self.max_selected if self.max_selected is not None else max(1, int(np.count_nonzero(select_rows > 0)) // 4)
        )
        for _ in range(_REFIT_ROUNDS):
            fit = self._refit(
                design, chosen=chosen, q_star=q_star, p_star=p_star, n_j_rows=fit_rows, rows_used=rows_used
            )
            detected = reject(fit.p, alpha=self.alpha, control=self.control)
            missing = np.flatnonzero(detected & ~fit.selected)
            if missing.size == 0 or chosen.size + missing.size > limit:
                break
            chosen = np.union1d(chosen, missing)
        return fit, lasso_selected

    def _cross_fit(
        self,
        design: Design,
        lam: float,
        n_j_rows: Array,
        halves: tuple[BoolArray, BoolArray],
        *,
        q_star: float,
        p_star: float,
    ) -> tuple[_Fit, int]:
        """Select on one half of the cohorts and fit on the other, both ways, and pool the two
        fits by inverse variance (see "Selection, then fit" in the module docstring). A
        candidate the pooled test finds is added to both models and the fits repeated, so
        every released string has least-squares estimates, as without cross-fitting."""
        sides = [(n_j_rows * halves[0], n_j_rows * halves[1]), (n_j_rows * halves[1], n_j_rows * halves[0])]
        chosen = [self._select(design, lam, select, q_star=q_star, p_star=p_star) for select, _ in sides]
        lasso_selected = max(c.size for c in chosen)
        limit = [
            self.max_selected if self.max_selected is not None else max(1, int(np.count_nonzero(select > 0)) // 4)
            for select, _ in sides
        ]
        for _ in range(_REFIT_ROUNDS):
            a, b = (
                self._refit(
                    design,
                    chosen=c,
                    q_star=q_star,
                    p_star=p_star,
                    n_j_rows=fit,
                    rows_used=int(np.count_nonzero(fit > 0)),
                )
                for c, (_, fit) in zip(chosen, sides, strict=True)
            )
            pooled = _pool(a, b)
            detected = reject(pooled.p, alpha=self.alpha, control=self.control)
            grown = [np.union1d(c, np.flatnonzero(detected)) for c in chosen]
            if all(g.size == c.size for g, c in zip(grown, chosen, strict=True)) or any(
                g.size > cap for g, cap in zip(grown, limit, strict=True)
            ):
                break
            chosen = grown
        return pooled, lasso_selected

    def _selection_z(self, m_count: int) -> float:
        if self.selection_z is not None:
            return float(self.selection_z)
        return 1.0 if m_count <= 2 else max(1.0, normal_quantile(1.0 - 1.0 / m_count))

    def _refit(
        self,
        design: Design,
        *,
        chosen: IntArray,
        q_star: float,
        p_star: float,
        n_j_rows: Array,
        rows_used: int,
    ) -> _Fit:
        design.set_weights(weights_from(_variances(design, np.zeros(design.size), q_star, p_star), n_j_rows))
        coef, inv = wls(design, chosen)
        if self.reweight:
            fitted = design.predict(chosen, coef)
            fitted += np.repeat(design.intercepts(design.y - fitted), design.k)
            design.set_weights(weights_from(_variances(design, fitted, q_star, p_star), n_j_rows))
            coef, inv = wls(design, chosen)
        resid = design.y - design.predict(chosen, coef)
        centred = design.center(resid)
        cohorts_used = int(np.count_nonzero(design.cohort_weight > 0))
        dof = max(rows_used - chosen.size - cohorts_used, 1)
        phi = max(1.0, float((design.weights * centred**2).sum()) / dof)
        m_count = design.rows.shape[0]
        counts = np.zeros(m_count)
        model = np.full(m_count, np.inf)
        robust = np.full(m_count, np.nan)
        degrees = np.full(m_count, np.inf)
        selected = np.zeros(m_count, dtype=np.bool_)
        selected[chosen] = True
        counts[chosen] = coef
        model[chosen] = np.maximum(np.diag(inv), 0.0)
        scale = residual_scale(design, chosen, inv, resid) if self.residual_variance else None
        if scale is not None:
            robust[chosen] = sandwich_variances(scale)
            degrees[chosen] = sandwich_degrees(design, scale)
        # Score (Lagrange multiplier) statistics and one-step estimates for the rest.
        others = np.flatnonzero(~selected)
        if others.size:
            score = design.scores(resid, others)
            norm2 = design.col_norm2[others]
            with np.errstate(divide="ignore", invalid="ignore"):
                counts[others] = np.where(norm2 > 0, score / norm2, 0.0)
                model[others] = np.where(norm2 > 0, 1.0 / norm2, np.inf)
                if scale is not None:
                    robust[others] = robust_score_variances(design, others, scale) / norm2**2
                    degrees[others] = score_degrees(design, others)
        unexplained = self._unexplained(design, resid, chosen, inv, phi)
        return _Fit(
            counts=counts,
            model=model if scale is not None else model * phi,
            robust=robust,
            dof=degrees,
            selected=selected,
            dispersion=phi,
            unexplained=unexplained,
        )

    @staticmethod
    def _unexplained(design: Design, resid: Array, chosen: IntArray, inv: Array, phi: float) -> Estimate:
        """``Σ_j α_j k / h̄`` with ``Var α = φ (D⁻¹ + D⁻¹ U' Cov(Ĉ) U D⁻¹)`` (D: cohort weights)."""
        k, h = design.k, design.h
        h_bar = k * (1.0 - (1.0 - 1.0 / k) ** h)
        alpha = design.intercepts(resid)
        with np.errstate(divide="ignore", invalid="ignore"):
            d_inv = np.where(design.cohort_weight > 0, 1.0 / design.cohort_weight, 0.0)
        scale = k / h_bar
        value = scale * float(alpha.sum())
        var = float(d_inv.sum())
        if chosen.size:
            v = design.col_u[chosen] @ d_inv  # U D⁻¹ 1 over the selected columns
            var += float(v @ inv @ v)
        return Estimate(value, scale * math.sqrt(max(phi * var, 0.0)), int(design.n_j.sum()))

    def _empty(self, cands: tuple[str | bytes, ...], n: int) -> RapporDecoding:
        m_count = len(cands)
        zeros = np.zeros(m_count)
        return RapporDecoding(
            candidates=cands,
            counts=zeros,
            standard_errors=np.full(m_count, np.inf),
            z=zeros.copy(),
            p_values=np.ones(m_count),
            selected=np.zeros(m_count, dtype=np.bool_),
            detected=np.zeros(m_count, dtype=np.bool_),
            n=n,
            unexplained=Estimate(float(n), math.inf, n),
            control=self.control,
            alpha=self.alpha,
            confidence=self.confidence,
            selection_z=math.nan,
            dispersion=math.nan,
            lasso_selected=0,
            widened=np.zeros(m_count, dtype=np.bool_),
        )


def _pool(a: _Fit, b: _Fit) -> _Fit:
    """Two fits on disjoint cohorts pooled with the weights of their model variances (which depend
    on the design alone; an infinite variance weighs nothing): the pooled estimate's model variance
    is ``1 / (w_a + w_b)`` and its residual variance ``(w_a² V_a + w_b² V_b) / (w_a + w_b)²``, on
    ``(w_a + w_b)² / (w_a²/ν_a + w_b²/ν_b)`` degrees of freedom (Satterthwaite: ``V_a`` expects
    ``1/w_a``); the test of :attr:`_Fit.se` is made once, after pooling. Their unexplained counts, each over its own
    cohorts, add up."""
    with np.errstate(divide="ignore", invalid="ignore"):
        wa = np.where(np.isfinite(a.model) & (a.model > 0), 1.0 / a.model, 0.0)
        wb = np.where(np.isfinite(b.model) & (b.model > 0), 1.0 / b.model, 0.0)
        total = wa + wb
        counts = np.where(total > 0, (wa * a.counts + wb * b.counts) / total, 0.0)
        model = np.where(total > 0, 1.0 / total, np.inf)
        robust = np.where(total > 0, (wa**2 * np.nan_to_num(a.robust) + wb**2 * np.nan_to_num(b.robust)) / total**2, 0)
        spread = np.where(wa > 0, wa**2 / a.dof, 0.0) + np.where(wb > 0, wb**2 / b.dof, 0.0)
        dof = np.where(spread > 0, total**2 / np.where(spread > 0, spread, 1.0), np.inf)
    unexplained = Estimate(
        a.unexplained.value + b.unexplained.value,
        math.hypot(a.unexplained.standard_error, b.unexplained.standard_error),
        a.unexplained.n + b.unexplained.n,
    )
    return _Fit(
        counts=counts,
        model=model,
        robust=np.where(np.isnan(a.robust) & np.isnan(b.robust), np.nan, robust),
        dof=dof,
        selected=a.selected | b.selected,
        dispersion=max(a.dispersion, b.dispersion),
        unexplained=unexplained,
    )


@dataclass(frozen=True, eq=False)
class _Fit:
    """One fit's estimates: ``model`` is the variance the model gives (times ``φ`` when the
    residuals are not used), ``robust`` the residuals' (NaN when not computed) on ``dof``
    degrees of freedom; the standard error is the square root of the residuals' variance where
    it passes the test of :func:`~collector.decoding.residual_variance.excess_threshold`, of the
    model's otherwise (docs/estimation.md, "RAPPOR: what the candidates do not explain")."""

    counts: Array
    model: Array
    robust: Array
    dof: Array
    selected: BoolArray
    dispersion: float
    unexplained: Estimate

    @cached_property
    def widened(self) -> BoolArray:
        """Where the standard error is the residuals' variance (significantly above the model's)."""
        out: BoolArray = np.nan_to_num(self.robust) > self.model * excess_threshold(self.dof)
        return out

    @cached_property
    def se(self) -> Array:
        """The standard errors (the class docstring)."""
        # Never below the coins' own variance; the residuals' where they show significantly more
        # (their noise alone passes the test 5 % of the time, which costs 2 % of variance on
        # average at 64 cells, against 7 % for the larger of the two).
        variance = np.where(self.widened, self.robust, self.model)
        out: Array = np.sqrt(variance)
        return out

    @cached_property
    def z(self) -> Array:
        """``count / SE`` (0 where the SE is infinite; ±inf where it is 0)."""
        se = self.se
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(se > 0, self.counts / se, np.where(self.counts > 0, np.inf, 0.0))
        out: Array = np.where(np.isfinite(se), z, 0.0)
        return out

    @cached_property
    def p(self) -> Array:
        """One-sided p-values of ``count > 0``."""
        return normal_sf(self.z)
