"""The scale mode's reports are distributed exactly as the agent's (fleet/scale.py).

* Where the vectorised privatizer spends the coins in the agent's order (1BitMean, dBitFlipPM,
  randomized response, and RAPPOR, which the scale mode privatizes on the agent's own path),
  the records for given values and device states equal the agent's record for record, from
  the same seed; and a fleet of one draws the state a device draws.
* Where it does not (Count Mean Sketch, Hadamard CMS draw their row indices for the whole
  batch first), both paths are held to the mechanism's exact output distribution with a
  seeded chi-square test over the whole output space of a small sketch: the statistic must lie
  within 5 standard deviations (sqrt(2 df)) of its mean df.
* A device's memoized state is its own and is never redrawn across periods, and no device
  sends more records than its daily limit.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from typing import Any

import msgpack
import msgspec
import numpy as np
import pytest

from agent.mechanism_calls import privatize
from fleet.plan import FleetPlan
from fleet.scale import ScaleFleet, periods
from fleet.scale_privatize import device_privatizer
from protocol.randomness import SeededRandom
from protocol.registry import UseCase, parse_registry
from tests.fleet.support import FLEET_REGISTRY, every_use_case_plan

VALUES: dict[str, list[object]] = {
    "app-usage-seconds": [0, 100, 21_600, 5_000, 7, 30_000],
    "app-usage-histogram": [0, 100, 21_599, 5_000, 7, 40_000],
    "dark-mode-enabled": [True, False, True, True, False, True],
    "default-browser": ["chrome", "firefox", "chrome", "safari", "edge", "chrome"],
}

SMALL_SKETCHES = b"""
format = 1
salt = "8931a5b30703b97d21afd068b337b4e64df4a393300b6f6a514fa3a77a25da56"

[use_cases.small-cms]
mechanism = "cms"
epsilon = 2
period = "1d"
daily_limit = 1
lifetime_epsilon = 1_000
parameters = { k = 2, m = 4 }
[use_cases.small-cms.collector]
min_reports = 50

[use_cases.small-hcms]
mechanism = "hcms"
epsilon = 2
period = "1d"
daily_limit = 1
lifetime_epsilon = 1_000
parameters = { k = 2, m = 4 }
[use_cases.small-hcms.collector]
min_reports = 50
"""


def _registry_use_cases() -> dict[str, UseCase]:
    return dict(parse_registry(FLEET_REGISTRY.read_bytes(), source=str(FLEET_REGISTRY)).use_cases)


def _agent_records(use_case: UseCase, states: list[Any], values: list[Any], seed: int) -> list[Any]:
    """Each device in turn privatizes its value on the agent's path, from one seeded source."""
    rng = SeededRandom(seed)
    return [privatize(use_case, value, state, rng)[0] for value, state in zip(values, states, strict=True)]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_records_equal_the_agents_record_for_record(name: str) -> None:
    use_case = _registry_use_cases()[name]
    devices = len(VALUES[name])
    privatizer = device_privatizer(use_case, devices, SeededRandom(11))
    values = [privatizer.value(v) for v in VALUES[name]]
    states = [privatizer.plain_state(i) for i in range(devices)]
    rows = np.arange(devices, dtype=np.int64)
    assert privatizer.records(rows, values, SeededRandom(12)) == _agent_records(use_case, states, values, 12)
    # A fleet of one draws exactly the state the device draws from the same coins.
    one = device_privatizer(use_case, 1, SeededRandom(13)).plain_state(0)
    assert one == use_case.mechanism.setup_plain(SeededRandom(13))


def _chi_square(records: list[Any], dist: dict[Any, Fraction]) -> tuple[float, int]:
    seen = Counter(tuple(r) for r in records)
    assert set(seen) <= set(dist), "a record outside the output space"
    n = len(records)
    stat = sum((seen.get(cell, 0) - n * float(p)) ** 2 / (n * float(p)) for cell, p in dist.items())
    return stat, len(dist) - 1


