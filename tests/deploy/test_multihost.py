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
from tests.support.hosted import HostedBroker, HostedPostgres, wait_reachable
from tests.support.netns import Host, Network, network
from tests.support.postgres import find_postgres
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


def _start_broker(host: Host, work: Path) -> HostedBroker:
    broker = HostedBroker(host, work / "broker", port=BROKER_PORT)
    broker.start()
    return broker


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
    broker_proc: HostedBroker | None = None
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
            wait_reachable(members[0], hosts["broker"], BROKER_PORT)
            wait_reachable(members[0], hosts["db"], DB_PORT)
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
            broker_proc.kill9()
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
    wait_reachable(scene.publisher, scene.broker, BROKER_PORT)
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
