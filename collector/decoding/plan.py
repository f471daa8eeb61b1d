"""``ldp-collector plan``: parameters and expected errors from the papers' formulas, before collecting.

For a mechanism, its privacy parameters, a number of reports ``n`` and a target (a standard
error, a high-probability error bound, a device bandwidth, a number of strings to detect),
the verb prints the parameters and what they give, from closed forms only (nothing is
simulated):

* ``rr``: ``SE(π̂) = sqrt(p(1-p)/n) / (2p - 1)``, ``p = e^ε / (1 + e^ε)`` (Warner; :mod:`protocol.randomized_response`).
* ``one-bit-mean`` (000 Thm 1): with probability ``1 - δ`` the mean is within
  ``m / sqrt(2n) · (e^ε + 1)/(e^ε - 1) · sqrt(ln(2/δ))``; the standard error is at most
  ``m / (2 c sqrt n)``, ``c = (e^ε - 1)/(e^ε + 1)`` (000 eq. 2, worst case ``λ = 1/2``). With
  output perturbation γ the report is 1BitMean with ``ε'`` (000 §4), so ``ε'`` replaces ε;
  several counters with a common bound cost ``ε'' = ε' + e^ε' - 1`` (000 Thm 5).
* ``dbitflip`` (000 Thm 2): ``max_v |ĥ(v) - h(v)| <= sqrt(5k/(nd)) · (e^{ε/2}+1)/(e^{ε/2}-1) ·
  sqrt(ln(6k/δ))`` with probability ``1 - δ``; per bucket
  ``SE = sqrt(((k/d)(c + h) - h)/n)``, ``c = e^{ε/2}/(e^{ε/2} - 1)²`` (:mod:`protocol.dbitflip`),
  shown for an empty bucket and a bucket of share ``1/k``.
* ``cms`` (003 Thm 4.2) and ``hcms`` (003 Thm 4.4): ``Var f̃(d) <= (m/(m-1))² (e^{ε/2}/(e^{ε/2}-1)²
  + 1/m + Σf²/(nkm)) n`` and ``(m/(m-1))² (((e^ε+1)/(e^ε-1))² + Σf²/(nkm)) n``, with
  ``Σf² <= F n²`` for ``F`` the share of the most frequent value (``Σ p² <= max p``). Device
  bandwidth (003 §5) ``M_CMS = log2 k + m`` and ``M_HCMS = log2 k + log2 m + 1`` bits;
  server cost ``T_CMS = n m + p k`` and ``T_HCMS = n + k m log2 m + p k`` (``p``: dictionary
  size; operations, up to constant factors). Given a target SE or a bandwidth, the verb
  searches powers of two for ``k`` and prints the cheapest choices.
* ``sfp``: the word sketch is a CMS over ``n`` reports and each fragment sketch a CMS over
  the ``n / positions`` reports that chose its position (003 §4.3); ``ε + ε'`` per report
  (003 Thm 4.5). :func:`sfp_top_t` chooses Alg. 10's ``T`` (pieces kept per position): the
  collector's default when a use case sets no ``collector.top_t``.
* ``rappor`` (004 §3, §4, Appendix): ``ε∞ = 2h ln((1 - f/2)/(f/2))`` (Thm 1),
  ``ε1 = h ln(q*(1-p*)/(p*(1-q*)))`` (Thm 2); under ``H0`` a bit count has
  ``sd(T̂) = sqrt(p*(1-p*) N)/(q* - p*)`` (Appendix); Bonferroni over ``M`` tests gives
  ``Q = Φ^-1(1 - α/M)`` and the Appendix's upper limit on the number of strings that can be
  detected, ``x <= N / (Q sd(T̂)) = (q* - p*) sqrt N / (Q sqrt(p*(1-p*)))`` (``(2q - 1) sqrt N / Q``
  at ``p = 1/2``, ``f = 0``). A Bloom-decoded count averages the ``h̄`` distinct bits of a
  candidate in each cohort, so its SE is about ``sqrt(p*(1-p*) N / h̄)/(q* - p*)``
  (``h̄ = k (1 - (1 - 1/k)^h)``; selected columns add a few percent, see
  :mod:`collector.decoding.rappor`). Given a number of strings or a share to detect, the
  verb solves for ``N``.

* ``use-case``: any registered mechanism, as a registry configures it: the figures its module
  states (:meth:`protocol.interfaces.Mechanism.plan`: the standard error of its headline
  estimate from the paper's variance formula, its ε figures), at ``n`` reports or solved for
  a target standard error. Nothing here knows the mechanism: a mechanism added to the table
  of :mod:`protocol.interfaces` is planned the same way (:func:`plan_use_case`).

The standard errors of ``rr``, ``dbitflip``, ``cms``, ``hcms`` and ``sfp`` are computed by the
mechanism modules themselves (``plan`` and ``variance_bound``), so the planner and the
estimators cannot drift apart; the planner keeps the algebra that solves for a parameter.

Entry point: :func:`main` (``ldp-collector plan MECHANISM ...``); :func:`plan` returns the
same result as a dictionary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from collector.decoding.stats import normal_quantile
from protocol.buckets import LinearBuckets
from protocol.cms import CountMeanSketch
from protocol.dbitflip import DBitFlip
from protocol.errors import ParameterError
from protocol.hcms import HadamardCountMeanSketch
from protocol.interfaces import as_discovery
from protocol.randomized_response import RandomizedResponse
from protocol.registry import RegistryError, UseCase
from protocol.server.cms import CMSServer
from protocol.server.contract import DiscoveryServer, server_of
from protocol.server.hcms import HCMSServer
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry

__all__ = ["MECHANISMS", "PlanError", "build_parser", "discovery_top_t", "main", "plan", "plan_use_case", "sfp_top_t"]

MECHANISMS: tuple[str, ...] = ("rr", "one-bit-mean", "dbitflip", "cms", "hcms", "sfp", "rappor")

Result = dict[str, Any]
T = TypeVar("T")

_K_POWERS = range(25)
"""Powers of two tried for the sketch's number of hash functions ``k``."""
_M_MAX = 1 << 20


