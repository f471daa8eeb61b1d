"""The ``ldp-agent`` command: help, clear refusals, offline verbs, and the daemon under a fake systemd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cli
from agent.clock import FakeClock
from agent.config import load_config
from agent.daemon import load_registry, open_agent, run_daemon
from protocol.randomness import SeededRandom
from tests.agent.conftest import KEY, REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp: Path, *, registry: str = REGISTRY, extra: str = "") -> Path:
    (tmp / "usecases.toml").write_text(registry)
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"""
[broker]
host = "127.0.0.1"
port = 1
tls = false
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
{extra}
"""
    )
    return cfg


def _cli(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def test_help_explains_the_verbs() -> None:
    """--help names every verb, the opt-in and the exit codes."""
    out = subprocess.run(
        [sys.executable, "-m", "agent", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    for word in (
        "run",
        "record USE_CASE VALUE",
        "consent grant|revoke|show",
        "ledger",
        "status",
        "opt in",
        "exit status",
    ):
        assert word in out


def test_bad_config_names_file_and_field(tmp_path: Path) -> None:
    """A config mistake exits with status 2 and a message naming the file and the field."""
    cfg = _setup(tmp_path, extra="[schedule]\ninterval_hour = 6\n")
    r = _cli(cfg, "status")
    assert r.returncode == 2
    assert f"bad config {cfg}: schedule.interval_hour: unknown key" in r.stderr


def test_bad_registry_and_policy_refusal(tmp_path: Path) -> None:
    """An invalid registry and a registry over the local caps each stop the agent with their own message."""
    cfg = _setup(tmp_path, registry=REGISTRY.replace('period = "1d"', 'period = "2d"', 1))
    r = _cli(cfg, "run")
    assert r.returncode == 2
    assert "use case 'flag'" in r.stderr
    assert "field 'period'" in r.stderr
    cfg = _setup(tmp_path, registry=REGISTRY, extra="[policy]\nmax_epsilon_report = 2.0\n")
    r = _cli(cfg, "run")
    assert r.returncode == 2
    assert "use case 'words' refused by local policy: epsilon = 4 per report exceeds the local cap 2" in r.stderr


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    """A state key with a loose mode stops the agent and says how to fix it."""
    cfg = _setup(tmp_path)
    (tmp_path / "state.key").chmod(0o644)
    r = _cli(cfg, "consent", "grant")
    assert r.returncode == 6
    assert "chmod 600" in r.stderr


def test_offline_verbs(tmp_path: Path) -> None:
    """Without a daemon: consent, record (good and bad values), status, ledger and revoke work on the state."""
    cfg = _setup(tmp_path)
    r = _cli(cfg, "record", "flag", "1")
    assert r.returncode == 4
    assert "not opted in" in r.stderr
    assert _cli(cfg, "consent", "show").stdout.strip() == "consent: not granted"
    assert _cli(cfg, "consent", "grant").returncode == 0
    assert _cli(cfg, "record", "flag", "true").returncode == 0
    assert _cli(cfg, "record", "seconds", "120", "--key", "editor").returncode == 0
    r = _cli(cfg, "record", "seconds", "lots")
    assert r.returncode == 3
    assert "use case 'seconds' (one-bit-mean) counts numbers; got 'lots'" in r.stderr
    r = _cli(cfg, "record", "seconds", "99999")
    assert r.returncode == 3
    assert "[0, 21600]" in r.stderr
    status = json.loads(_cli(cfg, "status", "--json").stdout)
    assert status["consent"] is True
    rows = {row["use_case"]: row for row in status["use_cases"]}
    assert rows["seconds"]["open_counters"] == 1
    assert rows["flag"]["pending_records"] == 1
    assert _cli(cfg, "ledger").stdout.strip() == "nothing has left this device"
    r = _cli(cfg, "consent", "revoke")
    assert r.returncode == 0
    assert "state files deleted" in r.stdout
    assert list((tmp_path / "state").glob("*.sealed")) == []


def _receive(sock: socket.socket, wanted: str, deadline: float) -> list[str]:
    got: list[str] = []
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096).decode()
        except TimeoutError:
            continue
        got.extend(data.split("\n"))
        if wanted in got:
            return got
    raise AssertionError(f"never received {wanted}; got {got}")


def test_daemon_under_systemd_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """READY=1 and WATCHDOG=1 reach $NOTIFY_SOCKET, the socket API serves, SIGTERM exits 0 with STOPPING=1."""
    cfg = _setup(tmp_path)
    notify_path = tmp_path / "notify"
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="200000")
    env.pop("LDP_AGENT_TEST_CLOCK", None)
    assert _cli(cfg, "consent", "grant").returncode == 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.settimeout(0.2)
        log = (tmp_path / "agent.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "--config", str(cfg), "run"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 120  # a hang guard only
            _receive(notify, "READY=1", deadline)
            _receive(notify, "WATCHDOG=1", deadline)
            no_notify = {k: v for k, v in env.items() if k != "NOTIFY_SOCKET"}
            assert _cli(cfg, "record", "words", "hello", env=no_notify).returncode == 0
            r = _cli(cfg, "record", "flag", "maybe", env=no_notify)
            assert r.returncode == 3
            assert "(rr) takes 0/1 or true/false" in r.stderr
            status = json.loads(_cli(cfg, "status", "--json", env=no_notify).stdout)
            assert status["pid"] == proc.pid  # answered by the daemon, over the socket
            assert status["next_cycle"] is not None
            assert 0 <= status["next_cycle"] % 21_600 < 1_800
            proc.send_signal(signal.SIGTERM)
            _receive(notify, "STOPPING=1", deadline)
            assert proc.wait(timeout=30) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            log.close()
    assert not (tmp_path / "agent.sock").exists()


class _Boom:
    """A transport with a bug: connecting raises something unexpected."""

    def connect(self) -> contextlib.AbstractAsyncContextManager[object]:
        raise RuntimeError("a bug in the transport")


def test_an_unexpected_failure_ends_the_daemon_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception in a task stops every task and propagates; the CLI exits with status 1."""
    cfg = load_config(_setup(tmp_path))
    clock = FakeClock(1_700_000_000.0)
    agent = open_agent(cfg, load_registry(cfg), clock=clock, rng=SeededRandom(1))
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + 86_400.0)
    agent.collect()  # a report waits, so the publisher connects at start
    with pytest.raises(ExceptionGroup) as info:
        asyncio.run(asyncio.wait_for(run_daemon(cfg, clock=clock, transport=_Boom()), timeout=60))  # type: ignore[arg-type]
    assert info.group_contains(RuntimeError, match="a bug in the transport")

    async def failing(*args: object, **kwargs: object) -> None:
        raise ExceptionGroup("tasks failed", [RuntimeError("boom")])

    monkeypatch.setattr("agent.daemon.run_daemon", failing)
    assert cli.main(["--config", str(tmp_path / "agent.toml"), "run"]) == 1
