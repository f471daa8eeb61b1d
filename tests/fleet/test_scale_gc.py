"""The scale mode's garbage-collector setting holds for its run only (fleet/scale.py)."""

from __future__ import annotations

import gc

import pytest

from fleet import scale


def test_the_collector_threshold_is_restored_after_the_run_and_after_a_failure() -> None:
    before = gc.get_threshold()
    with scale._fewer_collections():
        assert gc.get_threshold() == (scale._YOUNG_COLLECTION, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), scale._fewer_collections():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before
