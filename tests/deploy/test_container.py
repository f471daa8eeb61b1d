"""The deploy path, executed: a booted Debian 12 with systemd runs ``deploy/install.sh`` for the
broker, the collector and the agent, and a value recorded on the agent comes out of
``ldp-collector estimate`` on the collector, through the TLS broker.

Everything runs as it would on a host: the test PKI and broker users are made with the
scripts in ``deploy/``, the package is installed into ``/opt/ldp-telemetry/.venv`` by the
install script, and the three services run under the units in ``deploy/`` (Mosquitto under
Debian's own unit, with ``deploy/mosquitto/``). Two things differ from production, and only
these: the registry is the example one with ``min_reports = 1`` for the two use cases the
test records, so one device's report can be released; and after the values are recorded, a
drop-in starts the agent through the tests' launcher (``tests/support/agent_launcher.py``,
copied into the container) on an accelerated clock set to the next UTC midnight, running
720 times faster, so the day the values were recorded in has ended and the next collection
cycle comes within a minute and sends their reports. Waiting for the real end of a period
would take up to a day. The installed agent itself has no switch that changes its clock.

Runs as root where systemd-nspawn, debootstrap and nsenter are installed (``deploy/test.sh``
installs them); elsewhere it is skipped with the reason. A machine that has them but cannot
build or boot the container fails the test with the step that went wrong.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path

import pytest

from tests.deploy.container import BootError, Container, missing_tools, rootfs, wheelhouse
from tests.deploy.secure_broker import DEPLOY, REPO

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(os.geteuid() != 0, reason="booting a container needs root (CI runs as root)"),
    pytest.mark.skipif(
        bool(missing_tools()),
        reason=f"{', '.join(missing_tools())} missing (Debian: apt-get install systemd-container debootstrap)",
    ),
]

# The use cases the test records, and the values: a randomized-response bit and an emoji of
# the CMS dictionary (so the collector must find its installed dictionary to estimate).
RECORDS = (("dark-mode-enabled", "true"), ("emoji", "😀"))
DEADLINE_S = 120.0
CLOCK_RATE = 720  # 6 h 30 min of agent time in 32.5 s
_OLD_SWITCH = "LDP_AGENT_TEST_CLOCK"  # the environment switch the agent once had


def _registry(dest: Path) -> Path:
    """The example registry with min_reports = 1 for the recorded use cases."""
    text = (DEPLOY / "usecases.example.toml").read_text(encoding="utf-8")
    for use_case, _ in RECORDS:
        section = re.escape(f"[use_cases.{use_case}.collector]")
        text, n = re.subn(rf"({section}\nmin_reports = )[0-9_]+", r"\g<1>1", text)
        assert n == 1, f"deploy/usecases.example.toml: no min_reports under [use_cases.{use_case}.collector]"
    dest.write_text(text, encoding="utf-8")
    return dest


def _source(dest: Path) -> Path:
    """The checkout as it is (uncommitted changes included), without its virtualenv and caches."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"
        ),
    )
    return dest