class PlanError(ValueError):
    """A plan cannot be made from the given inputs (the message says what to change)."""


def _need(value: float | int | None, name: str) -> float:
    if value is None:
        raise PlanError(f"--{name.replace('_', '-')} is required here")
    return float(value)


def _positive(value: float | int | None, name: str) -> None:
    if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
        raise PlanError(f"--{name.replace('_', '-')} must be a positive number; got {value!r}")


def _ceil_n(x: float) -> int:
    if not math.isfinite(x):
        raise PlanError("the target cannot be reached with these parameters at any n")
    return max(1, math.ceil(x - 1e-9))


# ------------------------------------------------------------------------- rr


def _mechanism(build: Callable[[], T]) -> T:
    """A mechanism built from the command line's numbers; its own refusal becomes a PlanError."""
    try:
        return build()
    except (ParameterError, ValueError) as exc:
        raise PlanError(str(exc)) from None


def _plan_rr(a: argparse.Namespace) -> Result:
    eps = _need(a.epsilon, "epsilon")
    mech = _mechanism(lambda: RandomizedResponse(epsilon=eps))
    p = mech.keep_probability
    unit = server_of(mech).plan(1.0).standard_error  # SE · sqrt(n), the module's formula
    out: Result = {"mechanism": "rr", "epsilon": eps, "keep_probability": p}
    n = a.n
    if a.target_se is not None:
        n = _ceil_n((unit / a.target_se) ** 2)
        out["solved"] = {"n": n}
    n = _need(n, "n")
    out["n"] = int(n)
    out["standard_error"] = unit / math.sqrt(n)
    out["formulas"] = ["SE(proportion) = sqrt(p(1-p)/n)/(2p-1), p = e^eps/(1+e^eps)"]
    return out


# --------------------------------------------------------------- one-bit-mean


def _eps_prime(eps: float, gamma: float) -> float:
    if gamma == 0:
        return eps
    e = math.exp(eps)
    hi = (1 - 2 * gamma) * e / (e + 1) + gamma
    lo = (1 - 2 * gamma) / (e + 1) + gamma
    return math.log(hi / lo)


def _plan_one_bit_mean(a: argparse.Namespace) -> Result:
    m = _need(a.m, "m")
    gamma = float(a.gamma)
    if not 0 <= gamma < 0.5:
        raise PlanError(f"--gamma must lie in [0, 0.5); got {gamma}")
    delta = float(a.delta)
    log_term = math.sqrt(math.log(2 / delta))
    out: Result = {"mechanism": "one-bit-mean", "m": m, "gamma": gamma, "delta": delta}
    eps, n = a.epsilon, a.n
    target_se, target_err = a.target_se, a.target_error

    def c_of(eps_: float) -> float:
        return math.tanh(_eps_prime(eps_, gamma) / 2)  # (e^ε'-1)/(e^ε'+1)

    if eps is None:
        n_ = _need(n, "n")
        if target_se is not None:
            c_needed = m / (2 * target_se * math.sqrt(n_))
        elif target_err is not None:
            c_needed = m * log_term / (target_err * math.sqrt(2 * n_))
        else:
            raise PlanError("give --epsilon, or --n with --target-se or --target-error to solve for epsilon")
        # c = (1 - 2γ) tanh(ε/2) (000 §4: the perturbed report is 1BitMean with ε').
        t = c_needed / (1 - 2 * gamma)
        if t >= 1:
            raise PlanError("the target is out of reach at this n (even as epsilon grows); raise --n")
        eps = 2 * math.atanh(t)
        out["solved"] = {"epsilon": eps}
    c = c_of(eps)
    if n is None:
        if target_se is not None:
            n = _ceil_n((m / (2 * c * target_se)) ** 2)
        elif target_err is not None:
            n = _ceil_n((m * log_term / (c * target_err * math.sqrt(2))) ** 2)
        else:
            raise PlanError("give --n, or a target (--target-se or --target-error) to solve for n")
        out["solved"] = {"n": n}
    out.update(
        {
            "epsilon": eps,
            "epsilon_report": _eps_prime(eps, gamma),
            "epsilon_counters": _eps_prime(eps, gamma) + math.expm1(_eps_prime(eps, gamma)),
            "n": int(n),
            "standard_error_max": m / (2 * c * math.sqrt(n)),
            "error_bound": m / math.sqrt(2 * n) / c * log_term,
            "formulas": [
                "000 Thm 1: |mean error| <= m/sqrt(2n) (e^eps'+1)/(e^eps'-1) sqrt(ln(2/delta)) w.p. 1-delta",
                "SE <= m/(2c sqrt n), c = (e^eps'-1)/(e^eps'+1); eps' = eps without perturbation (000 §4)",
                "000 Thm 5: counters sharing the bound cost eps'' = eps' + e^eps' - 1",
            ],
        }
    )
    return out


# ------------------------------------------------------------------ dbitflip


def _dbitflip_numbers(eps: float, k: int, d: int, n: float, delta: float) -> dict[str, float]:
    a = math.exp(eps / 2)
    # The per-bucket SEs are the module's (protocol.dbitflip.DBitFlip.plan); the buckets' edges
    # do not enter them, only their number.
    mech = _mechanism(lambda: DBitFlip(epsilon=eps, buckets=LinearBuckets(low=0, high=k, count=k), d=d, memoize=False))
    figures = server_of(mech).plan(n)
    return {
        "standard_error_empty_bucket": figures.figures["standard_error_empty_bucket"],
        "standard_error_uniform_bucket": figures.standard_error,
        "error_bound": math.sqrt(5 * k / (n * d)) * (a + 1) / (a - 1) * math.sqrt(math.log(6 * k / delta)),
    }


