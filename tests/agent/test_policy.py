"""Local policy caps: a registry asking for more ε, or weaker parameters, is refused naming the use case."""

from __future__ import annotations

import pytest

from agent.config import PolicyConfig
from agent.errors import PolicyError
from agent.policy import check_registry
from protocol.registry import parse_registry
from tests.agent.conftest import REGISTRY


def test_the_test_registry_passes_the_default_policy() -> None:
    """The default policy admits a registry of reasonable use cases."""
    check_registry(parse_registry(REGISTRY), PolicyConfig())


@pytest.mark.parametrize(
    ("policy", "edit", "use_case", "parameter"),
    [
        (PolicyConfig(max_epsilon_report=2.0), lambda t: t, "words", "epsilon"),
        (PolicyConfig(max_epsilon_lifetime=50.0), lambda t: t, "hist", "lifetime_epsilon"),
        (PolicyConfig(max_daily_limit=4), lambda t: t, "hist", "daily_limit"),
        (PolicyConfig(min_period_hours=12.0), lambda t: t, "hist", "period"),
        (
            PolicyConfig(),
            lambda t: t.replace("f = 0.75", "f = 0.2").replace("epsilon = 0.54", "epsilon = 4"),
            "procs",
            "parameters.f",
        ),
        (PolicyConfig(max_rappor_epsilon_infinity=1.0), lambda t: t, "procs", "parameters (ε∞)"),
        (PolicyConfig(max_one_bit_mean_epsilon=0.5, max_epsilon_report=8.0), lambda t: t, "seconds", "epsilon"),
    ],
)
def test_registry_over_the_caps_is_refused(policy: PolicyConfig, edit: object, use_case: str, parameter: str) -> None:
    """Each cap refuses the registry with a message naming the use case and the parameter."""
    registry = parse_registry(edit(REGISTRY))  # type: ignore[operator]
    with pytest.raises(PolicyError) as info:
        check_registry(registry, policy)
    assert info.value.use_case == use_case
    assert info.value.parameter == parameter
    assert f"use case {use_case!r} refused by local policy" in str(info.value)