@pytest.mark.parametrize("name", ["small-cms", "small-hcms"])
def test_sketch_records_follow_the_exact_distribution(name: str) -> None:
    use_case = parse_registry(SMALL_SKETCHES, source="small sketches").use_cases[name]
    n = 40_000
    value = "site1.example"
    privatizer = device_privatizer(use_case, n, SeededRandom(21))
    scale = privatizer.records(np.arange(n, dtype=np.int64), [privatizer.value(value)] * n, SeededRandom(22))
    agent = _agent_records(use_case, [None] * n, [value] * n, 23)
    dist = use_case.mechanism.output_distribution(value)  # type: ignore[attr-defined]
    for records in (scale, agent):
        stat, df = _chi_square(records, dist)
        assert abs(stat - df) <= 5 * math.sqrt(2 * df), (name, stat, df)


def _plan(days: int, registry_text: bytes, devices: int = 40) -> FleetPlan:
    return every_use_case_plan(devices=devices, days=days, seed=5, text=registry_text)


def _snapshot(fleet: ScaleFleet) -> dict[str, bytes]:
    """Every use case's per-device state, as bytes."""
    return {
        name: msgspec.msgpack.encode([p.plain_state(i) for i in range(fleet.plan.devices)])
        for name, p in fleet.privatizers.items()
    }


def test_memoized_state_is_per_device_and_never_redrawn() -> None:
    fleet = ScaleFleet(_plan(3, FLEET_REGISTRY.read_bytes()), "fleet-sim")
    before = _snapshot(fleet)
    reports = [r for _, batch in periods(fleet) for r in batch]
    assert reports
    after = _snapshot(fleet)
    for name in ("app-usage-seconds", "app-usage-histogram"):
        assert after[name] == before[name], name  # the same α, memo bits, buckets and answers after 3 days
        states = [msgspec.msgpack.encode(fleet.privatizers[name].plain_state(i)) for i in range(40)]
        assert len(set(states)) > 30, name  # each device drew its own
    # RAPPOR: the cohort and key stay; a device's memoized B' for its value is drawn once.
    rappor = fleet.privatizers["default-browser"]
    for i in range(40):
        state = rappor.plain_state(i)
        assert msgspec.msgpack.encode(state) == msgspec.msgpack.encode(rappor.plain_state(i))
    # Each device publishes under its own sub-identity.
    assert {r.topic for r in reports if r.device == 7} == {
        f"ldp/v1/reports/fleet-sim/0000007/{name}" for name in fleet.plan.use_cases
    }


def test_rappor_memo_is_reused_for_the_same_value() -> None:
    use_case = _registry_use_cases()["default-browser"]
    privatizer = device_privatizer(use_case, 1, SeededRandom(31))
    rows = np.zeros(1, dtype=np.int64)
    privatizer.records(rows, ["chrome"], SeededRandom(32))
    first = msgspec.msgpack.encode(privatizer.plain_state(0))
    privatizer.records(rows, ["chrome"], SeededRandom(33))
    assert msgspec.msgpack.encode(privatizer.plain_state(0)) == first  # no new memo entry


def test_no_device_passes_its_daily_limit() -> None:
    # Four 6-hour periods a day against a limit of 2: the scale mode sends two and holds back two.
    # app-usage-seconds is the registry's first 6-hour use case.
    text = FLEET_REGISTRY.read_bytes().replace(b'period = "6h"\ndaily_limit = 4', b'period = "6h"\ndaily_limit = 2', 1)
    assert text != FLEET_REGISTRY.read_bytes()
    days = 3
    fleet = ScaleFleet(_plan(days, text), "fleet-sim")
    per_day: Counter[tuple[int, str, int]] = Counter()
    records: Counter[str] = Counter()
    for slot, batch in periods(fleet):
        for r in batch:
            per_day[(r.device, r.use_case.name, slot // 4)] += len(msgpack.unpackb(r.payload)["r"])
            records[r.use_case.name] += 1
    limits = {name: uc.daily_limit for name, uc in fleet.plan.registry().use_cases.items()}
    assert all(n <= limits[name] for (_, name, _), n in per_day.items())
    assert records["app-usage-seconds"] == 40 * days * 2
    assert fleet.result.unsent["app-usage-seconds"] == 40 * days * 2
    assert records["app-usage-histogram"] == 40 * days * 4