def _plan_dbitflip(a: argparse.Namespace) -> Result:
    eps = _need(a.epsilon, "epsilon")
    k = int(_need(a.k, "k"))
    delta = float(a.delta)
    out: Result = {"mechanism": "dbitflip", "epsilon": eps, "k": k, "delta": delta}
    target = a.target_se if a.target_se is not None else a.target_error
    key = "standard_error_uniform_bucket" if a.target_se is not None else "error_bound"
    d, n = a.d, a.n
    if d is None and n is not None and target is not None:
        for cand in range(1, k + 1):
            if _dbitflip_numbers(eps, k, cand, n, delta)[key] <= target:
                d = cand
                break
        if d is None:
            raise PlanError(f"even d = k = {k} misses the target at n = {n}; raise --n or --epsilon")
        out["solved"] = {"d": d}
    d = int(_need(d, "d"))
    if not 1 <= d <= k:
        raise PlanError(f"--d must lie in [1, k = {k}]; got {d}")
    if n is None:
        if target is None:
            raise PlanError("give --n, or a target (--target-se or --target-error) to solve for n")
        per_n = _dbitflip_numbers(eps, k, d, 1.0, delta)[key]  # the value at n = 1, scales as 1/sqrt(n)
        n = _ceil_n((per_n / target) ** 2)
        out["solved"] = {"n": n}
    out.update({"d": d, "n": int(n)})
    out.update(_dbitflip_numbers(eps, k, d, n, delta))
    out["epsilon_report"] = eps if d >= 2 else eps / 2
    out["bits_per_report"] = d
    out["wire_bits_per_report"] = d * (1 + max(1, math.ceil(math.log2(k))))
    out["formulas"] = [
        "000 Thm 2: max_v |h_hat - h| <= sqrt(5k/(nd)) (e^(eps/2)+1)/(e^(eps/2)-1) sqrt(ln(6k/delta)) w.p. 1-delta",
        "SE(bucket) = sqrt(((k/d)(c + h) - h)/n), c = e^(eps/2)/(e^(eps/2)-1)^2 (fractions of n)",
    ]
    return out


# ------------------------------------------------------------------ cms / hcms


_PLAN_SEED = bytes(16)
"""A public seed for sketches built only to plan: the variance bounds do not depend on it."""


def _sketch_variance(kind: str, *, eps: float, k: int, m: int, n: float, top_share: float) -> float:
    """The module's bound (003 Thm 4.2 / 4.4, ``variance_bound``) with ``Σf² <= F n²``."""
    sketch: CMSServer | HCMSServer
    if kind == "cms":
        sketch = CMSServer(_mechanism(lambda: CountMeanSketch(epsilon=eps, k=k, m=m, seed=_PLAN_SEED)))
    else:
        sketch = HCMSServer(_mechanism(lambda: HadamardCountMeanSketch(epsilon=eps, k=k, m=m, seed=_PLAN_SEED)))
    return float(sketch.variance_bound(n=n, sum_sq=top_share * n * n))


def _bandwidth(kind: str, k: int, m: int) -> float:
    if kind == "cms":
        return math.log2(k) + m
    return math.log2(k) + math.log2(m) + 1


def _server_cost(kind: str, k: int, m: int, n: float, p: int) -> float:
    if kind == "cms":
        return n * m + p * k
    return n + k * m * math.log2(m) + p * k


def _sketch_row(kind: str, *, eps: float, k: int, m: int, n: float, top_share: float, p: int) -> Result:
    return {
        "k": k,
        "m": m,
        "standard_error": math.sqrt(_sketch_variance(kind, eps=eps, k=k, m=m, n=n, top_share=top_share)),
        "bandwidth_bits": _bandwidth(kind, k, m),
        "server_cost": _server_cost(kind, k, m, n, p),
    }


