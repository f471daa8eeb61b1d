"""Plans for one number per period: a proportion (randomized response) and a mean (1BitMean, 000 Thm 1).

* ``rr``: ``SE(π̂) = sqrt(p(1-p)/n) / (2p - 1)``, ``p = e^ε / (1 + e^ε)`` (Warner; the
  standard error is its server half's ``plan``).
* ``one-bit-mean`` (000 Thm 1): with probability ``1 - δ`` the mean is within
  ``m / sqrt(2n) · (e^ε + 1)/(e^ε - 1) · sqrt(ln(2/δ))``; the standard error is at most
  ``m / (2 c sqrt n)``, ``c = (e^ε - 1)/(e^ε + 1)`` (000 eq. 2, worst case ``λ = 1/2``). With
  output perturbation γ the report is 1BitMean with ``ε'`` (000 §4), so ``ε'`` replaces ε;
  several counters with a common bound cost ``ε'' = ε' + e^ε' - 1`` (000 Thm 5). Given ``n``
  and a target, ε is solved for; given ε and a target, ``n``.
"""

from __future__ import annotations

import argparse
import math

from collector.planner.inputs import PlanError, Result, build, ceil_n, need
from protocol.randomized_response import RandomizedResponse
from protocol.server.contract import server_of

__all__ = ["plan_one_bit_mean", "plan_rr"]


def plan_rr(a: argparse.Namespace) -> Result:
    """``plan rr``: the SE of a proportion at ``--n`` reports, or the ``n`` a ``--target-se`` needs."""
    eps = need(a.epsilon, "epsilon")
    mech = build(lambda: RandomizedResponse(epsilon=eps))
    p = mech.keep_probability
    unit = server_of(mech).plan(1.0).standard_error  # SE · sqrt(n), the module's formula
    out: Result = {"mechanism": "rr", "epsilon": eps, "keep_probability": p}
    n = a.n
    if a.target_se is not None:
        n = ceil_n((unit / a.target_se) ** 2)
        out["solved"] = {"n": n}
    n = need(n, "n")
    out["n"] = int(n)
    out["standard_error"] = unit / math.sqrt(n)
    out["formulas"] = ["SE(proportion) = sqrt(p(1-p)/n)/(2p-1), p = e^eps/(1+e^eps)"]
    return out


def _eps_prime(eps: float, gamma: float) -> float:
    """000 §4's ε' of a report perturbed with probability γ (ε itself at γ = 0)."""
    if gamma == 0:
        return eps
    e = math.exp(eps)
    hi = (1 - 2 * gamma) * e / (e + 1) + gamma
    lo = (1 - 2 * gamma) / (e + 1) + gamma
    return math.log(hi / lo)


def plan_one_bit_mean(a: argparse.Namespace) -> Result:
    """``plan one-bit-mean``: 000 Thm 1's bound and the SE; solves for ε or ``n`` from a target."""
    m = need(a.m, "m")
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
        n_ = need(n, "n")
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
            n = ceil_n((m / (2 * c * target_se)) ** 2)
        elif target_err is not None:
            n = ceil_n((m * log_term / (c * target_err * math.sqrt(2))) ** 2)
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