class Session:
    """Runs steps in the container and keeps a transcript for the failure message."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.transcript: list[str] = []

    def sh(self, script: str, *, ok: bool = True, timeout: float = 300.0) -> str:
        done = self.container.run(script, timeout=timeout)
        self.transcript.append(f"$ {script}\n[{done.returncode}] {done.stdout}{done.stderr}")
        if ok and done.returncode != 0:
            output = f"{done.stdout}{done.stderr}"
            pytest.fail(f"in the container, exit {done.returncode}: {script}\n{output}\n{self.logs()}")
        return done.stdout

    def logs(self) -> str:
        done = self.container.run(
            "journalctl --no-pager -o cat -n 60 -u mosquitto -u ldp-collector -u ldp-agent", timeout=60
        )
        return f"--- journal ---\n{done.stdout}{done.stderr}"


def test_deployed_agent_reports_to_deployed_collector(tmp_path: Path) -> None:
    """install.sh broker/collector/agent in a booted container; a recorded value reaches an estimate."""
    log = tmp_path / "build.log"
    try:
        root = rootfs(log)
        wheels = wheelhouse(REPO / "pyproject.toml", log)
    except BootError as e:
        pytest.fail(f"cannot prepare the container: {e}")
    share = tmp_path / "share"
    share.mkdir()
    _registry(share / "usecases.toml")
    src = _source(tmp_path / "src")
    binds = [(src, "/src", False), (wheels, "/wheels", True), (share, "/share", False)]
    name = f"ldp-deploy-{secrets.token_hex(3)}"
    container = Container(root, name, tmp_path / "console.log", binds)
    try:
        container.boot()
    except BootError as e:
        container.halt()
        pytest.fail(f"the container did not boot: {e}")
    try:
        s = Session(container)
        version = s.sh("systemctl --version | head -n 1")
        assert int(version.split()[1]) >= 250, version

        # 1-2. Certificates and broker users, as docs/deploy.md makes them.
        s.sh("/src/deploy/make-test-ca.sh /root/ldp-pki >/dev/null")
        s.sh("/src/deploy/make-broker-users.sh /root/ldp-pki/passwd /root/ldp-secrets >/dev/null")
        # 3-5. The three roles on one host (a broker host name of localhost, as the CA names it).
        common = "--registry /share/usecases.toml --dictionaries /src/deploy --wheels /wheels"
        s.sh("/src/deploy/install.sh broker")
        s.sh(f"/src/deploy/install.sh {common} collector")
        s.sh(f"/src/deploy/install.sh {common} agent")
        for unit in ("mosquitto", "ldp-collector", "ldp-agent"):
            s.sh(f"systemctl is-active --quiet {unit}")

        # What the units expect, as installed.
        modes = s.sh(
            "stat -c '%n %a %U:%G' /etc/ldp-collector /etc/ldp-collector/collector.toml"
            " /etc/ldp-collector/usecases.toml /etc/ldp-collector/dictionaries/emoji.txt"
            " /etc/ldp-collector/broker-password /etc/ldp-agent /etc/ldp-agent/agent.toml"
            " /etc/ldp-agent/broker-password /etc/ldp-agent/state-key.cred /etc/mosquitto/ldp/broker.key"
        )
        assert modes.split("\n")[:10] == [
            "/etc/ldp-collector 755 root:root",
            "/etc/ldp-collector/collector.toml 644 root:root",
            "/etc/ldp-collector/usecases.toml 644 root:root",
            "/etc/ldp-collector/dictionaries/emoji.txt 644 root:root",
            "/etc/ldp-collector/broker-password 600 root:root",
            "/etc/ldp-agent 755 root:root",
            "/etc/ldp-agent/agent.toml 644 root:root",
            "/etc/ldp-agent/broker-password 600 root:root",
            "/etc/ldp-agent/state-key.cred 600 root:root",
            "/etc/mosquitto/ldp/broker.key 600 mosquitto:mosquitto",
        ], modes
        assert "ldp-agent" in s.sh("getent passwd ldp-agent")
        owners = s.sh(
            "for u in ldp-agent ldp-collector mosquitto; do"
            " stat -c %U:%u /proc/$(systemctl show -p MainPID --value $u); done"
        ).split()
        assert owners[0].startswith("ldp-agent:"), owners
        # The dynamic user: a uid systemd allocates from 61184-65519 (no name without nss-systemd).
        assert 61184 <= int(owners[1].partition(":")[2]) <= 65519, owners
        assert owners[2].startswith("mosquitto:"), owners

        # The user opts in and records; the agent runs on the real clock here.
        s.sh("ldp-agent consent grant")
        for use_case, value in RECORDS:
            s.sh(f"ldp-agent record {use_case} '{value}'")

        # For the agent only, the day the values were recorded in ends now, and its clock runs
        # CLOCK_RATE times faster: the first cycle of the next day (at most 6 h 30 min later,
        # jitter included) comes within a minute and closes the period. The installed agent has
        # no switch for its clock: the unit runs the tests' launcher instead, which injects one
        # through the agent's library entry point.
        now = time.time()
        next_day = (int(now) // 86_400 + 1) * 86_400
        lib = "/usr/local/lib/ldp-test"
        s.sh(
            f"install -d -m 0755 {lib}/tests/support && "
            + " && ".join(
                f"install -m 0644 /src/tests/{f} {lib}/tests/{f}"
                for f in ("__init__.py", "support/__init__.py", "support/clocks.py", "support/agent_launcher.py")
            )
        )
        launcher = (
            "/opt/ldp-telemetry/.venv/bin/python -m tests.support.agent_launcher"
            f" --start={next_day} --anchor={now:.3f} --rate={CLOCK_RATE}"
            " -- --config /etc/ldp-agent/agent.toml run"
        )
        s.sh(
            "mkdir -p /etc/systemd/system/ldp-agent.service.d && cat > "
            "/etc/systemd/system/ldp-agent.service.d/test-clock.conf <<'EOF'\n[Service]\n"
            f"Environment=PYTHONPATH={lib}\nExecStart=\nExecStart={launcher}\nEOF\n"
            "systemctl daemon-reload && systemctl restart ldp-agent"
        )
        # The installed product alone: the old switch, set in the service's environment, is
        # nothing to it (the string appears nowhere in the installed agent).
        assert s.sh(f"grep -rl {_OLD_SWITCH} /opt/ldp-telemetry/.venv/lib/*/site-packages/agent || true") == ""

        deadline = time.monotonic() + DEADLINE_S
        while True:
            status = json.loads(s.sh("ldp-collector status --json"))
            counts = {name: sum(p["reports"] for p in status["use_cases"][name]["periods"]) for name, _ in RECORDS}
            if all(counts.values()):
                break
            if time.monotonic() > deadline:
                s.sh("ldp-agent status; ldp-agent ledger", ok=False)
                pytest.fail(
                    f"the collector has not received the reports within {DEADLINE_S:.0f} s: {counts}\n"
                    + "\n".join(s.transcript[-3:])
                    + s.logs()
                )
            time.sleep(1.0)

        # The ledger: what left the device, as sent; with commit receipts (the shipped default)
        # each of those reports ends "counted" once the collector's receipt is in.
        while True:
            ledger = json.loads(s.sh("ldp-agent ledger --json"))
            assert {e["use_case"] for e in ledger} >= {u for u, _ in RECORDS}
            if all(e["status"] == "counted" for e in ledger if e["use_case"] in dict(RECORDS)):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"reports counted by the collector but not by the agent's ledger: {ledger}")
            time.sleep(1.0)

        for use_case, _ in RECORDS:
            out = s.sh(f"ldp-collector estimate {use_case}")
            estimate = json.loads(s.sh(f"ldp-collector estimate {use_case} --json"))
            assert estimate["released"], out
            assert estimate["reports"] == 1, out
            print(f"--- ldp-collector estimate {use_case}\n{out}")

        # The collector serves Prometheus metrics on loopback, for a scrape or a reverse proxy.
        metrics = s.sh(
            '/opt/ldp-telemetry/.venv/bin/python -c "import urllib.request as u;'
            " print(u.urlopen('http://127.0.0.1:8650/metrics', timeout=10).read().decode())\""
        )
        assert re.search(r"^ldp_collector_reports_folded_total\S* [1-9]", metrics, re.MULTILINE), metrics[:2000]
        # From the [collector] extra's prometheus_client: histograms and the process's own metrics.
        assert re.search(r"^ldp_collector_commit_latency_seconds_count [1-9]", metrics, re.MULTILINE), metrics[:2000]
        assert re.search(r"^process_resident_memory_bytes ", metrics, re.MULTILINE), metrics[:2000]

        # A second run keeps the operator's config and the state key: the agent still reads
        # its sealed state (its ledger) after the restart the script does. (The ledger may
        # have grown meanwhile: on its fast clock the agent keeps running cycles.)
        rerun = s.sh(f"/src/deploy/install.sh {common} agent")
        assert "keeping /etc/ldp-agent/agent.toml" in rerun, rerun
        assert "made the state key" not in rerun, rerun
        s.sh("systemctl is-active --quiet ldp-agent")
        after = json.loads(s.sh("ldp-agent ledger --json"))
        # Compared without the state, which a receipt may have moved on from "sent" meanwhile.
        unchanging = [{k: v for k, v in e.items() if k != "status"} for e in after]
        assert all({k: v for k, v in e.items() if k != "status"} in unchanging for e in ledger), (ledger, after)
    finally:
        container.halt()
