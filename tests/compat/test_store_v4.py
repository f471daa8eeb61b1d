"""A SQLite store of schema 4 (report ids and allowance slots in B-trees only) opens as schema 5.

The fixture (tests/compat/fixtures/store-v4/, written by tests/compat/make_store_v4.py with the
code of schema 4) holds identified reports of three use cases in two periods, one key compacted,
a raised low-water mark and refusals over the allowance. Schema 5 keeps recent ids in runs
(collector/store/sqlite_ids.py); what schema 4 stored must keep every promise after the
migration: the same counts, no report counted twice, no device over its allowance.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import msgpack
import pytest

from collector.errors import StoreError
from collector.store import SCHEMA_VERSION, CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, load_registry, privatized_reports

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "store-v4"
NOW = 1_709_294_400.0  # the clock make_store_v4.py wrote under


def _copy(tmp_path: Path) -> tuple[Path, Registry, dict[str, Any]]:
    """The fixture copied to ``tmp_path`` (it is migrated in place), its registry and what it holds."""
    out = tmp_path / "store-v4"
    shutil.copytree(FIXTURE, out)
    registry = load_registry(out / "registry.toml")
    written = json.loads((out / "written.json").read_text(encoding="utf-8"))
    return out / "collector.sqlite3", registry, written


def _aggregates(store: CheckpointStore) -> dict[str, list[Any]]:
    return {
        f"{k.use_case}/{k.period}": [
            msgpack.packb(store.aggregate(k.use_case, k.period)[0].to_plain()).hex(),
            k.reports,
            k.records,
        ]
        for k in store.totals()
    }


def _schema(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        ((value,),) = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchall()
    return int(value)


def test_the_fixture_is_a_schema_4_store() -> None:
    """The fixture is what the previous code wrote: schema 4, every report id in the seen table."""
    assert _schema(FIXTURE / "collector.sqlite3") == 4
    assert SCHEMA_VERSION == 5


def test_reading_only_refuses_schema_4_and_names_the_migration(tmp_path: Path) -> None:
    """Opened for reading, the schema-4 file is refused with the command that migrates it, unchanged."""
    path, registry, _ = _copy(tmp_path)
    with pytest.raises(StoreError, match="ldp-collector migrate"):
        CheckpointStore(path, registry, readonly=True)
    assert _schema(path) == 4


@pytest.mark.parametrize("ids_in_memory", [1 << 22, 1])
def test_schema_4_migrates_and_keeps_every_count_and_every_refusal(tmp_path: Path, ids_in_memory: int) -> None:
    """After migration the counts are the same, every stored report is a duplicate, and full allowances stay full."""
    path, registry, written = _copy(tmp_path)
    store = CheckpointStore(path, registry, instance="v4", ids_in_memory=ids_in_memory)
    try:
        assert store.schema == 5
        assert _aggregates(store) == written["aggregates"]
        assert store.counters() == written["counters"]
        assert store.seen_count() == written["seen"]
        assert store.low_water() == written["low_water"]
        # Every report the schema-4 store received, sent again by its device: none is folded.
        payloads = [bytes.fromhex(p) for p, _ in written["sent"]]
        senders = [s.encode() for _, s in written["sent"]]
        reports = [decode_report(p, registry) for p in payloads]
        for lo in range(0, len(reports), 25):
            result = store.commit(reports[lo : lo + 25], {}, senders[lo : lo + 25])
            assert result.reports == 0
        assert _aggregates(store) == written["aggregates"]
        # A new report of a device whose slot the schema-4 store filled is refused; a new device's counts.
        period = current_period(registry, "flag", NOW)
        made = privatized_reports(registry, "flag", 2, period=period, seed=777)
        fresh = [decode_report(encode_report(r), registry) for r in made]
        result = store.commit(fresh, {}, [b"dev-001", b"dev-900"])
        assert (result.reports, result.over_allowance) == (1, 1)
    finally:
        store.close()
    reopened = CheckpointStore(path, registry, instance="v4", ids_in_memory=ids_in_memory)
    try:
        assert reopened.seen_count() == written["seen"] + 1
        again = reopened.commit(fresh, {}, [b"dev-001", b"dev-900"])
        assert (again.reports, again.duplicates + again.over_allowance) == (0, 2)
        reopened.verify()
    finally:
        reopened.close()
