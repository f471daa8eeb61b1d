"""A collector group across hosts: broker, PostgreSQL, three collectors and a publisher, each on its own host.

Every part runs in a network namespace of its own (``tests/support/netns.py``: veth pairs to
a bridge, addresses only inside the namespaces, all removed afterwards), so the parts reach
each other only over the network, at their hosts' addresses - the broker at
``<broker>:1883``, PostgreSQL at ``<db>:5432`` - as on separate machines: nothing goes over a
shared loopback, and the collectors share no file (each host's config and log are its own;
PostgreSQL's Unix socket serves only its own set-up). The publisher sends genuinely
privatized reports (``benchmarks.load``'s batch builders); then one member's host is asked
for the report count and another's for the estimates (any member serves estimates from the
shared store), and they are checked against the truth: the count exactly, each estimate
within 5 analytic standard errors.

CI runs as root; a machine that cannot make namespaces fails this test with the reason.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.load import build_counters, build_flags
from protocol.registry import Registry
from tests.collector.processes import ROOT, CollectorProcess, write_config
from tests.collector.support import current_period, load_registry, write_registry
from tests.support.broker import find_mosquitto
from tests.support.netns import Host, Network, network
from tests.support.postgres import PostgresServer, find_postgres
from tests.support.publish import write_stream

pytestmark = pytest.mark.multihost

MEMBERS = 3
FLAGS = 20_000
FLAG_SHARE = 0.3
USAGE = 10_000
# One counter per device: the analytic SE assumes independent records, and one device's
# several 1BitMean answers share its α and memo bits (000 §3.1), so with 20 a report the
# spread across seeds is about three times the stated SE.
USAGE_RECORDS = 1
USAGE_MEAN_S = 1_800.0
BROKER_PORT = 1883
DB_PORT = 5432
GUARD_S = 600.0  # a hang guard for each wait, not a speed requirement


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _wait_reachable(client: Host, server: Host, port: int) -> None:
    """Wait until ``client`` can open a TCP connection to ``server:port`` (over the test network)."""
    code = (
        "import socket, sys, time\n"
        "deadline = time.monotonic() + float(sys.argv[3])\n"
        "while True:\n"
        "    try:\n"
        "        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
        "        break\n"
        "    except OSError:\n"
        "        if time.monotonic() > deadline:\n"
        "            sys.exit(f'{sys.argv[1]}:{sys.argv[2]} unreachable')\n"
        "        time.sleep(0.1)\n"
    )
    done = client.run(
        [sys.executable, "-c", code, server.address, str(port), str(GUARD_S)],
        capture_output=True,
        text=True,
        timeout=GUARD_S + 60,
    )
    assert done.returncode == 0, f"{client.name} cannot reach {server.name}: {done.stderr}"


@dataclass
class HostedPostgres(PostgresServer):
    """A throwaway PostgreSQL whose server runs on ``host`` and listens at its address only."""

    host: Host | None = None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.host is not None
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._owner is not None:
            cmd = ["runuser", "-u", self._owner, "--", *cmd]
        return subprocess.run(self.host.command(cmd), check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        """``initdb``, then listen on the host's address and trust the test network's /24."""
        assert self.host is not None
        super().init()
        subnet = self.host.address.rsplit(".", 1)[0] + ".0/24"
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(f"listen_addresses = '{self.host.address}'\n")  # the later line wins
        with (self.data / "pg_hba.conf").open("a") as f:
            f.write(f"host all all {subnet} trust\n")

    def start(self, timeout: float = 120.0) -> None:
        """Start the server on its host; ``pg_ctl -w`` waits until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", str(int(timeout)), "start")

    @property
    def url(self) -> str:
        """The URL the collectors use: the database host's address, over the network."""
        assert self.host is not None
        return f"postgresql://{self.user}@{self.host.address}:{self.port}/{self.database}"


@dataclass
class Scene:
    """The hosts and what runs on them."""

    net: Network
    work: Path
    broker: Host
    db: Host
    publisher: Host
    members: list[Host]
    configs: list[Path]


def _start_broker(host: Host, work: Path) -> subprocess.Popen[bytes]:
    binary = find_mosquitto()
    assert binary is not None, "mosquitto is not installed; ./deploy/test.sh installs it"
    directory = work / "broker"
    directory.mkdir()
    config = directory / "mosquitto.conf"
    config.write_text(
        f"listener {BROKER_PORT} {host.address}\n"
        "allow_anonymous true\n"
        f"persistence true\npersistence_location {directory}/\n"
        f"log_dest file {directory}/mosquitto.log\nlog_type error\nlog_type warning\n"
        "max_queued_messages 0\nmax_inflight_messages 0\n"
        "user root\n",
        encoding="utf-8",
    )
    return host.popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    """The collector tests' small registry (one use case per mechanism), with its dictionaries."""
    return write_registry(tmp_path / "registry")


@pytest.fixture
def registry(registry_path: Path) -> Registry:
    """That registry, parsed."""
    return load_registry(registry_path)


