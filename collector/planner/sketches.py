"""The plan of a sketch: Count Mean Sketch (003 Thm 4.2) and Hadamard Count Mean Sketch (003 Thm 4.4).

``Var f̃(d) <= (m/(m-1))² (e^{ε/2}/(e^{ε/2}-1)² + 1/m + Σf²/(nkm)) n`` (CMS) and
``(m/(m-1))² (((e^ε+1)/(e^ε-1))² + Σf²/(nkm)) n`` (HCMS), with ``Σf² <= F n²`` for ``F`` the
share of the most frequent value (``Σ p² <= max p``). Device bandwidth (003 §5)
``M_CMS = log2 k + m`` and ``M_HCMS = log2 k + log2 m + 1`` bits; server cost
``T_CMS = n m + p k`` and ``T_HCMS = n + k m log2 m + p k`` (``p``: dictionary size;
operations, up to constant factors). Given a target SE or a bandwidth, the verb searches
powers of two for ``k`` and prints the cheapest choices.

The variance bound and the bandwidth are the mechanism's own (its server half's
``variance_bound`` and the ``bandwidth_bits`` of its ``plan``); a :class:`SketchFamily` adds
only what the search needs and the mechanism does not state: the server cost, the widths the sketch takes, and the
widest one a number of bits pays for.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

from collector.planner.inputs import PlanError, Result, build, need
from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.server.cms import CMSServer
from protocol.server.hcms import HCMSServer

__all__ = ["CMS", "HCMS", "SKETCHES", "SketchFamily", "plan_sketch", "sketch_variance"]

Sketch = CMSServer | HCMSServer
"""A sketch's server half: what states its variance bound and its plan."""

_K_POWERS = range(25)
"""Powers of two tried for the sketch's number of hash functions ``k``."""
_M_MAX = 1 << 20
_WIDTHS = [1 << e for e in range(1, _M_MAX.bit_length())]
"""The widths ``m`` the target search tries first: the powers of two up to :data:`_M_MAX`."""

_PLAN_SEED = bytes(16)
"""A public seed for sketches built only to plan: the variance bounds do not depend on it."""


@dataclass(frozen=True)
class SketchFamily:
    """One sketch mechanism as the (k, m) search sees it, beyond what the mechanism itself states.

    Attributes:
        name: the mechanism's name, also the ``plan`` subcommand.
        title: the subcommand's help, naming the theorem.
        make: the mechanism's server half at ``(epsilon, k, m)``.
        theorem: the variance bound as the plan prints it.
        any_width: every ``m >= 2`` is a valid width (CMS); otherwise only powers of two (HCMS).
        widest: the widest ``m`` whose part of the bandwidth fits in the given bits (below 2: none).
        server_cost: 003 §5's server cost at ``(k, m, n, p)``.
    """

    name: str
    title: str
    make: Callable[[float, int, int], Sketch]
    theorem: str
    any_width: bool
    widest: Callable[[float], int]
    server_cost: Callable[[int, int, float, int], float]


CMS = SketchFamily(
    name="cms",
    title="Count Mean Sketch (003 Thm 4.2)",
    make=lambda eps, k, m: CMSServer(CountMeanSketch(epsilon=eps, k=k, m=m, seed=_PLAN_SEED)),
    theorem="003 Thm 4.2 (cms): Var <= (m/(m-1))^2 (e^(eps/2)/(e^(eps/2)-1)^2 + 1/m + F n/(k m)) n",
    any_width=True,
    widest=math.floor,  # a record carries the m-bit vector itself
    server_cost=lambda k, m, n, p: n * m + p * k,
)
HCMS = SketchFamily(
    name="hcms",
    title="Hadamard Count Mean Sketch (003 Thm 4.4)",
    make=lambda eps, k, m: HCMSServer(HadamardCountMeanSketch(epsilon=eps, k=k, m=m, seed=_PLAN_SEED)),
    theorem="003 Thm 4.4 (hcms): Var <= (m/(m-1))^2 (((e^eps+1)/(e^eps-1))^2 + F n/(k m)) n",
    any_width=False,
    widest=lambda bits: (1 << math.floor(bits - 1)) if bits - 1 >= 1 else 0,  # log2 m bits and the sign bit
    server_cost=lambda k, m, n, p: n + k * m * math.log2(m) + p * k,
)
SKETCHES = (CMS, HCMS)
"""The sketch families ``ldp-collector plan`` offers, each as a subcommand of its name."""


def _sketch(family: SketchFamily, *, eps: float, k: int, m: int) -> Sketch:
    return build(lambda: family.make(eps, k, m))


def _se(sketch: Sketch, *, n: float, top_share: float) -> float:
    """The module's bound (003 Thm 4.2 / 4.4, ``variance_bound``) with ``Σf² <= F n²``, as an SE."""
    return math.sqrt(float(sketch.variance_bound(n=n, sum_sq=top_share * n * n)))


def sketch_variance(family: SketchFamily, *, eps: float, k: int, m: int, n: float, top_share: float) -> float:
    """The module's variance bound (003 Thm 4.2 / 4.4, ``variance_bound``) with ``Σf² <= F n²``."""
    return float(_sketch(family, eps=eps, k=k, m=m).variance_bound(n=n, sum_sq=top_share * n * n))


