"""Which frequency oracle to use: every applicable mechanism side by side, and a recommendation.

For a use case's ε, its domain (a fixed list of ``k`` categories, or an open domain queried with
a dictionary of ``D`` candidates) and its expected reports per period ``n``, each applicable
mechanism is built with the parameters its defaults give at that ε and domain (or, for the use
case's own mechanism, the parameters it has) and asked, as the collector would ask it, for:

* the standard error of a count at ``n`` reports (:meth:`protocol.server.contract.ServerMechanism.plan`:
  a value nobody holds, with ``Σ f**2 <= 0.1 n**2`` where hash collisions add to it);
* its record's size on the wire (``max_record_bytes``);
* the collector's work for one estimate of the period, in elementary operations
  (:func:`decode_ops`; up to constant factors, as 003 §5 counts them).

The recommendation is the least standard error among the mechanisms whose record fits
:data:`REPORT_BYTES_LIMIT`; the ratio of variances is the ratio of devices needed for the same
standard error. The figures are docs/estimation.md's ("Frequency oracles at the local-privacy
limit", the planner's table).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.planner.inputs import PlanError, Result, build, need
from protocol.categories import CATEGORIES_MAX
from protocol.cms import CountMeanSketch
from protocol.errors import ParameterError
from protocol.grr import GeneralizedRandomizedResponse
from protocol.hcms import HadamardCountMeanSketch
from protocol.interfaces import EstimateKind, Mechanism
from protocol.olh import MAX_CELLS as OLH_MAX_CELLS
from protocol.olh import OptimalLocalHashing
from protocol.oue import OptimizedUnaryEncoding
from protocol.pgr import ProjectiveGeometryResponse
from protocol.registry import RegistryError, UseCase
from protocol.server.contract import server_of
from protocol.ss import SubsetSelection
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry

__all__ = ["REPORT_BYTES_LIMIT", "compare_mechanisms", "decode_ops", "plan_compare", "plan_oracles"]

REPORT_BYTES_LIMIT = 1024
"""A record larger than this is not recommended (it is still listed): a device sends it every
report, and OUE's and subset selection's records grow with the number of categories."""

_PLAN_SEED = bytes(16)
"""A public seed for mechanisms built only to plan: their variances do not depend on it."""
_CMS_DEPLOYED = (65_536, 1_024)
"""``(k, m)`` of 003 §6.2's Count Mean Sketch, for an open domain whose use case is not a CMS."""
_HCMS_DEPLOYED = (1_024, 32_768)
"""``(k, m)`` of 003 §6.4's Hadamard Count Mean Sketch."""


def _pgr_ops(mech: ProjectiveGeometryResponse, n: float, candidates: int) -> float:
    g = mech.geometry
    if mech.reconstruction == "table":
        return n + g.table_cells * math.log2(g.table_cells) + mech.k * mech.q  # histogram, transform, gather
    if mech.reconstruction == "enumeration":
        return n + g.enumeration_work(mech.k)  # histogram, each category's hyperplane
    return n + mech.k


# The collector's work per estimate, by mechanism class, up to constant factors (003 §5 for the
# sketches; the others from their server halves: one count per report, then the estimate).
_DECODE_OPS: dict[type[Any], Callable[[Any, float, int], float]] = {
    CountMeanSketch: lambda m, n, c: n * m.m + c * m.k,  # fold every bit, gather k rows per entry
    HadamardCountMeanSketch: lambda m, n, c: n + m.k * m.m * math.log2(m.m) + c * m.k,
    OptimalLocalHashing: lambda m, n, c: n + c * m.seeds,  # one cell per report; seeds cells per entry
    GeneralizedRandomizedResponse: lambda m, n, c: n + m.k,
    OptimizedUnaryEncoding: lambda m, n, c: n * m.k + m.k,  # every report's k bits
    SubsetSelection: lambda m, n, c: n * m.d + m.k,
    ProjectiveGeometryResponse: _pgr_ops,
}


def decode_ops(mech: Mechanism, *, n: float, candidates: int) -> float | None:
    """The collector's work for one estimate over ``candidates`` entries from ``n`` reports (up to
    constant factors), or ``None`` for a mechanism this table does not know."""
    ops = _DECODE_OPS.get(type(mech))
    return None if ops is None else ops(mech, n, candidates)


