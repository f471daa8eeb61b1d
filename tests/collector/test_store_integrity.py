"""A store that knows it is intact: bit flips in every table and index either change nothing
or stop the collector naming the file; a missing database where one existed is an error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from collector.cli import EXIT_STORE, main
from collector.errors import StoreError
from collector.store import CheckpointStore
from protocol.registry import Registry
from tests.collector.corruption import OUTCOMES, populate, run, table


def test_bit_flips_in_every_table_and_index_never_give_a_silent_wrong_number(
    tmp_path: Path, registry: Registry
) -> None:
    """>= 400 seeded single-bit flips over every table and index: no effect, or refused naming the file."""
    results = list(run(tmp_path, registry, 36, seed=20261124))
    print("\n" + table(results))
    assert len(results) >= 400
    bad = [(f, k, d) for f, k, d in results if k in ("SILENT", "CRASH")]
    assert not bad, bad[:5]
    objects = {f.object for f, _, _ in results}
    assert {"aggregates", "segments", "seen", "use_cases", "counters", "meta", "segments_key"} <= objects
    for name in objects - {"sqlite_sequence"}:
        assert any(f.object == name and k.startswith("refused") for f, k, _ in results), name
    assert {k for _, k, _ in results} <= set(OUTCOMES)


def test_a_missing_database_where_one_existed_is_an_error_not_a_fresh_start(tmp_path: Path, registry: Registry) -> None:
    """A deleted database leaves its marker: opening refuses, naming both files; without the marker it starts."""
    path = tmp_path / "state" / "collector.sqlite3"
    populate(path, registry)
    marker = path.with_name(path.name + ".id")
    assert marker.exists()
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    with pytest.raises(StoreError) as info:
        CheckpointStore(path, registry, instance="t")
    assert str(path) in str(info.value)
    assert str(marker) in str(info.value)
    assert "Restore it from a backup" in str(info.value)
    assert not path.exists()  # nothing was created in its place
    marker.unlink()
    CheckpointStore(path, registry, instance="t").close()


def test_another_database_in_place_of_the_recorded_one_is_refused(tmp_path: Path, registry: Registry) -> None:
    """A database whose store id differs from the marker's is not silently adopted."""
    path = tmp_path / "a.sqlite3"
    CheckpointStore(path, registry, instance="t").close()
    path.with_name(path.name + ".id").write_text("0123456789abcdef\n", encoding="utf-8")
    with pytest.raises(StoreError, match="0123456789abcdef"):
        CheckpointStore(path, registry, instance="t")


def test_a_damaged_store_stops_the_collector_at_start_with_a_named_cause(
    tmp_path: Path, registry: Registry, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run` on a store whose checksum fails exits with EXIT_STORE and a message naming the file and the table."""
    store_path = tmp_path / "ckpt.sqlite3"
    populate(store_path, registry)
    db = sqlite3.connect(store_path)
    db.execute("UPDATE use_cases SET low_water = low_water + 64 WHERE name = 'usage'")  # a mark moved ahead
    db.commit()
    db.close()
    config = tmp_path / "c.toml"
    config.write_text(
        f'registry = "{registry_path}"\n[store]\npath = "{store_path}"\n[http]\nenabled = false\n'
        "[mqtt]\nport = 1\nreconnect_max_s = 0.1\n",
        encoding="utf-8",
    )
    assert main(["--config", str(config), "run"]) == EXIT_STORE
    err = capsys.readouterr().err
    assert str(store_path) in err
    assert "use_cases" in err
    assert "restore it from a backup" in err


def test_bit_flips_read_only_give_no_silent_wrong_number(tmp_path: Path, registry: Registry) -> None:
    """The same >= 500 flips opened read-only (status, estimate, the live view): flips in
    indexes and ``sqlite_sequence`` included, every one changes nothing or is refused naming the file."""
    results = list(run(tmp_path, registry, 36, seed=20261124, readonly=True))
    print("\n" + table(results))
    assert len(results) >= 500
    bad = [(f, k, d) for f, k, d in results if k in ("SILENT", "CRASH")]
    assert not bad, bad[:5]
    for name in ("segments_key", "sqlite_autoindex_use_cases_1"):
        assert any(f.object == name and k.startswith("refused") for f, k, _ in results), name
