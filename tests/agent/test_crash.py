"""kill -9 at random moments across hundreds of accelerated 6-hour cycles: the state always decrypts,
memo tables never change, and neither the daily limit nor the lifetime ε cap is ever exceeded."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.accounting import EPSILON_SLACK
from agent.sealed import Sealer
from agent.state import LEDGER_VERSION
from protocol.registry import parse_registry
from protocol.wire import decode_report
from tests.agent.conftest import KEY, REGISTRY
from tests.support.broker import Broker

ROOT = Path(__file__).resolve().parents[2]
RATE = 432_000.0  # one 6-hour cycle every 0.05 s of real time
TARGET_CYCLES = 200
TARGET_KILLS = 20
# The run ends on counts (cycles run and kills made), never on elapsed time, so a faster or slower machine
# only changes how long it takes. In each round the agent must run at least one more cycle (however long a
# loaded machine takes to start Python), then it is killed at a random moment up to a second later; the
# state is read every 0.1 s meanwhile, so every report it stages is seen before the outbox could expire it.
# HANG_GUARD seconds without a cycle mean the agent hangs.
HANG_GUARD = 300.0

# Small caps so that some use cases reach them during the run.
CRASH_REGISTRY = REGISTRY.replace(
    "lifetime_epsilon = 100\nparameters = { k = 1024", "lifetime_epsilon = 30\nparameters = { k = 1024"
)


def _config(tmp: Path, port: int) -> Path:
    (tmp / "usecases.toml").write_text(CRASH_REGISTRY)
    (tmp / "usage.toml").write_text("editor = 100\nshell = 5\n")
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"""
[broker]
host = "127.0.0.1"
port = {port}
tls = false
publish_timeout = 5.0
backoff_initial = 0.05
backoff_max = 1.0
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
ledger_retention_days = 3650
[api]
socket = "agent.sock"
[schedule]
jitter_seconds = 1800.0
probe_interval_seconds = 21600.0
[[probes]]
kind = "uptime"
use_case = "seconds"
[[probes]]
kind = "process-names"
use_case = "procs"
max_names = 40
[[probes]]
kind = "process-names"
use_case = "words"
max_names = 40
[[probes]]
kind = "active-seconds"
source = "file"
path = "usage.toml"
targets = {{ editor = "hist", shell = "hist" }}
[log]
level = "warning"
"""
    )
    return cfg


class _Collector:
    """Everything the broker forwards under ldp/v1/reports/#."""

    def __init__(self, port: int) -> None:
        self.payloads: list[bytes] = []
        self.lock = threading.Lock()
        ready = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="crash-collector", clean_session=False)
        self.client.on_connect = lambda c, *a: c.subscribe("ldp/v1/reports/#", qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(60)

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.payloads.append(bytes(msg.payload))

    def received(self) -> int:
        """How many reports the broker has delivered so far."""
        with self.lock:
            return len(self.payloads)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class _Observer:
    """Decrypts the state after each kill and checks the invariants."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.sealer = Sealer(KEY)
        self.permanent: dict[str, dict[bytes, Any]] = {}
        self.reports: dict[bytes, dict[str, Any]] = {}  # report id -> use case, day, records, epsilon
        self.cycles = 0
        self.registry = parse_registry(CRASH_REGISTRY)

    def check(self) -> None:
        agent = self.sealer.read(self.state / "agent.sealed", "agent", 1)
        if agent is not None:
            self.cycles = max(self.cycles, agent["cycles"])
        ledger = self.sealer.read(self.state / "ledger.sealed", "ledger", LEDGER_VERSION)
        for e in (ledger or {"entries": []})["entries"]:
            self._report(
                e["id"], e["use_case"], e["day"], len(e["records"]), e["epsilon"], eps_total=e["epsilon_total"]
            )
        for path in sorted(self.state.glob("uc-*.sealed")):
            name = path.name[3 : -len(".sealed")]
            doc = self.sealer.read(path, f"usecase:{name}", 1)  # always decrypts
            assert doc is not None
            use_case = self.registry[name]
            budget = doc["budget"]
            if budget:
                assert budget["records_today"] <= use_case.daily_limit
                assert budget["epsilon_total"] <= use_case.lifetime_epsilon + EPSILON_SLACK
            for e in doc["outbox"]:
                self._report(e["id"], name, e["day"], e["records"], e["epsilon"], eps_total=e["epsilon_total"])
            seen = self.permanent.setdefault(name, {})
            for k, v in doc["permanent"].items():
                if k not in seen:
                    seen[k] = v
                elif name == "procs":  # RAPPOR: the memo only grows, entries never change
                    assert seen[k]["memo"].items() <= v["memo"].items()
                    assert (seen[k]["cohort"], seen[k]["key"]) == (v["cohort"], v["key"])
                    seen[k] = v
                else:
                    assert v == seen[k], f"{name}: permanent state changed"

    def _report(self, rid: bytes, name: str, day: int, records: int, eps: float, *, eps_total: float) -> None:
        entry = {"use_case": name, "day": day, "records": records, "epsilon": eps}
        if rid in self.reports:
            assert self.reports[rid] == entry
        self.reports[rid] = entry
        assert eps_total <= self.registry[name].lifetime_epsilon + EPSILON_SLACK

    def check_totals(self) -> None:
        per_day: dict[tuple[str, int], int] = {}
        per_use_case: dict[str, float] = {}
        for r in self.reports.values():
            key = (r["use_case"], r["day"])
            per_day[key] = per_day.get(key, 0) + r["records"]
            per_use_case[r["use_case"]] = per_use_case.get(r["use_case"], 0.0) + r["epsilon"]
        for (name, day), n in per_day.items():
            assert n <= self.registry[name].daily_limit, (name, day, n)
        for name, eps in per_use_case.items():
            assert eps <= self.registry[name].lifetime_epsilon + EPSILON_SLACK, (name, eps)


def test_kill_9_at_random_moments(tmp_path: Path, mosquitto: Broker) -> None:
    """Hundreds of cycles with SIGKILLs in between: every invariant holds after every kill."""
    cfg = _config(tmp_path, mosquitto.port)
    env = dict(os.environ)
    now = time.time()
    # The same accelerated timeline across every restart: one anchor for every process.
    launcher = [sys.executable, "-m", "tests.support.agent_launcher", f"--start={now}", f"--anchor={now}"]
    cmd = [*launcher, f"--rate={RATE}", "--", "--config", str(cfg)]
    subprocess.run([*cmd, "consent", "grant"], check=True, env=env, cwd=ROOT, capture_output=True)
    collector = _Collector(mosquitto.port)
    observer = _Observer(tmp_path / "state")
    chooser = random.Random(20240601)
    log = (tmp_path / "agent.log").open("wb")
    kills = 0

    def run_until(proc: subprocess.Popen[bytes], done: Callable[[], bool], what: str) -> None:
        """Poll every 0.1 s (leaving the CPU to the agent), reading the state each time, until ``done()``."""
        deadline = time.monotonic() + HANG_GUARD  # a hang guard only
        while not done():
            assert time.monotonic() < deadline, f"{what}: no progress in {HANG_GUARD:g} s; see {tmp_path / 'agent.log'}"
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                observer.check()
            else:
                raise AssertionError(f"the agent exited with {proc.returncode}; see {tmp_path / 'agent.log'}")

    try:
        while observer.cycles < TARGET_CYCLES or kills < TARGET_KILLS:
            before = observer.cycles
            # The first round also waits for a report to reach the broker, while every use case
            # can still send: the kills come at random moments, and a run of them could all come
            # before the publisher has sent anything.
            first = kills == 0
            proc = subprocess.Popen([*cmd, "run"], env=env, cwd=ROOT, stdout=log, stderr=log)
            run_until(
                proc,
                lambda: observer.cycles > before and (not first or collector.received() > 0),  # noqa: B023
                f"round {kills + 1}",
            )
            # A random moment a little later: mid-cycle, mid-publish, mid-write.
            moment = time.monotonic() + chooser.uniform(0.0, 1.0)
            run_until(proc, lambda: time.monotonic() >= moment, f"round {kills + 1}")  # noqa: B023
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            observer.check()
        # A last, clean run: once it has run two more cycles, SIGTERM ends it with status 0.
        proc = subprocess.Popen([*cmd, "run"], env=env, cwd=ROOT, stdout=log, stderr=log)
        target = observer.cycles + 2
        run_until(proc, lambda: observer.cycles >= target, "the clean run")
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=60)  # a hang guard only
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the launcher's faulthandler writes every stack to the log
            time.sleep(1)
            proc.kill()
            raise AssertionError(f"no exit 60 s after SIGTERM; stacks in {tmp_path / 'agent.log'}") from None
        assert status == 0
        observer.check()
    finally:
        log.close()
        collector.close()
    observer.check_totals()
    assert kills >= TARGET_KILLS
    registry = observer.registry
    received = {}
    for payload in list(collector.payloads):
        report = decode_report(payload, registry)
        received[report.report_id] = report
    assert received, "nothing reached the broker"
    for rid, report in received.items():
        assert rid in observer.reports  # every report that left was staged and charged first
        assert observer.reports[rid]["records"] == report.count
