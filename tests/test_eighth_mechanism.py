"""An eighth mechanism, from a test module, runs through agent, collector and planner.

``tests/krr.py`` (k-ary randomized response) is one module with a device half and a server
half, written against :mod:`protocol.interfaces` and :mod:`protocol.server.contract` only;
nothing in ``agent/``, ``collector/`` or the registry names it. These tests load a registry
that uses it (its entry passed beside the built-in ones, or named by ``LDP_MECHANISMS``),
record values on a real :class:`agent.core.Agent`, decode its reports with the wire codec,
fold them in a real checkpoint store and estimate them with
:func:`collector.estimation.estimate_aggregate`, and plan it with the planner's generic verb.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from agent.core import Agent
from agent.errors import ValueRefusedError
from agent.mechanism_calls import coerce_text, privatization_of
from agent.sealed import Sealer
from collector.estimation import estimate_aggregate
from collector.planner import main as plan_main
from collector.planner import plan_use_case
from collector.results import ReleaseDecision
from collector.store import CheckpointStore
from protocol.interfaces import EstimateKind, FrequencyMechanism, Mechanism, Privatization, as_frequencies
from protocol.randomness import SeededRandom
from protocol.registry import BUILTIN_MECHANISMS, Registry, RegistryError, parse_registry
from protocol.server.contract import ServerMechanism, frequency_server
from protocol.wire import decode_report
from tests.krr import ENTRY, KaryRandomizedResponse, KrrServer
from tests.support.clocks import FakeClock

KEY = bytes(range(32))
DAY = 86_400.0
START = 1_700_006_400.0  # midnight UTC

CATEGORIES = ("dark", "light", "auto", "contrast")
REGISTRY = f"""
format = 1

[use_cases.theme]
mechanism = "krr"
epsilon = 2
period = "1d"
daily_limit = 10
lifetime_epsilon = 1000
parameters = {{ categories = {list(CATEGORIES)!r} }}
[use_cases.theme.collector]
min_reports = 50
""".replace("'", '"')


MECHANISMS = (*BUILTIN_MECHANISMS, ENTRY)


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """A registry with one use case of the toy mechanism."""
    path = tmp_path / "usecases.toml"
    path.write_text(REGISTRY, encoding="utf-8")
    return parse_registry(path.read_bytes(), source=str(path), mechanisms=MECHANISMS)


def test_the_registry_builds_the_toy_only_when_given_its_entry() -> None:
    """Not given, the name is unknown; given, the registry builds it from its dataclass fields."""
    with pytest.raises(RegistryError) as err:
        parse_registry(REGISTRY, source="t.toml")
    assert err.value.kind == "unknown-mechanism"
    registry = parse_registry(REGISTRY, source="t.toml", mechanisms=MECHANISMS)
    mech = registry["theme"].mechanism
    assert isinstance(mech, KaryRandomizedResponse)
    assert isinstance(mech, Mechanism)
    assert isinstance(mech, FrequencyMechanism)
    assert isinstance(registry["theme"].server, KrrServer)
    assert isinstance(registry["theme"].server, ServerMechanism)
    assert mech.categories == CATEGORIES
    assert registry["theme"].cost == pytest.approx(mech.epsilon_report)
    assert mech.epsilon_report <= 2


def test_the_toy_flows_through_agent_collector_and_estimate(registry: Registry, tmp_path: Path) -> None:
    """Record -> report -> decode -> store fold -> estimate: every count within 5 SE of the truth."""
    use_case = registry["theme"]
    assert privatization_of(use_case) is Privatization.EVENT
    assert coerce_text(use_case, "auto") == "auto"
    truth = Counter({"dark": 600, "light": 250, "auto": 150, "contrast": 0})
    values = [v for v, c in truth.items() for _ in range(c)]
    clock = FakeClock(START + 3_600)
    reports = []
    # 100 devices with ten events each (the daily limit): event-level privacy, one report per device.
    for i in range(100):
        agent = Agent(
            registry=registry,
            state_dir=tmp_path / "devices" / str(i),
            sealer=Sealer(KEY),
            clock=clock,
            rng=SeededRandom(1000 + i),
        )
        agent.grant_consent()
        for value in values[i::100]:
            assert agent.record("theme", value).outcome == "recorded"
        if i == 0:
            with pytest.raises(ValueRefusedError, match=r"use case 'theme' \(krr\) takes one of its 4 categories"):
                agent.record("theme", "sepia")
        reports.append(agent)
    clock.set(START + 3_600 + DAY)
    period = use_case.period.index_at(START + 3_600)
    store = CheckpointStore(tmp_path / "store.db", registry)
    try:
        decoded = []
        for agent in reports:
            assert agent.collect().reports == 1
            (pending,) = agent.outbox()
            decoded.append(decode_report(pending.entry.payload, registry))
        for i in range(0, len(decoded), 250):
            store.commit(decoded[i : i + 250], {})
        aggregate, info = store.aggregate(use_case.ref, period)
    finally:
        store.close()
    assert (info.reports, info.records) == (100, len(values))
    result = estimate_aggregate(use_case, aggregate, info)
    assert result.released
    assert result.kind == "frequencies"
    assert isinstance(result.estimate, ReleaseDecision)
    items = {item.value: item for item in result.estimate.items}
    withheld = result.estimate.withheld
    assert len(items) + withheld == len(CATEGORIES)
    for name, item in items.items():
        assert item.count is not None
        assert item.standard_error is not None
        assert abs(item.count - truth[name]) <= 5 * item.standard_error, name
    assert {"dark", "light"} <= set(items)


def test_the_planner_plans_the_toy_from_its_own_formula(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_use_case and 'plan use-case' (the entry named by LDP_MECHANISMS) print the module's SE."""
    use_case = registry["theme"]
    mech = as_frequencies(use_case.mechanism)
    assert mech.kind is EstimateKind.CATEGORIES
    out = plan_use_case(use_case, n=10_000)
    p = KaryRandomizedResponse(epsilon=2, categories=CATEGORIES).p
    q = frequency_server(use_case.server).plan(1).standard_error
    assert out["mechanism"] == "krr"
    assert out["unit"] == "count"
    assert out["standard_error"] == pytest.approx(q * math.sqrt(10_000))
    assert 0 < p < 1
    path = tmp_path / "usecases.toml"
    path.write_text(REGISTRY, encoding="utf-8")
    assert plan_main(["use-case", "--registry", str(path), "theme", "--n", "1e4", "--json"]) == 2  # unknown mechanism
    monkeypatch.setenv("LDP_MECHANISMS", "tests.krr:ENTRY")
    assert plan_main(["use-case", "--registry", str(path), "theme", "--n", "1e4", "--json"]) == 0
