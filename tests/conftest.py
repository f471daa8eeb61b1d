"""Shared fixtures: seeded randomness only (devices use the OS CSPRNG)."""

from __future__ import annotations

import pytest

from protocol.randomness import SeededRandom


@pytest.fixture
def rng() -> SeededRandom:
    """A seeded source, so every statistical test is deterministic."""
    return SeededRandom(20171204)
