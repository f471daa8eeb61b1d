"""The sparse weighted regression behind RAPPOR decoding (:mod:`collector.decoding.rappor`).

The decoder regresses the per-cohort bit estimates ``t_ij`` on the candidates' columns with
one free intercept per cohort, weighted by the inverse variances. :class:`Design` holds the
columns in sparse form (a column has ``cohorts·h`` non-zeros) with the intercepts profiled
out; :func:`lasso` is the non-negative weighted Lasso that selects candidates and :func:`wls`
the weighted least squares that refits them.

The Lasso is solved by pathwise coordinate descent with covariance updates, warm starts and
the sequential strong rule, checked against the KKT conditions of every candidate (Friedman,
Hastie and Tibshirani, J. Stat. Softw. 33(1), 2010; Tibshirani et al., J. R. Stat. Soc. B
74:245-266, 2012). The solver is this module's own rather than scikit-learn's
``Lasso(positive=True)`` for a measured reason: a column has ``cohorts·h`` non-zeros, but
profiling out the intercepts makes it dense, and a dense design is what a general solver
needs. At the deployed ``homepage`` size (32 cohorts, ``k = 128``, 8,616 candidates, 004
§5.4) the dense design alone is 4,096 × 8,616 float64s, and scikit-learn was several times
slower in tens of times the memory, selecting the same candidates; at 004 §5.2's size (16
cohorts, 200 candidates) either takes milliseconds (``python -m benchmarks.bench_lasso``;
docs/benchmarks.md, "The RAPPOR decoder's Lasso against scikit-learn").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collector.decoding.arrays import Array, IntArray

__all__ = ["Design", "lasso", "weights_from", "wls"]

_PATH_STEPS = 8
"""Penalties on the Lasso path from the largest score down to λ (geometric)."""
_CD_TOLERANCE = 1e-4
"""Coordinate descent stops when no coefficient moves its fit by more than this (z units)."""
_CD_SWEEPS = 500


@dataclass(eq=False)
class Design:
    """The candidates' columns ``A_c,ij = X_cji N_j / N`` in sparse form, and the weights.

    ``rows[c]`` lists the ``cohorts·h`` row numbers ``j·k + i`` of column ``c`` and
    ``vals[c]`` the matching entries (0 for a repeated bit or an empty cohort), so
    ``A β = bincount(rows, vals β)`` and ``A' v = Σ vals v[rows]``.
    """

    rows: IntArray
    vals: Array
    cohorts: int
    k: int
    h: int
    y: Array
    n_j: Array
    weights: Array = field(init=False)
    cohort_weight: Array = field(init=False)
    col_u: Array = field(init=False)
    col_norm2: Array = field(init=False)

    @property
    def size(self) -> int:
        """The number of rows, ``cohorts·k``."""
        return self.cohorts * self.k

    def set_weights(self, weights: Array) -> None:
        """Weigh the rows by ``weights`` and recompute what depends on them (cohort sums, column norms)."""
        self.weights = weights
        self.cohort_weight = weights.reshape(self.cohorts, self.k).sum(axis=1)
        wv = self.vals * weights[self.rows]
        # u[c, j] = Σ_{rows of c in cohort j} w a: the column's weighted sum in each cohort.
        self.col_u = wv.reshape(len(self.rows), self.cohorts, self.h).sum(axis=2)
        raw = (wv * self.vals).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(self.cohort_weight > 0, 1.0 / self.cohort_weight, 0.0)
        self.col_norm2 = np.maximum(raw - (self.col_u**2 * inv).sum(axis=1), 0.0)

    def center(self, v: Array) -> Array:
        """``P v``: ``v`` minus its weighted mean within each cohort (the intercepts profiled out)."""
        w = self.weights.reshape(self.cohorts, self.k)
        vv = v.reshape(self.cohorts, self.k)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(self.cohort_weight > 0, (w * vv).sum(axis=1) / self.cohort_weight, 0.0)
        out: Array = (vv - mean[:, None]).reshape(-1)
        return out

    def intercepts(self, residual: Array) -> Array:
        """The per-cohort intercepts ``α_j`` that the centring removes from ``residual``."""
        w = self.weights.reshape(self.cohorts, self.k)
        sums = (w * residual.reshape(self.cohorts, self.k)).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out: Array = np.where(self.cohort_weight > 0, sums / self.cohort_weight, 0.0)
        return out

    def scores(self, residual: Array, columns: IntArray | None = None) -> Array:
        """``A_c' W P r`` for the given columns (all by default)."""
        wr = self.weights * self.center(residual)
        if columns is None:
            out: Array = (self.vals * wr[self.rows]).sum(axis=1)
            return out
        some: Array = (self.vals[columns] * wr[self.rows[columns]]).sum(axis=1)
        return some

    def predict(self, columns: IntArray, coef: Array) -> Array:
        """``A_S β``."""
        if columns.size == 0:
            return np.zeros(self.size)
        contrib = self.vals[columns] * coef[:, None]
        out: Array = np.bincount(self.rows[columns].ravel(), weights=contrib.ravel(), minlength=self.size).astype(
            np.float64
        )
        return out

    def gram(self, columns: IntArray) -> Array:
        """``(P A_S)' W (P A_S)`` for the columns ``S``, from the pairs of columns sharing a row.

        A cell holds a handful of the selected columns (``|S| h / k`` per cohort on average),
        so the pairs are few; they are enumerated with the columns grouped by row.
        """
        s = columns.size
        if s == 0:
            return np.zeros((0, 0))
        rows = self.rows[columns].ravel()
        vals = self.vals[columns].ravel()
        local = np.repeat(np.arange(s, dtype=np.int64), self.rows.shape[1])
        keep = vals != 0
        rows, vals, local = rows[keep], vals[keep], local[keep]
        order = np.argsort(rows, kind="stable")
        rows, vals, local = rows[order], vals[order], local[order]
        counts = np.bincount(rows, minlength=self.size)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rank = np.arange(rows.size) - starts[rows]
        width = int(counts.max()) if counts.size else 0
        pad_col = np.full((self.size, width), -1, dtype=np.int64)
        pad_val = np.zeros((self.size, width))
        pad_col[rows, rank] = local
        pad_val[rows, rank] = vals * np.sqrt(self.weights[rows])
        flat = np.zeros(s * s)
        for a in range(width):
            ca = pad_col[:, a]
            live = ca >= 0
            if not live.any():
                break
            cb = pad_col[live]
            prod = pad_val[live, a][:, None] * pad_val[live]
            ok = cb >= 0
            idx = (ca[live][:, None] * s + cb)[ok]
            flat += np.bincount(idx, weights=prod[ok], minlength=s * s)
        g = flat.reshape(s, s)
        u = self.col_u[columns]
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(self.cohort_weight > 0, 1.0 / self.cohort_weight, 0.0)
        g -= (u * inv) @ u.T
        return g


