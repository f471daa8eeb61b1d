"""An agent whose open-file table is full is not stopped as if misconfigured: with its API socket
flooded and its broker restarted, its connections fail with EMFILE, are retried and logged once,
and once the table has room again it delivers what waited.

The agent runs as its own process under a low open-file limit (``prlimit``), on an accelerated
clock, against a real Mosquitto over TLS. Every wait polls with a deadline.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.agent.conftest import KEY, REGISTRY
from tests.collector.test_tls import _make_pki
from tests.support.broker import free_port, running_broker

ROOT = Path(__file__).resolve().parents[2]
PRLIMIT = shutil.which("prlimit")
LIMIT = 32
"""The agent's open-file limit: under 15 descriptors in use, so under 20 API connections (fewer
than the 32 it serves at once, agent/api.py) fill it."""
RATE = 4_320.0  # one 6-hour cycle every 5 s of real time
DEADLINE = 120.0

pytestmark = pytest.mark.skipif(PRLIMIT is None, reason="prlimit (util-linux) is not installed")


def _config(tmp: Path, port: int, ca: Path) -> Path:
    (tmp / "usecases.toml").write_text(REGISTRY)
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"""
[broker]
host = "127.0.0.1"
port = {port}
ca_file = "{ca}"
publish_timeout = 5.0
backoff_initial = 0.05
backoff_max = 0.5
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
[schedule]
jitter_seconds = 60.0
[[probes]]
kind = "uptime"
use_case = "seconds"
[log]
level = "warning"
"""
    )
    return cfg


class _Reports:
    """Counts what the broker forwards under ldp/v1/reports/# (a subscriber on its plain listener)."""

    def __init__(self, port: int) -> None:
        self.count = 0
        ready = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="flood-reports", clean_session=False)
        self.client.on_connect = lambda c, *a: c.subscribe("ldp/v1/reports/#", qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(DEADLINE)

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.count += 1

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class _Flood:
    """Holds connections to a Unix socket that send nothing; one the server closes is replaced."""

    def __init__(self, path: Path, *, held: int = 200) -> None:
        self.path = path
        self.held = held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="api-flood", daemon=True)

    def __enter__(self) -> _Flood:
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
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.setblocking(False)
                    s.connect_ex(str(self.path))
                    sockets.append(s)
                readable, _, _ = select.select(sockets, [], [], 0.05)
                for s in readable:  # answered "busy", closed or refused: replaced
                    sockets.remove(s)
                    s.close()
        finally:
            for s in sockets:
                s.close()


def _until(predicate: Callable[[], bool], what: str, *, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert alive(), f"the agent ended while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE:g} s"
        time.sleep(0.05)


def test_an_agent_out_of_files_retries_its_broker_and_delivers_once_it_has_room(tmp_path: Path) -> None:
    """API flooded to the limit, broker restarted: EMFILE retried and logged once, no config error; then delivered."""
    ca, cert, key = _make_pki(tmp_path / "pki")
    tls_port = free_port()
    extra = f"listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n"
    mine = tmp_path / "agent-ca.pem"
    shutil.copyfile(ca, mine)
    cfg = _config(tmp_path, tls_port, mine)
    now = time.time()
    launcher = [sys.executable, "-m", "tests.support.agent_launcher", f"--start={now}", f"--anchor={now}"]
    cmd = [*launcher, f"--rate={RATE}", "--", "--config", str(cfg)]
    subprocess.run([*cmd, "consent", "grant"], check=True, cwd=ROOT, capture_output=True, timeout=DEADLINE)
    log_path = tmp_path / "agent.log"
    assert PRLIMIT is not None
    with running_broker(tmp_path / "broker", extra_config=extra) as broker, log_path.open("wb") as log:
        reports = _Reports(broker.port)
        proc = subprocess.Popen(
            [PRLIMIT, f"--nofile={LIMIT}:{LIMIT}", "--", *cmd, "run"], cwd=ROOT, stdout=log, stderr=log
        )
        alive = lambda: proc.poll() is None  # noqa: E731
        try:
            _until(lambda: reports.count >= 1, "first report delivered", alive=alive)
            mine.unlink()  # a reconnect reads no file: the CA the agent connected with is gone
            fds = Path(f"/proc/{proc.pid}/fd")
            with _Flood(tmp_path / "agent.sock"):
                _until(lambda: len(os.listdir(fds)) >= LIMIT, "full file table", alive=alive)
                broker.stop()
                said = "publish: a system resource ran out (EMFILE"
                _until(lambda: said in log_path.read_text(), "a connection failing with EMFILE", alive=alive)
                before = reports.count
            broker.start()
            _until(lambda: reports.count > before, "a report delivered after the flood", alive=alive)
            proc.send_signal(signal.SIGTERM)
            status = proc.wait(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            reports.close()
    text = log_path.read_text()
    assert status == 0, text[-3000:]
    assert text.count("publish: a system resource ran out") == 1, text[-3000:]
    assert "broker.ca_file" not in text
    # The API's failed accepts: one line when the first failed, one at its close with the rest.
    assert 1 <= text.count("agent API: ") <= 2, text[-3000:]
    assert "Traceback" not in text
