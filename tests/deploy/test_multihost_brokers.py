"""Two brokers on hosts of their own, each killed with -9 in turn while agents publish with receipts.

Eight hosts in network namespaces (``tests/support/netns.py``): two Mosquittos, PostgreSQL,
three collectors and one devices host. Every collector is configured with both brokers
(``[mqtt] addresses``, docs/deploy.md "Several brokers"), in the shared group on each, on the
one PostgreSQL store. The devices host runs ``tests/support/receipt_agents.py``: 60 agents,
each with its own state directory and broker user name, published as the daemon does (one
route per broker in the device's rendezvous order, waiting for commit receipts), living
through 12 six-hour collection cycles on a shifted clock.

Mid-stream broker A is killed with ``kill -9``; after it is back (started again, every
collector connected to it), broker B is killed. Publishing goes on throughout. At the end
every report in every agent's ledger is counted exactly once in the store (the store's report
count equals the number of distinct report ids the agents recorded, and nothing was
refused), every outbox is empty, every ledger entry says "counted", and both brokers carried
reports. The time from each kill to the last receipt of the reports waiting at that moment is
printed (a figure for docs/deploy.md, never asserted: the only limits below are hang guards).

CI runs as root; a machine that cannot make namespaces fails this test with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.collector.processes import ROOT, CollectorProcess
from tests.collector.support import write_registry
from tests.support.hosted import HostedBroker, HostedPostgres, wait_reachable
from tests.support.netns import Host, network
from tests.support.postgres import find_postgres

pytestmark = pytest.mark.multihost

MEMBERS = 3
AGENTS = 60
DB_PORT = 5432
HTTP_PORT = 8650
DAY = 86_400.0
GUARD_S = 300.0  # a hang guard for each wait, not a speed requirement
# The agents' clock starts at 01:00 four days ago, so their twelve 6-hour cycles close 12
# periods of ``usage`` and 3 days of ``hist`` per agent, all within the collectors' accepted
# window (the default 28 periods back).
CYCLES = (3, 3, 2, 2, 2)
EXPECTED = AGENTS * (sum(CYCLES) + 3)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _write_config(directory: Path, *, registry: Path, brokers: list[HostedBroker], store: str, instance: str) -> Path:
    """A member's config: both brokers, the shared group, the one PostgreSQL store, HTTP on its own loopback."""
    directory.mkdir(parents=True, exist_ok=True)
    addresses = ", ".join(f'"{b.address}"' for b in brokers)
    path = directory / "collector.toml"
    path.write_text(
        f"""registry = "{registry}"
instance = "{instance}"

[mqtt]
addresses = [{addresses}]
client_id = "ldp-{instance}"
shared_group = "collectors"
keepalive_s = 10
reconnect_min_s = 0.05
reconnect_max_s = 0.5

[ingest]
commit_interval_s = 0.05

[store]
url = "{store}"

[http]
port = {HTTP_PORT}
""",
        encoding="utf-8",
    )
    return path


@dataclass
class Scene:
    """The hosts and what runs on them."""

    work: Path
    registry: Path
    brokers: list[HostedBroker]
    devices: Host
    members: list[Host]
    configs: list[Path]