def _smallest_m(kind: str, *, eps: float, k: int, n: float, top_share: float, target: float) -> int | None:
    """The smallest valid ``m`` reaching ``target`` at this ``k`` (the SE decreases in ``m``)."""

    def se(m: int) -> float:
        return math.sqrt(_sketch_variance(kind, eps=eps, k=k, m=m, n=n, top_share=top_share))

    ok = [m for m in _m_choices(kind) if se(m) <= target]
    if not ok:
        return None
    if kind == "hcms":
        return ok[0]
    hi = ok[0]
    lo = max(2, hi // 2)
    while lo < hi:  # binary search between the powers of two (CMS takes any m >= 2)
        mid = (lo + hi) // 2
        if se(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _m_choices(kind: str) -> list[int]:
    return [1 << e for e in range(1, _M_MAX.bit_length())]


def _plan_sketch(a: argparse.Namespace, kind: str) -> Result:
    eps = _need(a.epsilon, "epsilon")
    n = _need(a.n, "n")
    p = int(a.dictionary_size)
    share = float(a.top_share)
    if not 0 < share <= 1:
        raise PlanError(f"--top-share must lie in (0, 1]; got {share}")
    out: Result = {"mechanism": kind, "epsilon": eps, "n": int(n), "dictionary_size": p, "top_share": share}
    out["formulas"] = [
        "003 Thm 4.2 (cms): Var <= (m/(m-1))^2 (e^(eps/2)/(e^(eps/2)-1)^2 + 1/m + F n/(k m)) n"
        if kind == "cms"
        else "003 Thm 4.4 (hcms): Var <= (m/(m-1))^2 (((e^eps+1)/(e^eps-1))^2 + F n/(k m)) n",
        "003 §5: bandwidth log2 k + m (cms), log2 k + log2 m + 1 (hcms); server cost n m + p k (cms), "
        "n + k m log2 m + p k (hcms)",
        "F = share of the most frequent value (sum f^2 <= F n^2)",
    ]
    if a.k is not None and a.m is not None:
        k, m = int(a.k), int(a.m)
        if k < 1 or m < 2 or (kind == "hcms" and m & (m - 1)):
            raise PlanError("--k >= 1 and --m >= 2 (a power of two for hcms)")
        out.update(_sketch_row(kind, eps=eps, k=k, m=m, n=n, top_share=share, p=p))
        return out
    if a.bandwidth is not None:
        rows, best = _sketch_within_bandwidth(a, kind, eps=eps, n=n, share=share, p=p)
    elif a.target_se is not None:
        rows, best = _sketch_for_target(a, kind, eps=eps, n=n, share=share, p=p)
    else:
        raise PlanError("give --k and --m, or --target-se, or --bandwidth")
    out.update(best)
    out["options"] = sorted(rows, key=lambda r: r["k"])
    out["choice"] = "smallest SE within the bandwidth" if a.bandwidth is not None else "least bandwidth"
    return out


def _sketch_within_bandwidth(
    a: argparse.Namespace, kind: str, *, eps: float, n: float, share: float, p: int
) -> tuple[list[Result], Result]:
    """The (k, m) that fit ``--bandwidth`` (and the cell and SE limits), and the one to take."""
    budget = float(a.bandwidth)
    rows: list[Result] = []
    for e in _K_POWERS:
        k = 1 << e
        if a.k is not None and k != int(a.k):
            continue
        room = budget - e - (0 if kind == "cms" else 1)
        if kind == "cms":
            m = math.floor(room) if a.m is None else int(a.m)
        else:
            m = (1 << math.floor(room)) if a.m is None and room >= 1 else (int(a.m) if a.m else 0)
        if m < 2 or m > _M_MAX or _bandwidth(kind, k, m) > budget + 1e-9:
            continue
        rows.append(_sketch_row(kind, eps=eps, k=k, m=m, n=n, top_share=share, p=p))
    rows = [r for r in rows if r["k"] * r["m"] <= a.max_cells]
    if a.target_se is not None:
        rows = [r for r in rows if r["standard_error"] <= a.target_se]
    if not rows:
        raise PlanError("no (k, m) fits the bandwidth, --max-cells (and the target); raise --bandwidth")
    # Within 1% of the smallest SE the choice hardly matters to the error: take the cheapest server.
    floor = min(r["standard_error"] for r in rows)
    best = min((r for r in rows if r["standard_error"] <= 1.01 * floor), key=lambda r: r["server_cost"])
    return rows, best


def _sketch_for_target(
    a: argparse.Namespace, kind: str, *, eps: float, n: float, share: float, p: int
) -> tuple[list[Result], Result]:
    """The (k, m) that reach ``--target-se`` within ``--max-cells``, and the one with the least bandwidth."""
    rows: list[Result] = []
    for e in _K_POWERS:
        k = 1 << e
        if a.k is not None and k != int(a.k):
            continue
        m_opt = _smallest_m(kind, eps=eps, k=k, n=n, top_share=share, target=a.target_se) if a.m is None else int(a.m)
        if m_opt is None:
            continue
        row = _sketch_row(kind, eps=eps, k=k, m=m_opt, n=n, top_share=share, p=p)
        if row["standard_error"] <= a.target_se and k * m_opt <= a.max_cells:
            rows.append(row)
    if not rows:
        raise PlanError("the target SE is below what any k, m within --max-cells can give at this epsilon and n")
    best = min(rows, key=lambda r: (r["bandwidth_bits"], r["server_cost"]))
    return rows, best


# ------------------------------------------------------------------------ sfp


SFP_MAX_WORDS = 2_000_000
"""Most words one discovery assembles (``protocol.server.sfp.reconstruct``'s ``max_words``)."""


def _touchard(order: int, lam: float) -> float:
    """``E[X^order]`` for ``X ~ Poisson(lam)``: ``Σ_j S(order, j) lam^j`` (Stirling numbers of the 2nd kind)."""
    row = [1]  # S(0, 0)
    for i in range(1, order + 1):
        row = [0] + [j * (row[j] if j < len(row) else 0) + row[j - 1] for j in range(1, i + 1)]
    return math.fsum(float(coef) * lam**j for j, coef in enumerate(row))


def _sfp_errors(
    *, eps: float, eps_f: float, k: int, m: int, kf: int, mf: int, n: float, positions: int, share: float
) -> tuple[float, float]:
    word_se = math.sqrt(_sketch_variance("cms", eps=eps, k=k, m=m, n=n, top_share=share))
    frag_se = math.sqrt(_sketch_variance("cms", eps=eps_f, k=kf, m=mf, n=n / positions, top_share=share))
    return word_se, frag_se


def _smallest_word(
    *, word_se: float, frag_se: float, positions: int, pairs: int, alpha: float, assembled: float
) -> float:
    z_word = normal_quantile(1 - alpha / max(assembled, 1.0))
    z_frag = normal_quantile(1 - 1 / pairs)  # a fragment must beat the largest of the null pairs
    return max(z_word * word_se, positions * z_frag * frag_se)


def sfp_top_t(
    *,
    epsilon: float,
    epsilon_fragment: float,
    k: int,
    m: int,
    k_fragment: int,
    m_fragment: int,
    length: int,
    fragment_length: int,
    n: int,
    alphabet_size: int,
    release_threshold: float = 0.0,
    alpha: float = 0.05,
    assembled: float = 1e4,
    top_share: float = 0.1,
    max_words: int = SFP_MAX_WORDS,
) -> int:
    """003 Alg. 10's ``T``: enough pieces per position to find every word that can be released, at a bounded cost.

    *Enough.* A word can be released only if its count is at least
    ``c_min = max(release_threshold, smallest word found)`` (the smallest word found is the
    larger of the word test's and the fragment test's detection floor, as printed by
    ``plan sfp``), and at most ``n / c_min`` distinct words have that many reports. Each holds
    one (piece, fragment) pair per position; its fragment count is near ``c_min / positions``,
    above every null pair (that is the fragment floor). Words just below ``c_min`` compete for
    the same places through their noise, so ``T`` keeps twice as many: ``2 n / c_min``.

    *Bounded.* The words assembled are ``Σ_w Π_ℓ X_wℓ`` over the 256 puzzle pieces ``w``,
    ``X_wℓ`` the pairs of piece ``w`` kept at position ``ℓ``. The kept pairs' pieces are
    uniform (the piece is a hash), so ``X_wℓ`` is about Poisson with mean ``T / 256``, and a
    piece's words appear at every position together, so the expected number assembled is
    ``256 E[X^positions]`` (the Touchard polynomial). ``T`` is capped where that reaches half
    of ``max_words``, the other half left for the fluctuation of the largest pieces.

    Returns:
        ``T`` (at least 1).
    """
    positions = length // fragment_length
    if n <= 0:
        return 1
    word_se, frag_se = _sfp_errors(
        eps=epsilon,
        eps_f=epsilon_fragment,
        k=k,
        m=m,
        kf=k_fragment,
        mf=m_fragment,
        n=float(n),
        positions=positions,
        share=top_share,
    )
    return _top_t(
        word_se=word_se,
        frag_se=frag_se,
        positions=positions,
        pairs=256 * int(alphabet_size**fragment_length),
        n=n,
        release_threshold=release_threshold,
        alpha=alpha,
        assembled=assembled,
        max_words=max_words,
    )


def discovery_top_t(
    server: DiscoveryServer,
    *,
    n: int,
    alphabet_size: int,
    release_threshold: float = 0.0,
    alpha: float = 0.05,
    assembled: float = 1e4,
    max_words: int = SFP_MAX_WORDS,
) -> int:
    """:func:`sfp_top_t` for a configured discovery mechanism, from its own planner figures.

    The word and fragment standard errors and the number of positions are the mechanism's
    :meth:`~protocol.interfaces.Mechanism.plan` figures (``standard_error``,
    ``fragment_standard_error``, ``positions``; the same 003 Thm 4.2 bounds with
    ``Σf² <= 0.1 n²``); a fragment is ``longest / positions`` characters. A mechanism whose
    figures name no fragments gets ``T = 2 n / max(release_threshold, 1)``, capped as above.
    """
    if n <= 0:
        return 1
    figures = server.plan(float(n))
    positions = max(1, int(figures.figures.get("positions", 1)))
    fragment_length = max(1, as_discovery(server.mechanism).longest // positions)
    return _top_t(
        word_se=figures.standard_error,
        frag_se=float(figures.figures.get("fragment_standard_error", 0.0)),
        positions=positions,
        pairs=256 * int(alphabet_size**fragment_length),
        n=n,
        release_threshold=release_threshold,
        alpha=alpha,
        assembled=assembled,
        max_words=max_words,
    )


def _top_t(
    *,
    word_se: float,
    frag_se: float,
    positions: int,
    pairs: int,
    n: int,
    release_threshold: float,
    alpha: float,
    assembled: float,
    max_words: int,
) -> int:
    floor = _smallest_word(
        word_se=word_se, frag_se=frag_se, positions=positions, pairs=pairs, alpha=alpha, assembled=assembled
    )
    c_min = max(float(release_threshold), floor, 1.0)
    needed = math.ceil(2 * n / c_min)
    lo, hi = 1, max(1, min(needed, pairs))
    if 256 * _touchard(positions, hi / 256) <= max_words / 2:
        return hi
    while lo < hi:  # the assembled count grows with T: the largest T within budget
        mid = (lo + hi + 1) // 2
        if 256 * _touchard(positions, mid / 256) <= max_words / 2:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plan_sfp(a: argparse.Namespace) -> Result:
    eps = _need(a.epsilon, "epsilon")
    eps_f = _need(a.epsilon_fragment, "epsilon_fragment")
    n = _need(a.n, "n")
    k, m = int(a.k), int(a.m)
    kf, mf = int(a.k_fragment), int(a.m_fragment)
    length, fl = int(a.length), int(a.fragment_length)
    if length % fl:
        raise PlanError("--fragment-length must divide --length")
    positions = length // fl
    share = float(a.top_share)
    alpha = float(a.alpha)
    word_se, frag_se = _sfp_errors(eps=eps, eps_f=eps_f, k=k, m=m, kf=kf, mf=mf, n=n, positions=positions, share=share)
    pairs = 256 * int(a.alphabet_size) ** fl
    top_t = sfp_top_t(
        epsilon=eps,
        epsilon_fragment=eps_f,
        k=k,
        m=m,
        k_fragment=kf,
        m_fragment=mf,
        length=length,
        fragment_length=fl,
        n=int(n),
        alphabet_size=int(a.alphabet_size),
        release_threshold=float(a.release_threshold),
        alpha=alpha,
        assembled=float(max(int(a.assembled), 1)),
        top_share=share,
    )
    return {
        "mechanism": "sfp",
        "epsilon": eps,
        "epsilon_fragment": eps_f,
        "epsilon_report": eps + eps_f,
        "n": int(n),
        "positions": positions,
        "word_standard_error": word_se,
        "fragment_standard_error": frag_se,
        "fragment_pairs_per_position": pairs,
        "smallest_word_found": _smallest_word(
            word_se=word_se,
            frag_se=frag_se,
            positions=positions,
            pairs=pairs,
            alpha=alpha,
            assembled=float(max(int(a.assembled), 1)),
        ),
        "top_t": top_t,
        "bandwidth_bits": math.log2(positions) + math.log2(kf) + mf + math.log2(k) + m,
        "formulas": [
            "003 Thm 4.5: eps + eps' per report",
            "word: 003 Thm 4.2 over n reports; fragment: 003 Thm 4.2 over n/positions reports",
            "smallest word found ~ max(z_word SE_word, positions z_frag SE_frag), "
            "z_word = Phi^-1(1 - alpha/assembled), z_frag = Phi^-1(1 - 1/(256 |alphabet|^l))",
            "top_t = min(2 n / max(release threshold, smallest word found), the largest T with "
            "256 E[Poisson(T/256)^positions] <= max_words / 2) (003 Alg. 10's T)",
        ],
    }


# --------------------------------------------------------------------- rappor


def _plan_rappor(a: argparse.Namespace) -> Result:
    k, h, f, p, q = int(a.k), int(a.h), float(a.f), float(a.p), float(a.q)
    variant = a.variant
    if not (0 <= f <= 1 and 0 <= p < q <= 1):
        raise PlanError("need 0 <= f <= 1 and 0 <= p < q <= 1")
    if variant in ("basic", "basic-one-time"):
        h = 1
    if variant in ("one-time", "basic-one-time"):
        q_star, p_star = 1 - f / 2, f / 2
    else:
        q_star, p_star = (1 - f / 2) * q + (f / 2) * p, (f / 2) * q + (1 - f / 2) * p
    if q_star <= p_star:
        raise PlanError("f = 1 leaves no signal (q* = p*)")
    if p_star <= 0 or q_star >= 1:
        raise PlanError(
            f"with f = 0 the {variant} variant reports the Bloom filter itself (no privacy); for one round of "
            "randomization with p and q (004 §5.1 and Appendix) use --variant basic or standard with --f 0"
        )
    eps_inf = math.inf if f == 0 else 2 * h * math.log((1 - f / 2) / (f / 2))
    eps_one = h * math.log(q_star * (1 - p_star) / (p_star * (1 - q_star))) if p_star > 0 and q_star < 1 else math.inf
    tests = int(a.candidates) if a.candidates is not None else k
    alpha = float(a.alpha)
    big_q = normal_quantile(1 - alpha / tests)
    h_bar = 1.0 if variant.startswith("basic") else k * (1 - (1 - 1 / k) ** h)
    unit_bit = math.sqrt(p_star * (1 - p_star)) / (q_star - p_star)  # sd(T̂)/sqrt(N), Appendix
    unit_count = unit_bit / math.sqrt(h_bar)
    out: Result = {
        "mechanism": "rappor",
        "variant": variant,
        "k": k,
        "h": h,
        "cohorts": int(a.cohorts),
        "f": f,
        "p": p,
        "q": q,
        "q_star": q_star,
        "p_star": p_star,
        "epsilon_infinity": eps_inf,
        "epsilon_one": eps_one,
        "tests": tests,
        "alpha": alpha,
        "critical_z": big_q,
    }
    n = a.n
    if n is None:
        if a.target_strings is not None:
            n = _ceil_n((a.target_strings * big_q * unit_count) ** 2)
        elif a.target_share is not None:
            n = _ceil_n((big_q * unit_count / a.target_share) ** 2)
        else:
            raise PlanError("give --n, or --target-strings / --target-share to solve for n")
        out["solved"] = {"n": n}
    n = float(n)
    out.update(
        {
            "n": int(n),
            "bit_sd_under_h0": unit_bit * math.sqrt(n),
            "appendix_max_strings": math.sqrt(n) / (big_q * unit_bit),
            "count_standard_error": unit_count * math.sqrt(n),
            "smallest_count_detected": big_q * unit_count * math.sqrt(n),
            "smallest_share_detected": big_q * unit_count / math.sqrt(n),
            "max_strings_detected": math.sqrt(n) / (big_q * unit_count),
            "formulas": [
                "004 Thm 1: eps_inf = 2h ln((1-f/2)/(f/2)); Thm 2: eps_1 = h ln(q*(1-p*)/(p*(1-q*)))",
                "004 Appendix: sd(T_hat) = sqrt(p*(1-p*) N)/(q*-p*), Q = Phi^-1(1 - alpha/M), "
                "x <= (q*-p*) sqrt N / (Q sqrt(p*(1-p*)))",
                "Bloom count SE ~ sqrt(p*(1-p*) N / h_bar)/(q*-p*), h_bar = k(1-(1-1/k)^h)",
            ],
        }
    )
    return out


# ------------------------------------------------------------------- use case


def plan_use_case(use_case: UseCase, *, n: float | None = None, target_se: float | None = None) -> Result:
    """The planner's figures for a configured use case, from its mechanism's own formulas.

    Args:
        use_case: the use case (any registered mechanism).
        n: the number of reports; solved for from ``target_se`` when omitted.
        target_se: a target standard error of the headline estimate (only where it falls with ``n``).

    Raises:
        PlanError: when neither is given, or the target cannot be reached by collecting more.
    """
    mech = use_case.mechanism
    out: Result = {"mechanism": mech.name, "use_case": use_case.name, "kind": mech.kind.value}
    if n is None:
        if target_se is None:
            raise PlanError("give --n, or --target-se to solve for n")
        n = _solve_n(use_case, target_se)
        out["solved"] = {"n": n}
    figures = server_of(mech).plan(float(n))
    out.update({"n": int(n), "standard_error": figures.standard_error, "unit": figures.unit})
    out.update(dict(figures.figures))
    out["formulas"] = list(figures.formulas)
    return out


def _solve_n(use_case: UseCase, target: float) -> int:
    """The smallest ``n`` whose standard error is at most ``target`` (bisection: SE falls with n)."""
    mech = use_case.mechanism
    if not server_of(mech).plan(4.0).standard_error < server_of(mech).plan(1.0).standard_error:
        unit = server_of(mech).plan(1.0).unit
        raise PlanError(f"the SE of a {unit} grows with n; give --n instead of --target-se")
    lo, hi = 1, 2
    while server_of(mech).plan(float(hi)).standard_error > target:
        lo, hi = hi, hi * 2
        if hi > 1 << 62:
            raise PlanError("the target SE is out of reach at any n")
    while lo < hi:
        mid = (lo + hi) // 2
        if server_of(mech).plan(float(mid)).standard_error <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _plan_registered(a: argparse.Namespace) -> Result:
    path = a.registry
    try:
        registry = read_registry(Path(path))
    except SettingFileError as exc:
        raise PlanError(f"registry: {exc.problem}") from None
    except RegistryError as exc:
        raise PlanError(str(exc)) from None
    use_case = registry.use_cases.get(a.use_case)
    if use_case is None:
        raise PlanError(f"{path}: no use case {a.use_case!r}; it has {', '.join(registry.use_cases)}")
    return plan_use_case(use_case, n=a.n, target_se=a.target_se)


_PLANNERS: dict[str, Callable[[argparse.Namespace], Result]] = {
    "use-case": _plan_registered,
    "rr": _plan_rr,
    "one-bit-mean": _plan_one_bit_mean,
    "dbitflip": _plan_dbitflip,
    "cms": lambda a: _plan_sketch(a, "cms"),
    "hcms": lambda a: _plan_sketch(a, "hcms"),
    "sfp": _plan_sfp,
    "rappor": _plan_rappor,
}


# ----------------------------------------------------------------------- CLI


def _count(text: str) -> float:
    """Accept ``1e6`` and ``1_000_000`` for counts."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = _count(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _common(sp: argparse.ArgumentParser, *, targets: Sequence[str] = ("se",)) -> None:
    sp.add_argument("--epsilon", type=_count, help="privacy parameter epsilon (solved for when omitted, if possible)")
    sp.add_argument("--n", type=_count, help="number of reports (solved for from a target when omitted)")
    if "se" in targets:
        sp.add_argument("--target-se", type=_count, help="target standard error (in the estimate's unit)")
    if "error" in targets:
        sp.add_argument("--target-error", type=_count, help="target error bound holding with probability 1 - delta")
        sp.add_argument("--delta", type=_probability, default=0.05, help="failure probability of the bound (0.05)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    """The ``ldp-collector plan`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="ldp-collector plan",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Choose parameters before collecting: for a mechanism, epsilon, a number of reports and a\n"
            "target error (or a bandwidth), print the parameters and the expected standard error from the\n"
            "papers' formulas (000 Thm 1-2; 003 Thm 4.2, 4.4 and §5; 004 Thm 1-2 and Appendix)."
        ),
        epilog=(
            "examples:\n"
            "  ldp-collector plan one-bit-mean --epsilon 1 --gamma 0.2 --m 21600 --target-se 60\n"
            "  ldp-collector plan dbitflip --epsilon 1 --k 32 --n 3e5 --target-se 0.005\n"
            "  ldp-collector plan cms --epsilon 4 --n 1e8 --target-se 6000 --top-share 0.01 --dictionary-size 2600\n"
            "  ldp-collector plan hcms --epsilon 4 --n 1e8 --bandwidth 26\n"
            "  ldp-collector plan rappor --k 128 --h 2 --cohorts 16 --f 0.5 --p 0.5 --q 0.75 --n 1e6 --candidates 200\n"
            "  ldp-collector plan rappor --variant basic --f 0 --p 0.5 --q 0.75 --target-strings 1000 "
            "--candidates 1e4\n"
            "  ldp-collector plan use-case --registry /etc/ldp/usecases.toml app-usage-seconds --n 1e5"
        ),
    )
    sub = parser.add_subparsers(dest="mechanism", required=True, metavar="MECHANISM")

    sp = sub.add_parser("rr", help="binary randomized response: SE of a proportion")
    _common(sp)

    sp = sub.add_parser("one-bit-mean", help="1BitMean (000 Thm 1): error of a mean counter")
    _common(sp, targets=("se", "error"))
    sp.add_argument("--m", type=_count, required=True, help="the counter's range [0, m] (e.g. 21600 s in 6 hours)")
    sp.add_argument("--gamma", type=float, default=0.0, help="output perturbation gamma (000 §4), in [0, 0.5)")

    sp = sub.add_parser("dbitflip", help="dBitFlip / dBitFlipPM (000 Thm 2): histogram error; solves for d or n")
    _common(sp, targets=("se", "error"))
    sp.add_argument("--k", type=int, required=True, help="number of buckets")
    sp.add_argument("--d", type=int, help="buckets each device reports on (solved for when omitted)")

    _add_sketch_parsers(sub)
    _add_sfp_parser(sub)
    _add_rappor_parser(sub)

    sp = sub.add_parser(
        "use-case", help="a use case of a registry, any mechanism: the SE its module's formula gives at n reports"
    )
    sp.add_argument("--registry", required=True, help="the use-case registry (TOML)")
    sp.add_argument("use_case", metavar="USE_CASE", help="the use case's name")
    sp.add_argument("--n", type=_count, help="number of reports (solved for from --target-se when omitted)")
    sp.add_argument("--target-se", type=_count, help="target standard error of the headline estimate")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _add_sketch_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    titles = {"cms": "Count Mean Sketch (003 Thm 4.2)", "hcms": "Hadamard Count Mean Sketch (003 Thm 4.4)"}
    for kind, title in titles.items():
        sp = sub.add_parser(kind, help=f"{title}: SE of a count, bandwidth and server cost")
        _common(sp)
        sp.add_argument("--k", type=int, help="hash functions (searched over powers of two when omitted)")
        sp.add_argument("--m", type=int, help="sketch width (searched when omitted)")
        sp.add_argument("--bandwidth", type=_count, help="device bandwidth budget in bits per report (003 §5)")
        sp.add_argument("--dictionary-size", type=int, default=0, help="entries queried, p of 003 §5's server cost")
        sp.add_argument(
            "--max-cells",
            type=_count,
            default=float(1 << 27),
            help="largest sketch k*m the search considers (server memory; default 2^27)",
        )
        sp.add_argument(
            "--top-share",
            type=_probability,
            default=0.1,
            help="share of the reports held by the most frequent value; bounds sum f^2 <= F n^2 (default 0.1)",
        )


def _add_sfp_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("sfp", help="Sequence Fragment Puzzle (003 §4.3): word and fragment SEs")
    sp.add_argument("--epsilon", type=_count, default=2.0, help="epsilon of the word record (003 §6.1: 2)")
    sp.add_argument("--epsilon-fragment", type=_count, default=6.0, help="epsilon' of the fragment record (6)")
    sp.add_argument("--n", type=_count, required=True, help="number of reports")
    sp.add_argument("--k", type=int, default=2048)
    sp.add_argument("--m", type=int, default=1024)
    sp.add_argument("--k-fragment", type=int, default=2048)
    sp.add_argument("--m-fragment", type=int, default=1024)
    sp.add_argument("--length", type=int, default=10, help="characters per word (10)")
    sp.add_argument("--fragment-length", type=int, default=2, help="characters per fragment (2)")
    sp.add_argument(
        "--alphabet-size", type=int, default=28, help="symbols words are made of (28: a-z, apostrophe and space)"
    )
    sp.add_argument(
        "--release-threshold", type=_count, default=0.0, help="the use case's release threshold (for top_t)"
    )
    sp.add_argument("--assembled", type=_count, default=1e4, help="words the puzzle assembles (tests corrected for)")
    sp.add_argument("--alpha", type=_probability, default=0.05, help="Bonferroni level over the assembled words")
    sp.add_argument("--top-share", type=_probability, default=0.1, help="share of the most frequent word")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_rappor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("rappor", help="RAPPOR (004 Thm 1-2, Appendix): epsilons, SE, detectable strings")
    sp.add_argument("--variant", choices=["standard", "one-time", "basic", "basic-one-time"], default="standard")
    sp.add_argument("--k", type=int, default=128, help="Bloom filter bits (categories for basic)")
    sp.add_argument("--h", type=int, default=2, help="hash functions (1 for basic)")
    sp.add_argument("--cohorts", type=int, default=64)
    sp.add_argument("--f", type=float, default=0.5)
    sp.add_argument("--p", type=float, default=0.5)
    sp.add_argument("--q", type=float, default=0.75)
    sp.add_argument("--n", type=_count, help="number of reports (solved for from a target when omitted)")
    sp.add_argument("--candidates", type=_count, help="strings tested, M of the Bonferroni correction (default k)")
    sp.add_argument("--alpha", type=_probability, default=0.05, help="family-wise level (0.05)")
    sp.add_argument(
        "--target-strings", type=_count, help="solve n so this many equally frequent strings are detectable"
    )
    sp.add_argument("--target-share", type=_probability, help="solve n so a string with this share is detectable")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")


def _run(args: argparse.Namespace) -> Result:
    for name in ("epsilon", "n", "target_se", "target_error", "m", "k"):
        _positive(getattr(args, name, None), name)
    return _PLANNERS[args.mechanism](args)


def plan(argv: Sequence[str]) -> Result:
    """Parse ``argv`` (the arguments after ``plan``) and return the plan as a dictionary.

    Raises:
        PlanError: when the inputs cannot give a plan.
        SystemExit: on a usage error (argparse).
    """
    return _run(build_parser().parse_args(list(argv)))


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:.6g}"
    return str(value)


def _text(result: Result) -> str:
    lines = [f"plan: {result['mechanism']}" + (f" (use case {result['use_case']})" if "use_case" in result else "")]
    solved = result.get("solved", {})
    for key, value in result.items():
        if key in ("mechanism", "formulas", "options", "solved", "use_case"):
            continue
        mark = "  (solved)" if key in solved else ""
        lines.append(f"  {key.replace('_', ' ')}: {_fmt(value)}{mark}")
    if "options" in result:
        lines.append("  options:")
        for row in result["options"]:
            lines.append("    " + ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in row.items()))
    lines.append("  from:")
    lines.extend(f"    {f}" for f in result["formulas"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``ldp-collector plan``: print a plan; 0 on success, 2 on a usage error or an unreachable target.

    Args:
        argv: the arguments after ``plan`` (default: ``sys.argv[1:]``).
    """
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: --help exits 0, usage errors 2
        return exc.code if isinstance(exc.code, int) else 2
    try:
        result = _run(args)
    except PlanError as exc:
        print(f"ldp-collector plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_plain(result), indent=2, sort_keys=True))
    else:
        print(_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
