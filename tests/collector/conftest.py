"""Fixtures of the collector tests: a registry on disk, a fixed clock, a checkpoint store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import CheckpointStore
from protocol.registry import Registry
from tests.collector.stores import BACKENDS, StoreSite
from tests.collector.support import load_registry, write_registry

# A fixed moment (2024-03-01T12:00:00Z): period indices in tests do not depend on the date.
NOW = 1_709_294_400.0


class FixedClock:
    """A wall clock that stands still unless a test moves it."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def time(self) -> float:
        """The fixed time."""
        return self.now


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    """The test registry (one small use case per mechanism) and its dictionaries."""
    return write_registry(tmp_path / "registry")


@pytest.fixture
def registry(registry_path: Path) -> Registry:
    """The parsed test registry."""
    return load_registry(registry_path)


@pytest.fixture
def clock() -> FixedClock:
    """A clock fixed at NOW."""
    return FixedClock()


@pytest.fixture
def store(tmp_path: Path, registry: Registry) -> Iterator[CheckpointStore]:
    """A fresh checkpoint database."""
    s = CheckpointStore(tmp_path / "ckpt.sqlite3", registry, instance="test")
    yield s
    s.close()


@pytest.fixture(params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSite:
    """Where this test's store lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return StoreSite("postgres", tmp_path / "ckpt.sqlite3", request.getfixturevalue("postgres"))
    return StoreSite("sqlite", tmp_path / "ckpt.sqlite3")
