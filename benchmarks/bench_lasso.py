"""The RAPPOR decoder's own Lasso against scikit-learn's, on the decoder's problem sizes.

Run: ``python -m benchmarks.bench_lasso [--only 5.2|homepage] [--repeat 3] [--scale F]``. Prints
JSON on stdout (progress on stderr). The comparison needs scikit-learn, which no extra of the
project installs (``pip install scikit-learn``); without it the script says so and times the
own solver alone. ``--scale`` multiplies the number of reports simulated (the problem's size,
its rows and candidates, stays the same; the tests run it at a tenth).

Both solve the first Lasso of :func:`collector.decoding.rappor.RapporDecoder.decode_bits`
(weights at ``μ = 0``, ``λ = Φ^-1(1 - 1/M)``)::

    minimise ½ Σ w_ij (t_ij - Σ_c C_c A_c,ij - α_j)² + λ Σ_c s_c C_c   over C >= 0, α free.

For scikit-learn the intercepts are profiled out (each cohort's rows centred on their
weighted mean), the rows multiplied by ``sqrt(w)`` and column ``c`` divided by ``s_c``, so with
``b_c = s_c C_c`` the problem is ``½ ||y' - X b||² + λ ||b||_1``, ``b >= 0``: scikit-learn's
``Lasso(alpha=λ / rows, positive=True, fit_intercept=False)``. The centred design is dense
(every column touches every cohort), which is what scikit-learn needs in memory; the own
solver keeps the ``cohorts·h`` non-zeros of each column and forms the Gram matrix of the
working set only.

Problems (the settings of :mod:`benchmarks.bench_decoding_rappor`):

* ``5.2``: 004 §5.2, ``k = 128, h = 2``, 16 cohorts, 200 candidates, 10^6 reports.
* ``homepage``: the deployed use case (``deploy/usecases.example.toml``, 004 §5.4):
  ``k = 128, h = 2``, 32 cohorts, 8,616 candidates (1,000 present, Zipf(1)), 4·10^6 reports.

Printed per problem: wall time (best of ``--repeat``; scikit-learn's includes building its
dense design, which is also printed alone), peak memory (``tracemalloc``: numpy's
allocations, which is where both put their arrays), the selected sets' sizes and their
symmetric difference, the largest coefficient difference in ``z`` units (``s_c |ΔC_c|``) and
the objective each reaches. ``checks`` says whether the own solver reaches the reference
optimum: the same selected set, and an objective within a relative 1e-9 of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.bench_decoding_rappor import _aggregate, _population
from benchmarks.harness import emit, progress
from collector.decoding.lasso import Design, lasso, weights_from
from collector.decoding.rappor import RapporDecoder, _design, _variances
from protocol.rappor import Rappor
from protocol.server.rappor import RapporServer

Array = np.ndarray


def _problem(name: str, scale: float = 1.0) -> tuple[Design, float]:
    """The decoder's design with its first weights, and its ``λ`` (``scale`` times the reports)."""
    if name == "5.2":
        names = [f"v{i}" for i in range(1, 201)]
        weights = np.exp(-np.arange(1, 101) / 20.0)
        params: dict[str, Any] = {"k": 128, "h": 2, "cohorts": 16, "f": 0.5, "p": 0.5, "q": 0.75}
        n = 1_000_000
    else:
        names = [f"homepage-{i}.example" for i in range(8616)]
        np.random.default_rng(54).shuffle(names)
        weights = 1.0 / np.arange(1, 1001)
        params = {"k": 128, "h": 2, "cohorts": 32, "f": 0.75, "p": 0.5, "q": 0.75}
        n = 4_000_000
    n = round(n * scale)
    mech = Rappor(seed=f"bench-lasso/rappor/{name}/1".encode(), **params)
    values, _ = _population(weights, n, names[: weights.size], np.random.default_rng(1))
    bits = _aggregate(mech, values, 1).estimate_bits()
    design = _design(RapporServer(mech), bits, names)
    one, zero = mech.coordinate_probabilities("report")
    n_j_rows = np.repeat(design.n_j, design.k)
    design.set_weights(weights_from(_variances(design, np.zeros(design.size), float(one), float(zero)), n_j_rows))
    return design, RapporDecoder()._selection_z(len(names))


