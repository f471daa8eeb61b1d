"""A full disk bends the collector, it does not break it: through a real Mosquitto, with the
store on a small tmpfs that is filled mid-stream, the collector stays up, acknowledges
nothing it could not commit, reports itself unhealthy with the cause, and once space is
freed counts every report exactly once (compared with an in-process reference aggregate)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.errors import StoreUnavailable
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.processes import BackgroundPublishers, CollectorProcess, committed, wait_committed, write_config
from tests.collector.support import current_period, privatized_reports
from tests.collector.test_faults import _check_exact, _stream
from tests.support.broker import Broker, free_port

FIRST = 2_000
SECOND = 20_000


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted for the test (needs root), unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _fill(directory: Path) -> Path:
    """Write a file until the file system is full; return it."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    failure = 0
    with filler.open("wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        while not failure:
            try:
                f.write(chunk)
            except OSError as exc:
                failure = exc.errno or -1
    assert failure == errno.ENOSPC
    # Also take the last partial block.
    with filler.open("ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 512)
    return filler


def test_disk_full_stops_acknowledging_reports_unhealthy_and_resumes_exactly_once(
    tmp_path: Path, small_tmpfs: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Disk full mid-stream: up, 503 with cause disk-full, acks only what is committed; after freeing space, exact."""
    store_path = small_tmpfs / "ckpt.sqlite3"
    http_port = free_port()
    config = write_config(
        tmp_path / "c",
        registry=registry_path,
        host=mosquitto.host,
        port=mosquitto.port,
        store=store_path,
        http_port=http_port,
    )
    log = tmp_path / "collector.log"
    collector = CollectorProcess(config, log=log)
    first = _stream(registry, FIRST, seed=31)
    second = _stream(registry, SECOND, seed=32)
    try:
        collector.start()
        pub = BackgroundPublishers(mosquitto.host, mosquitto.port, [first], rate=None)
        pub.start()
        pub.join(timeout=120)
        wait_committed(store_path, registry, FIRST, timeout=120)
        assert _get(http_port, "/healthz")[0] == 200

        filler = _fill(small_tmpfs)
        pub = BackgroundPublishers(mosquitto.host, mosquitto.port, [second[i::2] for i in range(2)], rate=None)
        pub.start()
        deadline = time.monotonic() + 120
        while True:
            status, body = _get(http_port, "/healthz")
            if status == 503:
                break
            assert time.monotonic() < deadline, f"never reported unhealthy: {body}"
            time.sleep(0.2)
        assert body["cause"] == "disk-full"
        assert str(store_path) in body["detail"]
        # While the disk is full: still serving, and nothing acknowledged beyond what is committed.
        for _ in range(5):
            _, status_doc = _get(http_port, "/api/v1/status")
            acked = status_doc["transport"]["acked"]
            stored = committed(store_path, registry)
            assert acked <= stored["messages"], (acked, stored)
            assert status_doc["live"]["store_available"] is False
            time.sleep(0.2)
        stuck = committed(store_path, registry)["reports"]
        assert stuck < FIRST + SECOND
        assert collector.process is not None
        assert collector.process.poll() is None  # up, not crashed

        filler.unlink()
        pub.join(timeout=240)
        assert pub.published == SECOND
        wait_committed(store_path, registry, FIRST + SECOND, timeout=180)
        assert _get(http_port, "/healthz")[0] == 200
        assert collector.stop() == 0
        final = _check_exact(store_path, registry, first + second)
        assert final["reports"] == FIRST + SECOND
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "checkpoint store unavailable (disk-full)" in text
        assert "available again" in text
        print(f"disk full with {stuck} of {FIRST + SECOND} committed; after freeing space: {final}")
    finally:
        collector.close()


def test_a_read_only_database_is_a_store_unavailable_that_passes(tmp_path: Path, registry: Registry) -> None:
    """A database that refuses writes (SQLITE_READONLY) fails the commit as read-only; writable again, it commits."""
    made = privatized_reports(registry, "flag", 5, period=current_period(registry, "flag"), seed=3)
    reports = [decode_report(encode_report(r), registry) for r in made]
    path = tmp_path / "ro.sqlite3"
    store = CheckpointStore(path, registry, instance="t")
    try:
        store._db.execute("PRAGMA query_only = ON")  # what a read-only file or mount does to writes
        with pytest.raises(StoreUnavailable) as info:
            store.commit(reports, {"messages": 5})
        assert info.value.cause == "read-only"
        assert str(path) in str(info.value)
        store._db.execute("PRAGMA query_only = OFF")
        assert store.commit(reports, {"messages": 5}).reports == 5
    finally:
        store.close()
