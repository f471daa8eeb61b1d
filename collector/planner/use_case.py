"""The plan of a configured use case, any registered mechanism: the figures its own module states.

:meth:`protocol.server.contract.ServerMechanism.plan` gives the standard error of the mechanism's
headline estimate from the paper's variance formula and its ε figures, at ``n`` reports;
``n`` is solved for a target standard error by bisection. Nothing here knows the mechanism:
a mechanism added to the table of :mod:`protocol.interfaces` is planned the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from collector.decoding.discovery_settings import discovery_figures
from collector.decoding.release import DEFAULT_ALPHA
from collector.planner.inputs import PlanError, Result
from protocol.interfaces import EstimateKind
from protocol.registry import RegistryError, UseCase
from protocol.server.contract import discovery_server, server_of
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry

__all__ = ["plan_registered", "plan_use_case"]

_DISCOVERY_FORMULAS = (
    "smallest word found ~ max(z_word SE_word, positions z_frag SE_frag), "
    "z_frag = Phi^-1(1 - 1/(256 |alphabet|^l)), |alphabet| from the use case's parameters.alphabet",
    "top_t: collector.decoding.discovery_settings.choose_top_t, as the collector decodes the period",
)


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
    server = server_of(mech)
    out: Result = {"mechanism": mech.name, "use_case": use_case.name, "kind": mech.kind.value}
    # Who answers for the use case and until when it may collect (protocol/metadata.py): a plan
    # is read before a collection starts, when an end date is chosen.
    meta = use_case.metadata
    out["owner"] = meta.owner if meta.owner is not None else "none named"
    out["expires"] = meta.expires.isoformat() if meta.expires is not None else "no end date"
    if n is None:
        if target_se is None:
            raise PlanError("give --n, or --target-se to solve for n")
        n = _solve_n(use_case, target_se)
        out["solved"] = {"n": n}
    figures = server.plan(float(n))
    out.update({"n": int(n), "standard_error": figures.standard_error, "unit": figures.unit})
    out.update(dict(figures.figures))
    out["formulas"] = list(figures.formulas)
    if mech.kind is EstimateKind.DISCOVERY:
        # What is found depends on the alphabet too: its size sets the null fragments to beat.
        settings = use_case.collector
        out.update(
            discovery_figures(
                discovery_server(server),
                n=int(n),
                release_threshold=settings.release_threshold,
                alpha=settings.alpha if settings.correction != "pfer" else DEFAULT_ALPHA,
            )
        )
        out["formulas"] = [*out["formulas"], *_DISCOVERY_FORMULAS]
    return out


def _solve_n(use_case: UseCase, target: float) -> int:
    """The smallest ``n`` whose standard error is at most ``target`` (bisection: SE falls with n)."""
    server = server_of(use_case.mechanism)
    if not server.plan(4.0).standard_error < server.plan(1.0).standard_error:
        unit = server.plan(1.0).unit
        raise PlanError(f"the SE of a {unit} grows with n; give --n instead of --target-se")
    lo, hi = 1, 2
    while server.plan(float(hi)).standard_error > target:
        lo, hi = hi, hi * 2
        if hi > 1 << 62:
            raise PlanError("the target SE is out of reach at any n")
    while lo < hi:
        mid = (lo + hi) // 2
        if server.plan(float(mid)).standard_error <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def plan_registered(a: argparse.Namespace) -> Result:
    """``plan use-case --registry FILE NAME``: :func:`plan_use_case` for a use case read from a registry file."""
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