@pytest.fixture
def scene() -> Iterator[Scene]:
    """Two brokers, PostgreSQL and three collectors on hosts of their own, plus a devices host, all running."""
    bindir = find_postgres()
    assert bindir is not None, "PostgreSQL is not installed: apt-get install postgresql (deploy/test.sh does)"
    names = ["broker-a", "broker-b", "db", "devices", *(f"collector-{i}" for i in range(MEMBERS))]
    # A short path: the members' notify sockets live here (a Unix socket path has 108 bytes).
    work = Path(tempfile.mkdtemp(prefix="ldp-mb-"))
    registry = write_registry(work / "registry")
    processes: list[CollectorProcess] = []
    brokers: list[HostedBroker] = []
    postgres: HostedPostgres | None = None
    try:
        with network(*names) as net:
            hosts = net.hosts
            # No broker store: a kill -9 then forgets every session and queue, the hardest case.
            brokers = [HostedBroker(hosts[n], work / n, persistence=False) for n in ("broker-a", "broker-b")]
            for broker in brokers:
                broker.start()
            postgres = HostedPostgres(directory=work / "postgres", port=DB_PORT, bindir=bindir, host=hosts["db"])
            postgres.init()
            postgres.start()
            postgres.create_database()
            members = [hosts[f"collector-{i}"] for i in range(MEMBERS)]
            for broker in brokers:
                wait_reachable(members[0], broker.host, broker.port)
                wait_reachable(hosts["devices"], broker.host, broker.port)
            wait_reachable(members[0], hosts["db"], DB_PORT)
            configs = [
                _write_config(work / m.name, registry=registry, brokers=brokers, store=postgres.url, instance=m.name)
                for m in members
            ]
            processes = [
                CollectorProcess(c, log=c.parent / "collector.log", prefix=m.command([]), notify_path=work / f"n{i}")
                for i, (m, c) in enumerate(zip(members, configs, strict=True))
            ]
            for process in processes:
                process.launch()
            for process in processes:
                process.wait_ready()
            scene = Scene(work, registry, brokers, hosts["devices"], members, configs)
            for broker in brokers:
                _wait_members_connected(scene, broker)
            yield scene
            for process in processes:
                assert process.stop() == 0
    finally:
        for process in processes:
            process.close()
        if postgres is not None:
            postgres.stop(mode="immediate")
        for broker in brokers:
            broker.kill9()
        shutil.rmtree(work, ignore_errors=True)


