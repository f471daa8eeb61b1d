"""Nothing blocks the event loop and nothing outlives the collector: the watchdog honours
WATCHDOG_USEC, a SIGKILLed collector leaves no process of its own, and every resource of the
service is closed whichever close fails. (The notifier itself, shared with the agent, is tested
in tests/runtime/test_sd_notify.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_config
from collector.ingest import StoreThread
from collector.live import LiveAggregates
from collector.service import run_service
from runtime.sd_notify import Notifier
from tests.collector.processes import ROOT, CollectorProcess, write_config
from tests.collector.support import run_async
from tests.support.broker import Broker, free_port


def _unread_socket() -> tuple[socket.socket, str]:
    """A bound datagram socket nobody reads, and its NOTIFY_SOCKET spelling."""
    name = f"ldp-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    return sock, "@" + name


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _poll(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_a_notify_socket_nobody_reads_does_not_freeze_the_collector(
    tmp_path: Path, mosquitto: Broker, registry_path: Path
) -> None:
    """Pinging every 10 ms into a socket nobody drains after READY, the collector answers HTTP and stops on SIGTERM."""
    http_port = free_port()
    config = write_config(
        tmp_path / "c", registry=registry_path, host=mosquitto.host, port=mosquitto.port, http_port=http_port
    )
    sock, address = _unread_socket()
    env = dict(os.environ, NOTIFY_SOCKET=address, WATCHDOG_USEC="20000", PYTHONPATH=str(ROOT))
    with (tmp_path / "collector.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "--config", str(config), "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        sock.settimeout(0.5)
        deadline = time.monotonic() + 60
        while True:  # read until READY=1, then never again (a supervisor that stopped reading)
            assert time.monotonic() < deadline, "no READY=1"
            assert proc.poll() is None, f"the collector exited with {proc.returncode}"
            try:
                if b"READY=1" in sock.recv(4096).split(b"\n"):
                    break
            except TimeoutError:
                continue

        def dropped() -> bool:
            status, body = _get(http_port, "/metrics")
            line = next(x for x in body.decode().splitlines() if x.startswith("ldp_collector_sd_notify_dropped_total"))
            return status == 200 and float(line.split()[1]) > 0

        _poll(dropped, 60.0, "no notification was ever dropped")
        assert _get(http_port, "/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        sock.close()


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sigkilled_collector_leaves_no_process_behind(tmp_path: Path, mosquitto: Broker, registry_path: Path) -> None:
    """kill -9 of the collector, after it served estimates, leaves no process of its own running."""
    http_port = free_port()
    config = write_config(
        tmp_path / "c",
        registry=registry_path,
        host=mosquitto.host,
        port=mosquitto.port,
        http_port=http_port,
        extra="[estimation]\nworkers = 2\n",
    )
    proc = CollectorProcess(config, log=tmp_path / "collector.log")
    try:
        proc.start()
        pid = proc.pid
        for name in ("flag", "usage", "emoji"):
            assert _get(http_port, f"/api/v1/use-cases/{name}/estimate", timeout=60.0)[0] in (200, 404)
        # Estimates run in threads of the collector (collector.live), so normally there is no
        # child at all; whatever there is must not survive the collector.
        workers = _descendants(pid)
        proc.kill9()
        _poll(lambda: not any(_alive(w) for w in workers), 20.0, f"left running: {[w for w in workers if _alive(w)]}")
    finally:
        proc.close()


@pytest.mark.parametrize("failing", ["live", "store", "notifier"])
@run_async
async def test_every_resource_is_closed_when_one_close_raises(
    failing: str, tmp_path: Path, mosquitto: Broker, registry_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever close raises, the others still close, last opened first, and the error reaches the caller."""
    closed: list[str] = []
    classes: tuple[tuple[str, Any], ...] = (("live", LiveAggregates), ("store", StoreThread), ("notifier", Notifier))
    for name, cls in classes:
        original: Callable[[object], None] = cls.close

        def close(self: object, name: str = name, original: Callable[[object], None] = original) -> None:
            original(self)
            closed.append(name)
            if name == failing:
                raise RuntimeError(f"{name} would not close")

        monkeypatch.setattr(cls, "close", close)
    config = load_config(write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port))
    stop = asyncio.Event()
    with pytest.raises(RuntimeError, match=f"{failing} would not close"):
        await run_service(config, stop=stop, on_ready=lambda _: stop.set())
    assert closed == ["live", "store", "notifier"]
