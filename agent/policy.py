"""Local policy caps: the device refuses a registry that asks for weaker privacy than allowed.

The registry is written by whoever runs the collector; the policy is the device owner's
(DESIGN "Local policy caps"). A registry is refused as a whole, with a message naming the
first offending use case and parameter, so the agent never runs half a registry.
"""

from __future__ import annotations

from typing import Any

from agent.config import PolicyConfig
from agent.errors import PolicyError
from agent.usecases import kind_of
from protocol.registry import Registry, UseCase

__all__ = ["check_registry", "check_use_case"]

_SLACK = 1e-9


def check_use_case(use_case: UseCase, policy: PolicyConfig) -> None:
    """Refuse one use case that exceeds the policy.

    Raises:
        PolicyError: naming the use case and the parameter.
    """
    name = use_case.name
    try:
        kind_of(use_case)
    except ValueError as e:
        raise PolicyError(name, "mechanism", str(e)) from None
    if use_case.epsilon > policy.max_epsilon_report + _SLACK:
        raise PolicyError(
            name, "epsilon", f"= {use_case.epsilon:g} per report exceeds the local cap {policy.max_epsilon_report:g}"
        )
    if use_case.lifetime_epsilon > policy.max_epsilon_lifetime + _SLACK:
        raise PolicyError(
            name,
            "lifetime_epsilon",
            f"= {use_case.lifetime_epsilon:g} exceeds the local cap {policy.max_epsilon_lifetime:g}",
        )
    if use_case.daily_limit > policy.max_daily_limit:
        raise PolicyError(
            name,
            "daily_limit",
            f"= {use_case.daily_limit} records per day exceeds the local cap {policy.max_daily_limit}",
        )
    if use_case.period.seconds < policy.min_period_hours * 3600 - _SLACK:
        raise PolicyError(
            name,
            "period",
            f"= {use_case.period.value} is shorter than the local minimum of {policy.min_period_hours:g} h",
        )
    mech: Any = use_case.mechanism
    if mech.name == "rappor":
        if mech.f < policy.min_rappor_f - _SLACK:
            raise PolicyError(
                name, "parameters.f", f"= {mech.f:g} is below the local floor {policy.min_rappor_f:g} (weaker PRR)"
            )
        if mech.epsilon_infinity > policy.max_rappor_epsilon_infinity + _SLACK:
            raise PolicyError(
                name,
                "parameters (ε∞)",
                f"give ε∞ = {mech.epsilon_infinity:.4g}, above the local cap {policy.max_rappor_epsilon_infinity:g}",
            )
    if mech.name == "one-bit-mean" and mech.epsilon > policy.max_one_bit_mean_epsilon + _SLACK:
        raise PolicyError(
            name,
            "epsilon",
            f"= {mech.epsilon:g} for the memoized bits exceeds the local cap {policy.max_one_bit_mean_epsilon:g}",
        )


def check_registry(registry: Registry, policy: PolicyConfig) -> None:
    """Refuse a registry if any of its use cases exceeds the policy.

    Raises:
        PolicyError: naming the first offending use case (in name order) and parameter.
    """
    for use_case in registry.use_cases.values():
        check_use_case(use_case, policy)
