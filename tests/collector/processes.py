"""Collector subprocesses for fault tests and benchmarks: config, readiness, kill -9, publishing."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from collector.config import StoreConfig
from collector.errors import StoreError, StoreUnavailable
from collector.store import CheckpointStore, Store
from collector.store.postgres import PostgresStore
from protocol.registry import Registry
from tests.support.mqtt_publisher import MqttPublisher
from tests.support.notify import NotifyListener

ROOT = Path(__file__).resolve().parents[2]


def write_config(
    directory: Path,
    *,
    registry: Path,
    host: str,
    port: int,
    client_id: str = "ldp-collector-test",
    store: Path | str | None = None,
    instance: str = "test",
    shared_group: str = "",
    extra: str = "",
    store_extra: str = "",
    http_port: int | None = None,
) -> Path:
    """A collector config file for a broker on loopback.

    ``store`` is a SQLite file (default: ``collector.sqlite3`` in ``directory``) or a
    PostgreSQL URL (``postgresql://...``: every collector given the same URL shares it).
    """
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(store, str):
        store_keys = f'url = "{store}"'
    else:
        store_keys = f'path = "{store or directory / "collector.sqlite3"}"'

    path = directory / f"{instance}.toml"
    http = f"[http]\nenabled = true\nport = {http_port}\n" if http_port is not None else "[http]\nenabled = false\n"
    path.write_text(
        f"""registry = "{registry}"
instance = "{instance}"

[mqtt]
host = "{host}"
port = {port}
client_id = "{client_id}"
shared_group = "{shared_group}"
keepalive_s = 10
reconnect_max_s = 0.5

[ingest]
commit_max_reports = 2000
commit_interval_s = 0.05

[store]
{store_keys}
{store_extra}

{http}
{extra}
""",
        encoding="utf-8",
    )
    return path


class CollectorProcess:
    """``python -m collector run`` as a child process, with systemd-style readiness.

    Readiness comes over ``NOTIFY_SOCKET`` (an abstract Unix datagram socket), exactly as
    systemd's Type=notify would receive it: "READY=1" once the subscription is granted.

    Args:
        config: the collector's config file.
        log: where its output goes.
        prefix: a command the collector runs under (``ip netns exec NS`` puts it on another
            network host).
        notify_path: a filesystem path for the notify socket instead of an abstract address
            (abstract Unix addresses belong to one network namespace).
    """

    def __init__(self, config: Path, *, log: Path, prefix: Sequence[str] = (), notify_path: Path | None = None) -> None:
        self.config = config
        self.log = log
        self.prefix = list(prefix)
        self.process: subprocess.Popen[bytes] | None = None
        # Read continuously, as systemd does.
        self._notify = NotifyListener(None if notify_path is None else str(notify_path))
        self._since = 0
        self.starts = 0

    def start(self, *, ready_timeout: float = 120.0) -> None:
        """Start the collector and wait for READY=1."""
        self.launch()
        self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait for READY=1 from the process started by :meth:`launch`."""
        self._wait_for(b"READY=1", timeout)

    def launch(self) -> None:
        """Start the collector without waiting for it."""
        env = dict(os.environ, NOTIFY_SOCKET=self._notify.address, PYTHONPATH=str(ROOT))
        self._since = self._notify.mark()  # this instance's messages come after the earlier ones
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "collector", "--config", str(self.config), "run"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def _wait_for(self, message: bytes, timeout: float) -> None:
        process = self.process
        assert process is not None
        self._notify.wait_for(
            message.decode(),
            since=self._since,
            timeout=timeout,
            alive=lambda: process.poll() is None,
            what=f"the collector (see {self.log})",
        )

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self.process is not None
        return self.process.pid

    def kill9(self) -> None:
        """SIGKILL: no cleanup, no commit of the buffer, no DISCONNECT."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.process is None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        self.process = None
        return code

    def close(self) -> None:
        """Kill the process if it still runs and release the socket."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._notify.close()


def open_readonly(store: Path | str, registry: Registry) -> Store | None:
    """The store at a SQLite path or a PostgreSQL URL, read-only; None if nothing was written there yet."""
    if isinstance(store, str):
        try:
            return PostgresStore(StoreConfig(url=store), registry, readonly=True)
        except StoreError as exc:
            if "no checkpoint schema" in str(exc):
                return None
            raise
    if not store.exists():
        return None
    return CheckpointStore(store, registry, readonly=True)


# Read-only PostgreSQL stores kept open between polls, by (URL, registry): a new connection
# forks a server process, and polling every 50 ms with fresh ones cost the database (and so
# the collectors under measurement) more than the query. The few most recent are kept.
_readers: collections.OrderedDict[tuple[str, int], Store] = collections.OrderedDict()
_READERS = 4


def close_readers() -> None:
    """Close the read-only stores kept between polls (at the end of the test session)."""
    while _readers:
        _readers.popitem()[1].close()


def _postgres_counters(url: str, registry: Registry, instance: str | None) -> dict[str, int]:
    key = (url, id(registry))
    store = _readers.pop(key, None)
    for attempt in range(2):
        if store is None:
            store = open_readonly(url, registry)
            if store is None:
                return {}
        try:
            counters = store.counters(instance)
        except StoreUnavailable:
            store.close()
            store = None
            if attempt:
                raise
            continue  # a connection broken by a server restart: once more, on a new one
        _readers[key] = store
        while len(_readers) > _READERS:
            _readers.popitem(last=False)[1].close()
        return counters
    raise AssertionError("unreachable")


def committed(store_path: Path | str, registry: Registry, instance: str | None = None) -> dict[str, int]:
    """Lifetime counters committed in the store by ``instance``, or summed over its instances
    (empty if it does not exist yet).

    ``store_path`` is a SQLite file or a PostgreSQL URL (whose read-only connection is kept for
    the next call).

    Raises:
        StoreUnavailable: the PostgreSQL server cannot be reached.
    """
    if isinstance(store_path, str):
        return _postgres_counters(store_path, registry, instance)
    store = open_readonly(store_path, registry)
    if store is None:
        return {}
    try:
        return store.counters(instance)
    finally:
        store.close()


def wait_committed(store_path: Path | str, registry: Registry, reports: int, *, timeout: float) -> dict[str, int]:
    """Poll the store until ``reports`` reports are committed (or raise TimeoutError).

    A PostgreSQL server that cannot be reached (restarting) counts as "not yet".
    """
    deadline = time.monotonic() + timeout
    counters: dict[str, int] = {}
    while True:
        try:
            counters = committed(store_path, registry)
        except StoreUnavailable as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the store stayed unavailable: {exc}") from exc
        if counters.get("reports", 0) >= reports:
            return counters
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {counters.get('reports', 0)} of {reports} reports committed: {counters}")
        time.sleep(0.05)


class BackgroundPublishers:
    """Several MQTT clients publishing QoS 1 streams from a background thread, rate-limited.

    ``allow(n)`` gates the stream by count: the publishers hold back whatever would take the total
    past ``n`` (until the next ``allow``), so a test can interrupt the collector or the broker at a
    known point of the stream however fast or slow the machine is. Without a gate everything goes.
    """

    def __init__(
        self,
        host: str,
        port: int,
        streams: Sequence[Sequence[tuple[str, bytes]]],
        *,
        rate: float | None = None,
        chunk: int = 500,
    ) -> None:
        self.host = host
        self.port = port
        self.streams = streams
        self.rate = rate
        self.chunk = chunk
        self.error: BaseException | None = None
        self.published = 0
        self.resent = 0
        self.allowed: int | None = None
        self._reserved = 0
        self._gate = threading.Lock()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="publishers", daemon=True)

    @property
    def in_flight(self) -> int:
        """Messages taken past the gate but not yet acknowledged by the broker."""
        return self._reserved - self.published

    def allow(self, count: int | None) -> None:
        """Let the publishers send up to ``count`` messages in all (None: no limit)."""
        with self._gate:
            self.allowed = count

    def hold(self) -> None:
        """Close the gate where it stands: nothing more is taken (what was taken still goes out)."""
        with self._gate:
            self.allowed = self._reserved

    def _take(self, count: int) -> bool:
        with self._gate:  # the check and the reservation at once, against hold()
            if self.allowed is not None and self._reserved + count > self.allowed:
                return False
            self._reserved += count
            return True

    def start(self) -> None:
        """Start publishing."""
        self._thread.start()

    def _main(self) -> None:
        try:
            asyncio.run(self._publish_all())
        except BaseException as exc:  # surfaced by join()
            self.error = exc
        finally:
            self.done.set()

    async def _one(self, index: int, stream: Sequence[tuple[str, bytes]]) -> None:
        publisher = MqttPublisher(self.host, self.port, client_id=f"device-gw-{index}", window=1000)
        per_client = self.rate / len(self.streams) if self.rate else None
        start, sent = time.monotonic(), 0
        for i in range(0, len(stream), self.chunk):
            part = stream[i : i + self.chunk]
            waited = False
            while not self._take(len(part)):
                waited = True
                await asyncio.sleep(0.01)  # polling the gate that the test thread moves
            if waited:
                start, sent = time.monotonic(), 0  # the rate counts from the gate's opening, no burst
            stats = await publisher.publish_all(part, deadline_s=300)
            self.published += len(part)
            self.resent += stats.resent
            sent += len(part)
            if per_client:
                ahead = sent / per_client - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    async def _publish_all(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i, stream in enumerate(self.streams):
                tg.create_task(self._one(i, stream))

    def join(self, timeout: float) -> None:
        """Wait for the end; re-raise a publisher failure."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("publishers did not finish")
        if self.error is not None:
            raise self.error


def run_in_thread(factory: Callable[[], Coroutine[Any, Any, Any]]) -> threading.Thread:
    """Run a coroutine in its own event loop on a daemon thread."""
    thread = threading.Thread(target=lambda: asyncio.run(factory()), daemon=True)
    thread.start()
    return thread