@pytest.fixture
def scene(registry_path: Path) -> Iterator[Scene]:
    """Broker, PostgreSQL and three collector hosts, plus a publisher host, all running."""
    bindir = find_postgres()
    assert bindir is not None, "PostgreSQL is not installed: apt-get install postgresql (deploy/test.sh does)"
    names = ["broker", "db", "publisher", *(f"collector-{i}" for i in range(MEMBERS))]
    # A short path: the members' notify sockets live here (a Unix socket path has 108 bytes).
    work = Path(tempfile.mkdtemp(prefix="ldp-mh-"))
    processes: list[CollectorProcess] = []
    broker_proc: subprocess.Popen[bytes] | None = None
    postgres: HostedPostgres | None = None
    try:
        with network(*names) as net:
            hosts = net.hosts
            broker_proc = _start_broker(hosts["broker"], work)
            postgres = HostedPostgres(directory=work / "postgres", port=DB_PORT, bindir=bindir, host=hosts["db"])
            postgres.init()
            postgres.start()
            postgres.create_database()
            members = [hosts[f"collector-{i}"] for i in range(MEMBERS)]
            _wait_reachable(members[0], hosts["broker"], BROKER_PORT)
            _wait_reachable(members[0], hosts["db"], DB_PORT)
            configs = []
            for i, member in enumerate(members):
                config = write_config(
                    work / member.name,
                    registry=registry_path,
                    host=hosts["broker"].address,
                    port=BROKER_PORT,
                    client_id=f"ldp-collector-{i}",
                    store=postgres.url,
                    instance=member.name,
                    shared_group="collectors",
                )
                configs.append(config)
                processes.append(
                    CollectorProcess(
                        config,
                        log=work / member.name / "collector.log",
                        prefix=member.command([]),
                        notify_path=work / f"n{i}",
                    )
                )
            for process in processes:
                process.launch()
            for process in processes:
                process.wait_ready()
            yield Scene(net, work, hosts["broker"], hosts["db"], hosts["publisher"], members, configs)
            for process in processes:
                assert process.stop() == 0
    finally:
        for process in processes:
            process.close()
        if postgres is not None:
            postgres.stop(mode="immediate")
        if broker_proc is not None:
            broker_proc.kill()
            broker_proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def _cli(host: Host, config: Path, *args: str) -> dict[str, Any]:
    """``ldp-collector --config CONFIG ARGS --json`` on ``host``; its JSON."""
    done = host.run(
        [sys.executable, "-m", "collector", "--config", str(config), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        cwd=ROOT,
        env=_env(),
    )
    assert done.returncode == 0, f"{' '.join(args)} on {host.name}: {done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _reports(status: dict[str, Any], use_case: str) -> int:
    return sum(p["reports"] for p in status["use_cases"][use_case]["periods"])


def _within(estimate: dict[str, Any], truth: float, what: str) -> None:
    value, se = estimate["value"], estimate["standard_error"]
    assert se > 0, estimate
    assert abs(value - truth) <= 5 * se, f"{what}: {value} ± {se} (SE) is more than 5 SE from the truth {truth}"


def test_a_group_across_hosts_counts_every_report_and_estimates_the_truth(
    scene: Scene, registry: Registry, registry_path: Path
) -> None:
    """Publisher, broker, database and three collectors on six hosts: exact count, estimates within 5 SE."""
    items = build_flags(
        registry, FLAGS, seed=31, use_case="flag", share=FLAG_SHARE, period=current_period(registry, "flag")
    ) + build_counters(
        registry,
        USAGE,
        seed=32,
        records=USAGE_RECORDS,
        use_case="usage",
        mean_s=USAGE_MEAN_S,
        period=current_period(registry, "usage"),
    )
    stream = scene.work / "stream.msgpack"
    write_stream(stream, items)
    _wait_reachable(scene.publisher, scene.broker, BROKER_PORT)
    published = scene.publisher.run(
        [
            sys.executable,
            "-m",
            "tests.support.publish",
            "--broker",
            f"{scene.broker.address}:{BROKER_PORT}",
            str(stream),
        ],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        cwd=ROOT,
        env=_env(),
    )
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["published"] == len(items)

    # The count, asked of the first member's host until every report is committed (counts, not time).
    deadline = time.monotonic() + GUARD_S
    while True:
        status = _cli(scene.members[0], scene.configs[0], "status")
        if status["counters"].get("reports", 0) >= len(items) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status["counters"]["reports"] == len(items), status["counters"]
    assert _reports(status, "flag") == FLAGS
    assert _reports(status, "usage") == USAGE
    members = {name: counters.get("reports", 0) for name, counters in status["instances"].items()}
    assert sorted(members) == [m.name for m in scene.members], members
    assert all(n > 0 for n in members.values()), f"a member folded nothing: {members}"

    # The estimates, asked of another member's host.
    flag = _cli(scene.members[1], scene.configs[1], "estimate", "flag")
    assert flag["reports"] == FLAGS, flag
    assert flag["released"], flag
    _within(flag["estimate"], FLAG_SHARE, "flag share")
    usage = _cli(scene.members[2], scene.configs[2], "estimate", "usage")
    assert usage["reports"] == USAGE, usage
    assert usage["records"] == USAGE * USAGE_RECORDS, usage
    # Values are whole seconds of Exponential(1,800 s) clipped at m = 3,600: E = θ(1 - e^(-m/θ)),
    # less the truncation's 0.5 s on average (negligible next to an SE of tens of seconds).
    m = registry.use_cases["usage"].mechanism.m  # type: ignore[attr-defined]
    truth = USAGE_MEAN_S * (1 - math.exp(-m / USAGE_MEAN_S)) - 0.5
    _within(usage["estimate"], truth, "usage mean")
    print(f"members' shares {members}; flag {flag['estimate']}; usage {usage['estimate']}")