def _alternatives(epsilon: float, *, categories: tuple[str, ...] | None, seed: bytes) -> list[Mechanism]:
    """The mechanisms that can serve a domain, with the defaults that follow from ε and the domain
    (one whose parameters refuse this ε or domain is left out: the table lists what can run)."""
    makers: list[Callable[[], Mechanism]] = [lambda: OptimalLocalHashing(epsilon=epsilon, seed=seed)]
    if categories is not None:
        makers += [
            lambda: GeneralizedRandomizedResponse(epsilon=epsilon, categories=categories),
            lambda: OptimizedUnaryEncoding(epsilon=epsilon, categories=categories),
            lambda: SubsetSelection(epsilon=epsilon, categories=categories),
            lambda: ProjectiveGeometryResponse(epsilon=epsilon, categories=categories),
        ]
    else:
        makers += [
            lambda: CountMeanSketch(epsilon=epsilon, k=_CMS_DEPLOYED[0], m=_CMS_DEPLOYED[1], seed=seed),
            lambda: HadamardCountMeanSketch(epsilon=epsilon, k=_HCMS_DEPLOYED[0], m=_HCMS_DEPLOYED[1], seed=seed),
        ]
    out: list[Mechanism] = []
    for make in makers:
        try:
            out.append(make())
        except ParameterError:
            continue
    return out


