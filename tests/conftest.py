"""Shared fixtures: seeded randomness only (devices use the OS CSPRNG)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from protocol.randomness import SeededRandom
from tests.collector.processes import close_readers
from tests.support.broker import Broker, running_broker
from tests.support.postgres import PostgresServer, running_postgres

# Property tests are deterministic too: examples come from a fixed seed per test (derandomize),
# and nothing depends on how fast this machine runs them (no per-example deadline, no health
# check that measures generation time).
settings.register_profile(
    "ldp", derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ldp")


@pytest.fixture
def rng() -> SeededRandom:
    """A seeded source, so every statistical test is deterministic."""
    return SeededRandom(20171204)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A real Mosquitto broker on a free loopback port, stopped after the test."""
    with running_broker(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One real PostgreSQL cluster for the session (``initdb`` takes seconds); see ``postgres``."""
    with running_postgres(tmp_path_factory.mktemp("postgres")) as server:
        try:
            yield server
        finally:
            # The read-only stores tests poll through are kept open between polls: close
            # them before the server goes.
            close_readers()


_databases = itertools.count()


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> PostgresServer:
    """The session's PostgreSQL with a fresh, empty database of this test's own."""
    name = f"test_{next(_databases)}"
    postgres_server.run_sql(f"CREATE DATABASE {name} OWNER {postgres_server.user}")
    return postgres_server.with_database(name)
