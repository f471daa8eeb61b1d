"""A collector whose open-file table a flood of HTTP clients has filled waits out a broker restart:
still running, reconnected and counting once the connections are freed, the shortage counted in
``/metrics``; a CA file that cannot be read at start still ends it with the config-error status.

The collector runs as its own process under a low open-file limit (``prlimit``) against a real
Mosquitto over TLS. Every wait polls with a deadline: nothing depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.registry import Registry
from runtime.exit_status import ExitStatus
from tests.collector.processes import CollectorProcess, wait_committed, write_config
from tests.collector.support import bit_reports, current_period
from tests.collector.test_tls import _make_pki
from tests.support.broker import Broker, free_port, running_broker
from tests.support.mqtt_publisher import MqttPublisher

PRLIMIT = shutil.which("prlimit")
LIMIT = 64
"""The collector's open-file limit: about 15 descriptors in use when idle, so about 50 HTTP
connections fill it."""
DEADLINE = 120.0

pytestmark = pytest.mark.skipif(PRLIMIT is None, reason="prlimit (util-linux) is not installed")


class _Slowloris:
    """Holds connections to a port that send nothing, as many as the server takes and a backlog
    more; one the server closes (its head deadline) is replaced, so its table stays full."""

    def __init__(self, port: int, *, held: int = 300) -> None:
        self.port = port
        self.held = held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="slowloris", daemon=True)

    def __enter__(self) -> _Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _main(self) -> None:
        sockets: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                while len(sockets) < self.held:
                    s = socket.socket()
                    s.setblocking(False)
                    s.connect_ex(("127.0.0.1", self.port))
                    sockets.append(s)
                readable, _, _ = select.select(sockets, [], [], 0.05)
                for s in readable:  # closed by the server (or refused): replaced
                    sockets.remove(s)
                    s.close()
        finally:
            for s in sockets:
                s.close()


def _until(predicate: Callable[[], bool], what: str, *, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert alive(), f"the collector ended while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE:g} s"
        time.sleep(0.05)


def _get(port: int, path: str) -> tuple[int, str] | None:
    """An answer of the HTTP API, or None while it cannot take the connection."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except (OSError, urllib.error.URLError):
        return None


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in the Prometheus text ``text`` (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name + (f"{{{want}}}" if want else "")) + r" ([0-9.e+]+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def _publish(broker: Broker, registry: Registry, count: int, seed: int) -> None:
    period = current_period(registry, "flag")
    items = [("ldp/v1/reports/flag", p) for p in bit_reports(registry, "flag", count, period=period, seed=seed)]
    publisher = MqttPublisher(broker.host, broker.port, client_id=f"flood-publisher-{seed}")
    asyncio.run(publisher.publish_all(items, deadline_s=DEADLINE))


def _tls_broker(tmp_path: Path) -> tuple[str, int, Path]:
    """The broker's extra config (a TLS listener), its port, and a copy of the CA for the collector."""
    ca, cert, key = _make_pki(tmp_path / "pki")
    tls_port = free_port()
    mine = tmp_path / "collector-ca.pem"
    shutil.copyfile(ca, mine)
    return f"listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n", tls_port, mine


def test_a_full_file_table_through_a_broker_restart_is_waited_out_retried_and_counted(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Table full, broker restarted: EMFILE retried and counted, not a config error; freed, it reconnects and counts."""
    extra, tls_port, ca = _tls_broker(tmp_path)
    http = free_port()
    store = tmp_path / "ckpt.sqlite3"
    with running_broker(tmp_path / "broker", extra_config=extra) as broker:
        config = write_config(
            tmp_path, registry=registry_path, host=broker.host, port=tls_port, store=store, http_port=http,
            extra=f'[mqtt.tls]\nca_file = "{ca}"\n',
        )  # fmt: skip
        assert PRLIMIT is not None
        log = tmp_path / "collector.log"
        collector = CollectorProcess(config, log=log, prefix=[PRLIMIT, f"--nofile={LIMIT}:{LIMIT}", "--"])
        try:
            collector.start()
            alive = lambda: collector.process is not None and collector.process.poll() is None  # noqa: E731
            _publish(broker, registry, 50, seed=1)
            wait_committed(store, registry, 50, timeout=DEADLINE)
            # A reconnect reads no file: the CA the collector was started with is gone from now on.
            ca.unlink()
            fds = Path(f"/proc/{collector.pid}/fd")
            with _Slowloris(http):
                _until(lambda: len(os.listdir(fds)) >= LIMIT, "full file table", alive=alive)
                broker.stop()
                # Every reconnect needs a descriptor; asyncio's accept takes each one freed.
                said = "mqtt-connect: a system resource ran out (EMFILE"
                _until(lambda: said in log.read_text(), "a reconnect failing with EMFILE", alive=alive)
                broker.start()
                _publish(broker, registry, 50, seed=2)  # queued in the collector's persistent session
            healthy = lambda: (_get(http, "/healthz") or (0, ""))[0] == 200  # noqa: E731
            _until(healthy, "healthy collector once the connections are freed", alive=alive)
            counters = wait_committed(store, registry, 100, timeout=DEADLINE)
            answer = _get(http, "/metrics")
            assert answer is not None
            metrics = answer[1]
            assert collector.stop() == 0
        finally:
            collector.close()
    assert counters["reports"] == 100
    # One process from start to end, never restarted: it counted both halves itself.
    assert collector.starts == 1
    assert _metric(metrics, "ldp_collector_reports_folded_total") == 100
    assert _metric(metrics, "ldp_collector_broker_connected") == 1
    assert _metric(metrics, "ldp_collector_resource_errors_total", operation="mqtt-connect", errno="EMFILE") >= 1
    assert _metric(metrics, "ldp_collector_resource_errors_total", operation="http-accept", errno="EMFILE") >= 1
    text = log.read_text()
    assert text.count("mqtt-connect: a system resource ran out") == 1  # logged once for the whole run
    assert "mqtt-connect works again after" in text
    assert "mqtt.tls.ca_file" not in text
    assert "Traceback" not in text


def test_a_ca_file_that_cannot_be_read_at_start_ends_the_collector_with_the_config_status(
    tmp_path: Path, registry_path: Path
) -> None:
    """The same collector, its CA file missing at start: exit status 2 and the config-error message naming it."""
    extra, tls_port, ca = _tls_broker(tmp_path)
    ca.unlink()
    with running_broker(tmp_path / "broker", extra_config=extra) as broker:
        config = write_config(
            tmp_path, registry=registry_path, host=broker.host, port=tls_port, http_port=free_port(),
            extra=f'[mqtt.tls]\nca_file = "{ca}"\n',
        )  # fmt: skip
        assert PRLIMIT is not None
        log = tmp_path / "collector.log"
        collector = CollectorProcess(config, log=log, prefix=[PRLIMIT, f"--nofile={LIMIT}:{LIMIT}", "--"])
        try:
            collector.launch()
            assert collector.process is not None
            status = collector.process.wait(timeout=DEADLINE)
        finally:
            collector.close()
    assert status == ExitStatus.CONFIG
    assert f"{config}: mqtt.tls.ca_file: cannot read {ca}: No such file or directory" in log.read_text()