def _dense_problem(design: Design) -> tuple[Array, Array, Array]:
    """``X`` (Fortran order, as scikit-learn's coordinate descent wants it), ``y'`` and ``s``."""
    m_count = design.rows.shape[0]
    norms = np.sqrt(design.col_norm2)
    a = np.zeros((design.size, m_count), order="F")
    cols = np.repeat(np.arange(m_count), design.rows.shape[1])
    np.add.at(a, (design.rows.ravel(), cols), design.vals.ravel())
    # Row j·k + i is bit i of cohort j; in Fortran order the view is indexed [i, j, c].
    w = design.weights.reshape(design.cohorts, design.k).T
    cw = np.where(design.cohort_weight > 0, design.cohort_weight, 1.0)
    cube = a.reshape(design.k, design.cohorts, m_count, order="F")
    assert np.shares_memory(cube, a)
    means = np.einsum("ij,ijc->jc", w, cube) / cw[:, None]
    cube -= means[None, :, :]
    sw = np.sqrt(design.weights)
    a *= sw[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        a *= np.where(norms > 0, 1.0 / norms, 0.0)[None, :]
    y = sw * design.center(design.y)
    return a, y, norms


def _objective(x: Array, y: Array, b: Array, lam: float) -> float:
    r = y - x @ b
    return float(0.5 * r @ r + lam * b.sum())


def _measure(fn: Callable[[], Array], repeat: int) -> tuple[Array, float, int]:
    best = float("inf")
    out = np.zeros(0)
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, best, peak


OBJECTIVE_EXCESS_MAX = 1e-9
"""The own solver's largest objective above the reference optimum, relative to it."""


def bench(name: str, repeat: int, *, scale: float = 1.0) -> dict[str, Any]:
    """One problem: the own solver, and the comparison with scikit-learn when it is installed."""
    progress(f"{name}: simulating the reports")
    design, lam = _problem(name, scale)
    progress(f"{name}: own solver")
    c_own, t_own, m_own = _measure(lambda: lasso(design, lam), repeat)
    row: dict[str, Any] = {
        "rows": design.size,
        "candidates": int(design.rows.shape[0]),
        "cohorts": design.cohorts,
        "lambda_z": lam,
        "own": {
            "seconds": t_own,
            "peak_mib": m_own / 2**20,
            "design_mib": (design.rows.nbytes + design.vals.nbytes) / 2**20,
            "selected": int((c_own > 0).sum()),
        },
    }
    if importlib.util.find_spec("sklearn") is not None:
        row |= _against_sklearn(name, design, lam, c_own, t_own, m_own, repeat)
    return row


def _against_sklearn(  # noqa: PLR0917 - the own solver's results, passed on as measured
    name: str, design: Design, lam: float, c_own: Array, t_own: float, m_own: int, repeat: int
) -> dict[str, Any]:
    from sklearn.linear_model import Lasso  # noqa: PLC0415 - scikit-learn is in no extra; bench() checks for it

    rows = design.size

    def sk(tol: float) -> Callable[[], Array]:
        def run() -> Array:
            x, y, norms = _dense_problem(design)
            model = Lasso(alpha=lam / rows, positive=True, fit_intercept=False, copy_X=False, tol=tol, max_iter=100_000)
            model.fit(x, y)
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(norms > 0, model.coef_ / norms, 0.0)

        return run

    progress(f"{name}: scikit-learn Lasso (tol 1e-4, its default)")
    c_sk, t_sk, m_sk = _measure(sk(1e-4), repeat)
    progress(f"{name}: scikit-learn Lasso (tol 1e-10, the reference optimum)")
    c_ref = sk(1e-10)()
    start = time.perf_counter()
    x, y, norms = _dense_problem(design)
    t_build = time.perf_counter() - start
    sel_own, sel_sk, sel_ref = c_own > 0, c_sk > 0, c_ref > 0
    obj = {key: _objective(x, y, c * norms, lam) for key, c in (("own", c_own), ("sklearn", c_sk), ("ref", c_ref))}
    excess = {key: (obj[key] - obj["ref"]) / abs(obj["ref"]) for key in ("own", "sklearn")}
    return {
        "sklearn": {
            "seconds": t_sk,
            "peak_mib": m_sk / 2**20,
            "design_mib": x.nbytes / 2**20,
            "of_which_dense_design_seconds": t_build,
            "selected": int(sel_sk.sum()),
        },
        "speedup_own_vs_sklearn": t_sk / t_own,
        "memory_ratio_sklearn_vs_own": m_sk / max(m_own, 1),
        "selected_symmetric_difference": {
            "own_vs_sklearn": int((sel_own ^ sel_sk).sum()),
            "own_vs_ref": int((sel_own ^ sel_ref).sum()),
            "sklearn_vs_ref": int((sel_sk ^ sel_ref).sum()),
        },
        "max_coef_diff_z": {
            "own_vs_ref": float(np.max(np.abs(c_own - c_ref) * norms)),
            "sklearn_vs_ref": float(np.max(np.abs(c_sk - c_ref) * norms)),
        },
        "objective": obj,
        "objective_excess_rel": excess,
        "checks": {
            "own_selects_the_reference_set": not bool((sel_own ^ sel_ref).any()),
            f"own_objective_excess<={OBJECTIVE_EXCESS_MAX:g}": excess["own"] <= OBJECTIVE_EXCESS_MAX,
        },
    }


def run(repeat: int, *, only: str | None = None, scale: float = 1.0) -> dict[str, Any]:
    """The problems asked for (``only``: one of them); the JSON document."""
    have_sklearn = importlib.util.find_spec("sklearn") is not None
    if not have_sklearn:
        progress("bench_lasso: scikit-learn is not installed (pip install scikit-learn); the own solver alone")
    results: dict[str, Any] = {"numpy_version": np.__version__, "sklearn_version": None}
    if have_sklearn:
        import sklearn  # noqa: PLC0415 - only once it is known installed

        results["sklearn_version"] = sklearn.__version__
    for name in ("5.2", "homepage"):
        if only in (None, name):
            results[name] = bench(name, repeat, scale=scale)
    return results


def main(argv: list[str] | None = None) -> None:
    """Run the problems and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["5.2", "homepage"], help="run one problem")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per solver (best is printed)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of reports (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or not args.scale > 0:
        parser.error("--repeat takes a positive count and --scale a positive factor")
    emit(run(args.repeat, only=args.only, scale=args.scale))


if __name__ == "__main__":
    main()
