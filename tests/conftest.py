"""Shared fixtures: seeded randomness only (devices use the OS CSPRNG)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.randomness import SeededRandom
from tests.support.broker import Broker, running_broker


@pytest.fixture
def rng() -> SeededRandom:
    """A seeded source, so every statistical test is deterministic."""
    return SeededRandom(20171204)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A real Mosquitto broker on a free loopback port, stopped after the test."""
    with running_broker(tmp_path / "broker") as broker:
        yield broker
