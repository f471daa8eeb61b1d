"""The plan of a histogram: dBitFlip / dBitFlipPM (000 Thm 2), solving for ``d`` or ``n``.

``max_v |ĥ(v) - h(v)| <= sqrt(5k/(nd)) · (e^{ε/2}+1)/(e^{ε/2}-1) · sqrt(ln(6k/δ))`` with
probability ``1 - δ``; per bucket ``SE = sqrt(((k/d)(c + h) - h)/n)``,
``c = e^{ε/2}/(e^{ε/2} - 1)²`` (:meth:`protocol.dbitflip.DBitFlip.plan`), shown for an empty
bucket and a bucket of share ``1/k``.
"""

from __future__ import annotations

import argparse
import math

from collector.planner.inputs import PlanError, Result, build, ceil_n, need
from protocol.buckets import LinearBuckets
from protocol.dbitflip import DBitFlip
from protocol.server.contract import server_of

__all__ = ["plan_dbitflip"]


def _dbitflip_numbers(eps: float, k: int, d: int, n: float, delta: float) -> dict[str, float]:
    a = math.exp(eps / 2)
    # The per-bucket SEs are the module's (protocol.dbitflip.DBitFlip.plan); the buckets' edges
    # do not enter them, only their number.
    mech = build(lambda: DBitFlip(epsilon=eps, buckets=LinearBuckets(low=0, high=k, count=k), d=d, memoize=False))
    figures = server_of(mech).plan(n)
    return {
        "standard_error_empty_bucket": figures.figures["standard_error_empty_bucket"],
        "standard_error_uniform_bucket": figures.standard_error,
        "error_bound": math.sqrt(5 * k / (n * d)) * (a + 1) / (a - 1) * math.sqrt(math.log(6 * k / delta)),
    }


def plan_dbitflip(a: argparse.Namespace) -> Result:
    """``plan dbitflip``: the bucket SEs and 000 Thm 2's bound; the smallest ``d``, or ``n``, for a target."""
    eps = need(a.epsilon, "epsilon")
    k = int(need(a.k, "k"))
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
    d = int(need(d, "d"))
    if not 1 <= d <= k:
        raise PlanError(f"--d must lie in [1, k = {k}]; got {d}")
    if n is None:
        if target is None:
            raise PlanError("give --n, or a target (--target-se or --target-error) to solve for n")
        per_n = _dbitflip_numbers(eps, k, d, 1.0, delta)[key]  # the value at n = 1, scales as 1/sqrt(n)
        n = ceil_n((per_n / target) ** 2)
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
