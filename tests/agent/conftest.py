"""Fixtures of the agent tests: a small registry, a fake clock, seeded agents, config files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.core import Agent
from agent.sealed import Sealer
from agent.state import LEDGER_VERSION
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from tests.support.clocks import FakeClock

KEY = bytes(range(32))
"""The state key the tests seal with."""

START = 1_700_000_000.0 - 1_700_000_000.0 % 86_400 + 3_600.0
"""01:00 UTC on a day in November 2023: the fake clock's starting time."""

REGISTRY = """
format = 1
salt = "0547eed0fe23ed365173a6e9b965e343b4927d0967009d668d6df9ead8a2030c"

[use_cases.flag]
mechanism = "rr"
epsilon = 1.0
period = "1d"
daily_limit = 3
lifetime_epsilon = 10
[use_cases.flag.collector]
min_reports = 1

[use_cases.seconds]
mechanism = "one-bit-mean"
epsilon = 1
period = "6h"
daily_limit = 8
lifetime_epsilon = 100
parameters = { m = 21600, gamma = 0.2 }
[use_cases.seconds.collector]
min_reports = 1

[use_cases.hist]
mechanism = "dbitflip"
epsilon = 1
period = "6h"
daily_limit = 8
lifetime_epsilon = 100
[use_cases.hist.parameters]
d = 4
buckets = { kind = "linear", low = 0, high = 21600, count = 32 }
[use_cases.hist.collector]
min_reports = 1

[use_cases.procs]
mechanism = "rappor"
epsilon = 0.54
period = "1d"
daily_limit = 5
lifetime_epsilon = 100
parameters = { k = 128, h = 2, cohorts = 32, f = 0.75, p = 0.5, q = 0.75 }
[use_cases.procs.collector]
min_reports = 1

[use_cases.words]
mechanism = "hcms"
epsilon = 4
period = "1d"
daily_limit = 2
lifetime_epsilon = 100
parameters = { k = 1024, m = 1024 }
[use_cases.words.collector]
min_reports = 1
"""


def read_sealed(path: Path, purpose: str, version: int | None = None) -> Any:
    """Decrypt a sealed state file with the tests' key (by default at the version this release writes)."""
    if version is None:
        version = LEDGER_VERSION if purpose == "ledger" else 1
    return Sealer(KEY).read(path, purpose, version)


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    """The test registry, written to a file."""
    path = tmp_path / "usecases.toml"
    path.write_text(REGISTRY, encoding="utf-8")
    return path


@pytest.fixture
def registry(registry_path: Path) -> Registry:
    """The test registry, parsed."""
    return parse_registry(registry_path.read_bytes(), source=str(registry_path))


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at 01:00 UTC."""
    return FakeClock(START)


@pytest.fixture
def make_agent(tmp_path: Path, registry: Registry, clock: FakeClock) -> Callable[..., Agent]:
    """Build an agent over ``tmp_path/state`` (again and again: a restart reads the same files)."""

    def build(*, seed: int = 7, registry_override: Registry | None = None, **kwargs: Any) -> Agent:
        return Agent(
            registry=registry_override or registry,
            state_dir=tmp_path / "state",
            sealer=Sealer(KEY),
            clock=clock,
            rng=SeededRandom(seed),
            **kwargs,
        )

    return build