def _status(host: Host, config: Path) -> dict[str, Any]:
    """``ldp-collector status --json`` on ``host`` (the store's counts and that member's brokers)."""
    done = host.run(
        [sys.executable, "-m", "collector", "--config", str(config), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        cwd=ROOT,
        env=_env(),
    )
    assert done.returncode == 0, f"status on {host.name}: {done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _wait_members_connected(scene: Scene, broker: HostedBroker) -> None:
    """Wait until every member holds its session on ``broker`` (each asked on its own host)."""
    deadline = time.monotonic() + GUARD_S
    for member, config in zip(scene.members, scene.configs, strict=True):
        while True:
            sessions = {b["address"]: b["connected"] for b in _status(member, config).get("brokers", [])}
            if sessions.get(broker.address):
                break
            assert time.monotonic() < deadline, f"{member.name} not connected to {broker.address}: {sessions}"
            time.sleep(0.2)


class Devices:
    """The agents' process on the devices host, driven one JSON line at a time."""

    def __init__(self, scene: Scene) -> None:
        start = time.time() - time.time() % DAY - 4 * DAY + 3_600.0
        argv = [sys.executable, "-m", "tests.support.receipt_agents", "--registry", str(scene.registry)]
        argv += ["--state", str(scene.work / "agents"), "--agents", str(AGENTS), "--start", str(start)]
        for broker in scene.brokers:
            argv += ["--broker", broker.address]
        self.log = (scene.work / "agents.log").open("wb")
        self.process = scene.devices.popen(
            argv, cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        assert self._read()["ready"] == AGENTS

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self.process.stdout
        assert out is not None
        line = out.readline()
        assert line, f"the agents' process ended (exit {self.process.poll()}; see {self.log.name})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **command: Any) -> dict[str, Any]:
        """Send one command; its answer."""
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        return self._read()

    def close(self) -> None:
        """Kill the process if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.log.close()


def _kill(devices: Devices, broker: HostedBroker, name: str) -> int:
    """``kill -9`` the broker and mark the reports waiting at that moment; how many there were."""
    broker.kill9()
    at = time.monotonic()
    waiting: int = devices.ask(cmd="mark", name=name, at=at)["waiting"]
    return waiting


def _scenario(scene: Scene, devices: Devices) -> dict[str, Any]:
    """Publish through both kills (module docstring); the agents' summary."""
    a, b = scene.brokers
    first, second, third, fourth, fifth = CYCLES
    staged = devices.ask(cmd="stage", cycles=first)["staged"]
    assert devices.ask(cmd="drain", timeout=GUARD_S)["drained"]
    # Mid-stream: the next cycles' reports are on their way through both brokers.
    staged += devices.ask(cmd="stage", cycles=second)["staged"]
    waiting_a = _kill(devices, a, "broker-a")
    staged += devices.ask(cmd="stage", cycles=third)["staged"]
    assert devices.ask(cmd="drain", timeout=GUARD_S)["drained"], "reports left after broker A's kill"
    a.start()
    _wait_members_connected(scene, a)
    staged += devices.ask(cmd="stage", cycles=fourth)["staged"]
    waiting_b = _kill(devices, b, "broker-b")
    staged += devices.ask(cmd="stage", cycles=fifth)["staged"]
    assert devices.ask(cmd="drain", timeout=GUARD_S)["drained"], "reports left after broker B's kill"
    b.start()
    summary = devices.ask(cmd="summary")
    assert staged == EXPECTED, f"staged {staged} reports, expected {EXPECTED}"
    assert waiting_a > 0, "nothing was waiting when broker A was killed"
    assert waiting_b > 0, "nothing was waiting when broker B was killed"
    return summary


def test_two_brokers_killed_in_turn_lose_and_duplicate_nothing(scene: Scene) -> None:
    """60 agents, two brokers each killed with -9 in turn: every recorded report counted exactly once."""
    devices = Devices(scene)
    try:
        summary = _scenario(scene, devices)
    finally:
        devices.close()
    entries = [e for agent in summary["agents"] for e in agent["entries"]]
    recorded = {report_id for report_id, _, _, _ in entries}
    assert len(entries) == len(recorded) == EXPECTED, "a report id twice in the ledgers, or one missing"
    assert recorded == set(summary["staged"])
    assert [agent["outbox"] for agent in summary["agents"]] == [0] * AGENTS
    assert Counter(status for _, _, status, _ in entries) == {"counted": EXPECTED}
    carried = Counter(broker for _, _, _, broker in entries)
    assert set(carried) == {b.address for b in scene.brokers}, carried
    # The fleet spreads over both brokers by the rendezvous hash of each identity.
    primaries = Counter(agent["order"][0] for agent in summary["agents"])
    assert set(primaries) == {b.address for b in scene.brokers}, primaries

    status = _status(scene.members[0], scene.configs[0])
    counters = status["counters"]
    assert counters["reports"] == EXPECTED, counters
    assert not {k: v for k, v in counters.items() if k.startswith("rejected:")}, counters
    by_use_case = Counter(use_case for _, use_case, _, _ in entries)
    for use_case, n in by_use_case.items():
        assert sum(p["reports"] for p in status["use_cases"][use_case]["periods"]) == n, use_case
    members = {name: c.get("reports", 0) for name, c in status["instances"].items()}
    assert sorted(members) == [m.name for m in scene.members], members
    assert all(n > 0 for n in members.values()), f"a member folded nothing: {members}"
    marks = {m["name"]: (m["waiting"], m["seconds"]) for m in summary["marks"]}
    assert all(seconds is not None for _, seconds in marks.values()), marks
    kills = "; ".join(
        f"kill -9 {name}: {w} reports waiting, last receipt {s:.2f} s later" for name, (w, s) in marks.items()
    )
    print(
        f"{EXPECTED} reports from {AGENTS} agents counted once ({counters.get('duplicates', 0)} duplicate deliveries); "
        f"carried by {dict(carried)}; primaries {dict(primaries)}; members' shares {members}; {kills}"
    )
