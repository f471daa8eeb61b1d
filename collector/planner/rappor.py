"""The plan of RAPPOR (004 §3, §4, Appendix): its ε figures, the SE of a count, the strings it can detect.

``ε∞ = 2h ln((1 - f/2)/(f/2))`` (Thm 1), ``ε1 = h ln(q*(1-p*)/(p*(1-q*)))`` (Thm 2); under
``H0`` a bit count has ``sd(T̂) = sqrt(p*(1-p*) N)/(q* - p*)`` (Appendix); Bonferroni over
``M`` tests gives ``Q = Φ^-1(1 - α/M)`` and the Appendix's upper limit on the number of
strings that can be detected, ``x <= N / (Q sd(T̂)) = (q* - p*) sqrt N / (Q sqrt(p*(1-p*)))``
(``(2q - 1) sqrt N / Q`` at ``p = 1/2``, ``f = 0``). A Bloom-decoded count averages the ``h̄``
distinct bits of a candidate in each cohort, so its SE is about
``sqrt(p*(1-p*) N / h̄)/(q* - p*)`` (``h̄ = k (1 - (1 - 1/k)^h)``; selected columns add a few
percent, see :mod:`collector.decoding.rappor`). Given a number of strings or a share to
detect, the verb solves for ``N``.
"""

from __future__ import annotations

import argparse
import math

from collector.decoding.stats import normal_quantile
from collector.planner.inputs import PlanError, Result, ceil_n

__all__ = ["plan_rappor"]


def plan_rappor(a: argparse.Namespace) -> Result:
    """``plan rappor``: ε∞ and ε1, a count's SE, the strings detectable at ``n`` (or the ``n`` a target needs)."""
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
            n = ceil_n((a.target_strings * big_q * unit_count) ** 2)
        elif a.target_share is not None:
            n = ceil_n((big_q * unit_count / a.target_share) ** 2)
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
