"""``ldp-collector run`` sets the cyclic garbage collector for a long-lived service (collector/heap.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector import cli
from collector.config import CollectorConfig
from collector.heap import YOUNG_COLLECTION


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_run_command_sets_fewer_young_passes_and_freezes_the_start_up_heap(
    restored_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    async def fake_run_service(config: CollectorConfig, **kwargs: Any) -> None:
        seen["threshold"] = gc.get_threshold()
        kwargs["on_ready"](object())  # the service is ready
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(cli, "run_service", fake_run_service)
    gc.unfreeze()
    assert cli._run(CollectorConfig(registry=Path("usecases.toml"))) == 0
    assert seen["threshold"][0] == YOUNG_COLLECTION
    assert seen["threshold"][1:] == gc.get_threshold()[1:]
    assert seen["frozen"] > 0
