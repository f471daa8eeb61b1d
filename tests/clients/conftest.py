"""Fixtures of the client tests: a real agent daemon on a short socket path, and a fake agent that
answers whatever a test scripts (the malformed and oversized replies no real agent sends)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.verbs import call

ROOT = Path(__file__).resolve().parents[2]
FLEET_REGISTRY = ROOT / "deploy" / "fleet.usecases.toml"
"""Every kind of value: a flag (rr), counters (one-bit-mean, dbitflip), strings (cms, hcms), categories (rappor)."""
KEY = bytes(range(32))
START_TIMEOUT = 120.0
"""A hang guard for the daemon's start (it answers in a second or two)."""


@dataclass
class RunningAgent:
    """An ``ldp-agent run`` process and what it was started with."""

    directory: Path
    config: Path
    socket: Path
    process: subprocess.Popen[bytes]

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``ldp-agent --config CONFIG ARGS`` (it talks to the daemon over the socket)."""
        return subprocess.run(
            [sys.executable, "-m", "agent", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
            check=False,
        )


def write_config(directory: Path, registry: str) -> Path:
    """An agent config in ``directory`` (broker unreachable: these tests only record) with ``registry``."""
    (directory / "usecases.toml").write_text(registry, encoding="utf-8")
    key = directory / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    config = directory / "agent.toml"
    config.write_text(
        '[broker]\nhost = "127.0.0.1"\nport = 1\ntls = false\n[registry]\npath = "usecases.toml"\n'
        '[state]\ndirectory = "state"\nkey_file = "state.key"\n[api]\nsocket = "agent.sock"\n',
        encoding="utf-8",
    )
    return config


@contextlib.contextmanager
def agent_daemon(registry: str, *, start: float | None = None, consent: bool = True) -> Iterator[RunningAgent]:
    """Run a daemon with ``registry`` until the block ends; ``start``: its clock's time now (the tests'
    launcher; default the real clock). The directory is short, so the socket path fits ``sun_path``."""
    directory = Path(tempfile.mkdtemp(prefix="ldp-client-"))
    config = write_config(directory, registry)
    launcher = [sys.executable, "-m", "agent"]
    if start is not None:
        launcher = [sys.executable, "-m", "tests.support.agent_launcher", "--rate=1", f"--start={start}", "--"]
    log = (directory / "agent.log").open("wb")
    process = None
    try:
        if consent:
            grant = [*launcher, "--config", str(config), "consent", "grant"]
            granted = subprocess.run(grant, cwd=ROOT, capture_output=True, timeout=120, check=False)
            assert granted.returncode == 0, granted.stderr
        process = subprocess.Popen([*launcher, "--config", str(config), "run"], cwd=ROOT, stdout=log, stderr=log)
        running = RunningAgent(directory, config, directory / "agent.sock", process)
        _wait_until_it_answers(running)
        yield running
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_it_answers(agent: RunningAgent) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if agent.process.poll() is not None:
            raise AssertionError(f"the agent ended with {agent.process.returncode}: {_log(agent)}")
        with contextlib.suppress(OSError, ValueError):
            status = call(agent.socket, {"op": "status"}, timeout=10).get("status")
            if isinstance(status, dict) and status.get("pid") == agent.process.pid:
                return
        time.sleep(0.05)  # polling the socket for the daemon's first answer, with a deadline
    raise AssertionError(f"the agent did not answer within {START_TIMEOUT:g} s: {_log(agent)}")


def _log(agent: RunningAgent) -> str:
    return (agent.directory / "agent.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def running_agent() -> Iterator[RunningAgent]:
    """A real agent daemon with deploy/fleet.usecases.toml, consent granted."""
    with agent_daemon(FLEET_REGISTRY.read_text(encoding="utf-8")) as agent:
        yield agent


@contextlib.contextmanager
def held_connections(path: Path, count: int = 32) -> Iterator[None]:
    """``count`` connections that send nothing, holding the agent's request slots (agent.api:
    MAX_CONNECTIONS) until the block ends, so that the next request is answered ``busy``."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            held.append(sock)
        yield
    finally:
        for sock in held:
            sock.close()


def wait_until_busy(path: Path, probe: Callable[[], bool], *, timeout: float = 8.0) -> None:
    """Poll ``probe`` (True once the agent answered busy) until it is, within ``timeout`` seconds:
    the held connections must all be accepted before a request meets a full agent (and they hold
    their slots for the agent's 10-second request timeout only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
    raise AssertionError(f"the agent on {path} never answered busy")


class FakeAgent:
    """A Unix socket that reads a request line per connection and answers the next scripted bytes.

    ``replies`` are sent in turn (the last one again once they run out); ``None`` closes the
    connection without a word. The requests it read are kept in ``requests``.
    """

    def __init__(self, path: Path, replies: Sequence[bytes | None]) -> None:
        self.path = path
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(8)
        self._thread = threading.Thread(target=self._serve, name="fake-agent", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65_536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
                if reply is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(reply)

    def close(self) -> None:
        """Stop accepting and remove the socket."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone would not)
        self._server.close()
        self._thread.join(timeout=30)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@pytest.fixture
def fake_agent() -> Iterator[Callable[[Sequence[bytes | None]], FakeAgent]]:
    """Make fake agents on short socket paths; each is closed after the test."""
    directory = Path(tempfile.mkdtemp(prefix="ldp-fake-"))
    made: list[FakeAgent] = []

    def make(replies: Sequence[bytes | None]) -> FakeAgent:
        fake = FakeAgent(directory / f"fake{len(made)}.sock", replies)
        made.append(fake)
        return fake

    try:
        yield make
    finally:
        for fake in made:
            fake.close()
        shutil.rmtree(directory, ignore_errors=True)
