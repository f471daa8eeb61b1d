"""Fixtures of the compatibility tests: the previous release, installed; a store on either backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.collector.stores import BACKENDS, StoreSite
from tests.compat.previous_release import PreviousRelease, install


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> PreviousRelease:
    """Release 0.1.0, unpacked from its wheel (tests/compat/previous/)."""
    return install(tmp_path_factory.mktemp("previous-release"))


@pytest.fixture(params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSite:
    """Where this test's store lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return StoreSite("postgres", tmp_path / "ckpt.sqlite3", request.getfixturevalue("postgres"))
    return StoreSite("sqlite", tmp_path / "ckpt.sqlite3")
