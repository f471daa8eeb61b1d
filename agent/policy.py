"""Local policy caps: the device refuses a registry that asks for weaker privacy than allowed.

The registry is written by whoever runs the collector; the policy is the device owner's
(docs/design.md §5.4). A registry is refused as a whole, with a message naming the
first offending use case and parameter, so the agent never runs half a registry.
"""

from __future__ import annotations

from agent.config import PolicyConfig
from agent.errors import PolicyError
from agent.mechanism_calls import privacy_figures
from protocol.registry import Registry, UseCase

__all__ = ["check_registry", "check_use_case"]

_SLACK = 1e-9


def check_use_case(use_case: UseCase, policy: PolicyConfig) -> None:
    """Refuse one use case that exceeds the policy.

    Raises:
        PolicyError: naming the use case and the parameter.
    """
    name = use_case.name
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
    # The mechanism names its figures (protocol.interfaces.Mechanism.privacy_figures); the
    # policy bounds the ones it has a cap for, whichever mechanism gives them.
    figures = privacy_figures(use_case)
    f = figures.get("f")
    if f is not None and f < policy.min_rappor_f - _SLACK:
        raise PolicyError(
            name, "parameters.f", f"= {f:g} is below the local floor {policy.min_rappor_f:g} (weaker PRR)"
        )
    # Each ε figure capped from above: (figure, cap, what the refusal names, its message).
    epsilon_caps = (
        ("epsilon_infinity", policy.max_rappor_epsilon_infinity, "parameters (ε∞)", "give ε∞ = {:.4g}, above"),
        ("epsilon_memo", policy.max_one_bit_mean_epsilon, "epsilon", "= {:.4g} for the memoized bits exceeds"),
    )
    for figure, cap, parameter, says in epsilon_caps:
        value = figures.get(figure)
        if value is not None and value > cap + _SLACK:
            raise PolicyError(name, parameter, f"{says.format(value)} the local cap {cap:g}")


def check_registry(registry: Registry, policy: PolicyConfig) -> None:
    """Refuse a registry if any of its use cases exceeds the policy.

    Raises:
        PolicyError: naming the first offending use case (in name order) and parameter.
    """
    for use_case in registry.use_cases.values():
        check_use_case(use_case, policy)