def _bandwidth(sketch: Sketch) -> float:
    """Bits per report on the device (003 §5), as the mechanism's plan states them."""
    return sketch.plan(1.0).figures["bandwidth_bits"]


def _row(family: SketchFamily, sketch: Sketch, *, n: float, top_share: float, p: int) -> Result:
    k, m = sketch.mechanism.k, sketch.mechanism.m
    return {
        "k": k,
        "m": m,
        "standard_error": _se(sketch, n=n, top_share=top_share),
        "bandwidth_bits": _bandwidth(sketch),
        "server_cost": family.server_cost(k, m, n, p),
    }


def _smallest_m(family: SketchFamily, *, eps: float, k: int, n: float, top_share: float, target: float) -> int | None:
    """The smallest valid ``m`` reaching ``target`` at this ``k`` (the SE decreases in ``m``)."""

    def se(m: int) -> float:
        return _se(_sketch(family, eps=eps, k=k, m=m), n=n, top_share=top_share)

    ok = [m for m in _WIDTHS if se(m) <= target]
    if not ok:
        return None
    if not family.any_width:
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


def plan_sketch(a: argparse.Namespace, *, family: SketchFamily) -> Result:
    """``plan cms`` / ``plan hcms``: one (k, m), or the choices within a bandwidth or reaching a target SE."""
    eps = need(a.epsilon, "epsilon")
    n = need(a.n, "n")
    p = int(a.dictionary_size)
    share = float(a.top_share)
    if not 0 < share <= 1:
        raise PlanError(f"--top-share must lie in (0, 1]; got {share}")
    out: Result = {"mechanism": family.name, "epsilon": eps, "n": int(n), "dictionary_size": p, "top_share": share}
    out["formulas"] = [
        family.theorem,
        "003 §5: bandwidth log2 k + m (cms), log2 k + log2 m + 1 (hcms); server cost n m + p k (cms), "
        "n + k m log2 m + p k (hcms)",
        "F = share of the most frequent value (sum f^2 <= F n^2)",
    ]
    if a.k is not None and a.m is not None:
        k, m = int(a.k), int(a.m)
        if k < 1 or m < 2 or (not family.any_width and m & (m - 1)):
            raise PlanError("--k >= 1 and --m >= 2 (a power of two for hcms)")
        out.update(_row(family, _sketch(family, eps=eps, k=k, m=m), n=n, top_share=share, p=p))
        return out
    if a.bandwidth is not None:
        rows, best = _within_bandwidth(a, family, eps=eps, n=n, share=share, p=p)
    elif a.target_se is not None:
        rows, best = _for_target(a, family, eps=eps, n=n, share=share, p=p)
    else:
        raise PlanError("give --k and --m, or --target-se, or --bandwidth")
    out.update(best)
    out["options"] = sorted(rows, key=lambda r: r["k"])
    out["choice"] = "smallest SE within the bandwidth" if a.bandwidth is not None else "least bandwidth"
    return out


def _within_bandwidth(
    a: argparse.Namespace, family: SketchFamily, *, eps: float, n: float, share: float, p: int
) -> tuple[list[Result], Result]:
    """The (k, m) that fit ``--bandwidth`` (and the cell and SE limits), and the one to take."""
    budget = float(a.bandwidth)
    rows: list[Result] = []
    for e in _K_POWERS:
        k = 1 << e
        if a.k is not None and k != int(a.k):
            continue
        m = family.widest(budget - e) if a.m is None else int(a.m)
        if m < 2 or m > _M_MAX:
            continue
        sketch = _sketch(family, eps=eps, k=k, m=m)
        if _bandwidth(sketch) > budget + 1e-9:
            continue
        rows.append(_row(family, sketch, n=n, top_share=share, p=p))
    rows = [r for r in rows if r["k"] * r["m"] <= a.max_cells]
    if a.target_se is not None:
        rows = [r for r in rows if r["standard_error"] <= a.target_se]
    if not rows:
        raise PlanError("no (k, m) fits the bandwidth, --max-cells (and the target); raise --bandwidth")
    # Within 1% of the smallest SE the choice hardly matters to the error: take the cheapest server.
    floor = min(r["standard_error"] for r in rows)
    best = min((r for r in rows if r["standard_error"] <= 1.01 * floor), key=lambda r: r["server_cost"])
    return rows, best


def _for_target(
    a: argparse.Namespace, family: SketchFamily, *, eps: float, n: float, share: float, p: int
) -> tuple[list[Result], Result]:
    """The (k, m) that reach ``--target-se`` within ``--max-cells``, and the one with the least bandwidth."""
    rows: list[Result] = []
    for e in _K_POWERS:
        k = 1 << e
        if a.k is not None and k != int(a.k):
            continue
        m_opt = _smallest_m(family, eps=eps, k=k, n=n, top_share=share, target=a.target_se) if a.m is None else int(a.m)
        if m_opt is None:
            continue
        row = _row(family, _sketch(family, eps=eps, k=k, m=m_opt), n=n, top_share=share, p=p)
        if row["standard_error"] <= a.target_se and k * m_opt <= a.max_cells:
            rows.append(row)
    if not rows:
        raise PlanError("the target SE is below what any k, m within --max-cells can give at this epsilon and n")
    best = min(rows, key=lambda r: (r["bandwidth_bits"], r["server_cost"]))
    return rows, best
