"""What ``ldp-agent status`` and ``ldp-agent ledger`` say about the brokers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.api import handle_request
from agent.brokers import broker_order, parse_address
from agent.config import load_config
from agent.daemon import broker_routes, load_registry, open_agent
from agent.status import AgentStatus
from agent.verbs import _print_status
from protocol.randomness import SeededRandom
from tests.agent.conftest import KEY, REGISTRY, START
from tests.support.clocks import FakeClock

ROOT = Path(__file__).resolve().parents[2]
ADDRESSES = ["broker-a.example:8883", "broker-b.example:8883", "[2001:db8::3]:8883"]


def _setup(tmp: Path) -> Path:
    (tmp / "usecases.toml").write_text(REGISTRY)
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"""
[broker]
addresses = {json.dumps(ADDRESSES)}
username = "dev-0001"
tls = false
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
"""
    )
    return cfg


def _cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _order() -> list[str]:
    return [str(a) for a in broker_order("dev-0001", [parse_address(a) for a in ADDRESSES])]


def test_the_daemon_publishes_through_every_broker_in_the_devices_order(tmp_path: Path) -> None:
    cfg = load_config(_setup(tmp_path))
    routes = broker_routes(cfg, SeededRandom(1))
    assert [r.broker for r in routes] == _order()
    assert sorted(r.broker for r in routes) == sorted(ADDRESSES)


def test_status_without_a_daemon_lists_the_brokers_primary_first(tmp_path: Path) -> None:
    cfg = _setup(tmp_path)
    done = _cli(cfg, "status", "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["brokers"] == _order()
    assert status["broker_in_use"] is None
    done = _cli(cfg, "status")
    assert done.returncode == 0, done.stderr
    first, *rest = _order()
    assert f"brokers:     {first} (primary), {', '.join(rest)}; no connection open" in done.stdout


def test_status_from_the_daemon_names_the_broker_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(_setup(tmp_path))
    agent = open_agent(cfg, load_registry(cfg), clock=FakeClock(START), rng=SeededRandom(1))
    order = tuple(_order())
    reply = handle_request(agent, {"op": "status"}, brokers=lambda: (order, order[1]))
    assert reply["ok"] is True
    status = AgentStatus.from_json(reply["status"])
    assert (status.brokers, status.broker_in_use) == (order, order[1])
    _print_status(status)
    assert f"brokers:     {order[0]} (primary), {order[1]} (in use), {order[2]}\n" in capsys.readouterr().out
    # The core alone knows no brokers: its JSON has neither key (as an older agent's).
    plain = agent.status().to_json()
    assert "brokers" not in plain
    assert "broker_in_use" not in plain
    assert AgentStatus.from_json(plain).brokers == ()


def test_the_ledger_shows_the_broker_of_each_report(tmp_path: Path) -> None:
    cfg_path = _setup(tmp_path)
    cfg = load_config(cfg_path)
    clock = FakeClock(START)
    agent = open_agent(cfg, load_registry(cfg), clock=clock, rng=SeededRandom(1))
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(START + 86_400)
    agent.collect()
    waiting = agent.outbox()
    assert waiting
    agent.mark_sent(waiting, broker="broker-b.example:8883")
    del agent
    done = _cli(cfg_path, "ledger", "--json")
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert [e["broker"] for e in entries] == ["broker-b.example:8883"] * len(waiting)
    done = _cli(cfg_path, "ledger")
    assert done.returncode == 0, done.stderr
    assert "  sent via broker-b.example:8883\n" in done.stdout