def _wider_family(mech: Mechanism, n: float) -> OptimalLocalHashing | None:
    """OLH with the family its plan suggests at ``n`` reports (the collision term a tenth of the coin
    term), when that is larger than ``mech``'s and fits the aggregate's limit; else ``None``."""
    if not isinstance(mech, OptimalLocalHashing):
        return None
    suggested = int(server_of(mech).plan(n).figures["seeds_for_tenth"])
    seeds = min(suggested, 1 << 20, OLH_MAX_CELLS // mech.g)
    if seeds <= mech.seeds:
        return None
    return OptimalLocalHashing(epsilon=mech.epsilon, seed=mech.seed, g=mech.g, seeds=seeds)


def _parameters(mech: Mechanism) -> str:
    """The parameters a person compares mechanisms by (those that size the record and the error)."""
    if isinstance(mech, CountMeanSketch | HadamardCountMeanSketch):
        return f"k={mech.k:,} m={mech.m:,}"
    if isinstance(mech, OptimalLocalHashing):
        return f"g={mech.g} seeds={mech.seeds:,}"
    if isinstance(mech, SubsetSelection):
        return f"k={mech.k:,} d={mech.d:,}"
    if isinstance(mech, ProjectiveGeometryResponse):
        return f"k={mech.k:,} q={mech.q} t={mech.t}"
    categories = getattr(mech, "fixed_categories", None)
    return f"k={len(categories):,}" if categories else ""


def _row(mech: Mechanism, *, n: float, candidates: int) -> Result:
    figures = server_of(mech).plan(n)
    ops = decode_ops(mech, n=n, candidates=candidates)
    return {
        "mechanism": mech.name,
        "parameters": _parameters(mech),
        "standard_error": figures.standard_error,
        "report_bytes": mech.max_record_bytes,
        "decode_ops": math.nan if ops is None else ops,
    }


def compare_mechanisms(
    epsilon: float,
    *,
    n: float,
    categories: tuple[str, ...] | None,
    candidates: int,
    current: Mechanism | None = None,
    seed: bytes = _PLAN_SEED,
) -> Result:
    """Every applicable mechanism's standard error, record size and decode work, and the one to take.

    Args:
        epsilon: ε of one report.
        n: reports per period.
        categories: the fixed categories, or ``None`` for an open domain queried with a dictionary.
        candidates: entries estimated per period (the dictionary's size, or ``k``).
        current: the use case's own mechanism, listed with its own parameters (and compared with).
        seed: the public seed hashed mechanisms are built with (it does not change their variance).
    """
    mechanisms = [
        m for m in _alternatives(epsilon, categories=categories, seed=seed) if m.name != getattr(current, "name", None)
    ]
    if current is not None:
        mechanisms.insert(0, current)
    mechanisms += [wider for m in mechanisms if (wider := _wider_family(m, n)) is not None]
    rows = [_row(m, n=n, candidates=candidates) for m in mechanisms]
    eligible = [r for r in rows if r["report_bytes"] <= REPORT_BYTES_LIMIT] or rows
    best = min(eligible, key=lambda r: (r["standard_error"], r["report_bytes"]))
    floor = best["standard_error"]
    for r in rows:
        r["variance_vs_best"] = (r["standard_error"] / floor) ** 2
    out: Result = {"epsilon": epsilon, "n": int(n), "candidates": candidates, "recommended": best["mechanism"]}
    out["recommended_parameters"] = best["parameters"]
    if current is not None:
        mine = rows[0]
        out["current"] = mine["mechanism"]
        out["se_ratio"] = floor / mine["standard_error"]
        out["devices_ratio"] = (floor / mine["standard_error"]) ** 2
        out["advice"] = _advice(mine, best)
    out["table"] = rows
    return out


def _advice(mine: Result, best: Result) -> str:
    if (best["mechanism"], best["parameters"]) == (mine["mechanism"], mine["parameters"]):
        return f"keep {mine['mechanism']}: no applicable mechanism has a smaller standard error here"
    ratio = best["standard_error"] / mine["standard_error"]
    devices = ratio**2
    gain = (
        f"its standard error is {ratio:.2f}x the current one's, so the same error needs {devices:.2f}x the "
        f"devices ({1 / devices:.2f}x fewer)"
    )
    if best["mechanism"] == mine["mechanism"]:
        return f"keep {mine['mechanism']} with other parameters ({best['parameters']}): {gain}"
    return f"switch to {best['mechanism']} ({best['parameters']}): {gain}"


_FORMULAS = [
    "SE of a count nobody holds at n reports, from each mechanism's own variance (server half's plan())",
    "hashed mechanisms (cms, hcms, olh): sum f^2 <= 0.1 n^2 in the collision term",
    "devices for the same SE scale with the variance: devices ratio = (SE ratio)^2",
    "decode ops: cms n m + D k; hcms n + k m log2 m + D k; olh n + D seeds; grr n + k; oue n k; "
    "ss n d + k; pgr n + q^t log2 q^t + k q (a Fourier table) or n + k h (past it)",
]


def plan_oracles(a: argparse.Namespace) -> Result:
    """``plan oracles``: the comparison for raw inputs, ``--categories K`` or ``--dictionary-size D``."""
    eps = need(a.epsilon, "epsilon")
    n = need(a.n, "n")
    if (a.categories is None) == (a.dictionary_size is None):
        raise PlanError("give --categories K (a fixed list of K categories) or --dictionary-size D (an open domain)")
    if a.categories is not None:
        k = int(a.categories)
        if k != a.categories or not 2 <= k <= CATEGORIES_MAX:
            raise PlanError(f"--categories must be a whole number from 2 to {CATEGORIES_MAX:,}; got {a.categories:g}")
        categories: tuple[str, ...] | None = tuple(f"c{i}" for i in range(k))
        candidates = k
    else:
        categories, candidates = None, int(a.dictionary_size)
    out = build(lambda: compare_mechanisms(eps, n=n, categories=categories, candidates=candidates))
    return {"mechanism": "oracles", **out, "formulas": _FORMULAS}


def _dictionary_size(use_case: UseCase, registry_path: Path) -> int:
    path = use_case.collector.dictionary
    if not path:
        return 0
    file = Path(path) if Path(path).is_absolute() else registry_path.parent / path
    try:
        with file.open(encoding="utf-8") as lines:
            return sum(1 for line in lines if line.strip())
    except OSError:
        return 0


def plan_compare(a: argparse.Namespace) -> Result:
    """``plan compare --registry FILE [USE_CASE ...]``: what switching each frequency use case would give."""
    path = Path(a.registry)
    try:
        registry = read_registry(path)
    except SettingFileError as exc:
        raise PlanError(f"registry: {exc.problem}") from None
    except RegistryError as exc:
        raise PlanError(str(exc)) from None
    names = list(a.use_cases) or list(registry.use_cases)
    missing = [n for n in names if n not in registry.use_cases]
    if missing:
        raise PlanError(f"{path}: no use case {missing[0]!r}; it has {', '.join(registry.use_cases)}")
    plans: list[Result] = []
    for name in names:
        uc = registry.use_cases[name]
        mech = uc.mechanism
        if mech.kind not in (EstimateKind.DICTIONARY, EstimateKind.CATEGORIES):
            if a.use_cases:
                raise PlanError(f"{name} ({mech.name}) is not a frequency oracle over a dictionary or categories")
            continue
        categories = getattr(mech, "fixed_categories", None)
        candidates = len(categories) if categories else _dictionary_size(uc, path)
        n = float(a.n) if a.n is not None else float(max(uc.collector.min_reports, 1))
        result = compare_mechanisms(
            uc.epsilon, n=n, categories=categories, candidates=candidates, current=mech, seed=uc.seed or _PLAN_SEED
        )
        plans.append({"use_case": name, **result})
    if not plans:
        raise PlanError(f"{path}: no use case estimates frequencies over a dictionary or categories")
    return {"mechanism": "compare", "registry": str(path), "plans": plans, "formulas": _FORMULAS}