def weights_from(variances: Array, n_j_rows: Array) -> Array:
    """Inverse variances, 0 where a cohort has no reports or a variance is 0 (such rows carry no weight)."""
    with np.errstate(divide="ignore"):
        out: Array = np.where((n_j_rows > 0) & (variances > 0), 1.0 / variances, 0.0)
    return out


def _coordinate_descent(gram: Array, corr: Array, coef: Array, penalty: Array) -> None:
    """Coordinate descent on ``½ β'Gβ - b'β + penalty'β``, ``β >= 0``, in place.

    ``corr`` holds ``b - Gβ`` for the current ``coef`` and is kept up to date.
    """
    diag = np.diag(gram).copy()
    scale = np.sqrt(np.maximum(diag, 0.0))
    for _ in range(_CD_SWEEPS):
        visit = np.flatnonzero(((coef > 0) | (corr > penalty)) & (diag > 0))
        biggest = 0.0
        for c in visit.tolist():
            old = coef[c]
            new = old + (corr[c] - penalty[c]) / diag[c]
            new = max(new, 0.0)
            delta = new - old
            if delta != 0.0:
                coef[c] = new
                corr -= gram[c] * delta
                moved = abs(delta) * scale[c]
                biggest = max(biggest, moved)
        if biggest < _CD_TOLERANCE:
            return


def lasso(design: Design, lam: float) -> Array:
    """The non-negative weighted Lasso of :mod:`collector.decoding.rappor` at penalty ``λ`` (z units)."""
    m_count = design.rows.shape[0]
    norms = np.sqrt(design.col_norm2)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_norm = np.where(norms > 0, 1.0 / norms, 0.0)
    coef = np.zeros(m_count)
    z = design.scores(design.y) * inv_norm
    top = float(z.max()) if m_count else 0.0
    if top <= lam:
        return coef
    active = np.zeros(m_count, dtype=np.bool_)
    path = top * (lam / top) ** (np.arange(1, _PATH_STEPS + 1) / _PATH_STEPS)
    previous = top
    for level in path:
        # Sequential strong rule: a column whose score is below 2λ - λ_prev is unlikely to enter.
        work = active | (z >= 2 * level - previous)
        while True:
            cols = np.flatnonzero(work)
            gram = design.gram(cols)
            local = coef[cols].copy()
            corr = design.scores(design.y, cols) - gram @ local
            _coordinate_descent(gram, corr, local, level * norms[cols])
            coef[cols] = local
            resid = design.y - design.predict(cols, local)
            z = design.scores(resid) * inv_norm
            # KKT: a column outside the working set must not want to enter.
            violators = (~work) & (z > level * (1 + 1e-9)) & (norms > 0)
            if not violators.any():
                break
            work |= violators
        active = coef > 0
        previous = level
    return coef


def wls(design: Design, chosen: IntArray) -> tuple[Array, Array]:
    """Weighted least squares of ``y`` on the chosen columns and the intercepts.

    Returns the coefficients and ``(X'WX)^-1`` restricted to the columns (the intercepts are
    profiled out, so this block is exactly the columns' part of the full inverse).
    """
    if chosen.size == 0:
        return np.zeros(0), np.zeros((0, 0))
    gram = design.gram(chosen)
    rhs = design.scores(design.y, chosen)
    try:
        chol = np.linalg.cholesky(gram)
        eye = np.eye(chosen.size)
        lower_inv = np.linalg.solve(chol, eye)
        inv = lower_inv.T @ lower_inv
    except np.linalg.LinAlgError:
        # Two candidates with the same bits in every cohort cannot be told apart; the
        # pseudo-inverse splits their count, and their standard errors say so.
        inv = np.linalg.pinv(gram)
    coef: Array = inv @ rhs
    return coef, inv
