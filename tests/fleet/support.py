"""A broker and a collector for the fleet's end-to-end tests, as deploy/run-demo.sh starts them.

The broker runs deploy/mosquitto/mosquitto.conf (TLS, password file, ACL) with its paths and
ports moved into a temporary directory, with the CA and users made by deploy/make-test-ca.sh
and deploy/make-broker-users.sh; or, for tests that only need a broker, a plain loopback one.
The collector is ``python -m collector run`` with its HTTP API on a free loopback port.
Every process is stopped when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleet.plan import FleetPlan
from fleet.values import default_spec
from protocol.registry import parse_registry
from tests.support.broker import find_mosquitto, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
FLEET_REGISTRY = DEPLOY / "fleet.usecases.toml"
START = 1_700_006_400  # 2023-11-15T00:00:00Z


def every_use_case_plan(
    *, devices: int, days: int, seed: int, text: bytes | None = None, path: Path = FLEET_REGISTRY
) -> FleetPlan:
    """A plan of every use case of a registry, each with its default generator, from :data:`START`.

    ``text`` is the registry (read from ``path`` when None; ``path`` is what the plan names).
    Other fields keep their defaults: ``dataclasses.replace`` sets them.
    """
    registry_text = path.read_bytes() if text is None else text
    registry = parse_registry(registry_text, source=str(path))
    names = tuple(registry.use_cases)
    return FleetPlan(
        registry_text=registry_text,
        registry_path=str(path),
        use_cases=names,
        generators={n: default_spec(registry.use_cases[n]) for n in names},
        devices=devices,
        days=days,
        start=START,
        seed=seed,
    )


@dataclass(frozen=True)
class Stack:
    """A running broker and collector.

    Attributes:
        broker_port: the broker's loopback port (TLS when ``ca_file`` is set).
        collector_url: the collector's HTTP API.
        ca_file: the CA that signed the broker's certificate (None: plain MQTT).
        password_file: the fleet simulator's password (user ``fleet-sim``; None: anonymous).
        directory: where logs and state live.
    """

    broker_port: int
    collector_url: str
    ca_file: Path | None
    password_file: Path | None
    directory: Path

    def fleet_args(self, *, password: bool = True) -> list[str]:
        """The ldp-fleet arguments that reach this broker and collector as the simulator's own user,
        each device under its sub-identity (``password=False``: without a user and password)."""
        args = ["--broker", f"127.0.0.1:{self.broker_port}", "--collector-url", self.collector_url]
        if self.ca_file is not None:
            args += ["--ca-file", str(self.ca_file)]
        else:
            args += ["--no-tls"]
        if password and self.password_file is not None:
            args += ["--username", "fleet-sim", "--password-file", str(self.password_file)]
        return args


def _wait(predicate: object, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():  # type: ignore[operator]
                return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise TimeoutError(f"{what} not ready after {timeout:g} s; {log}:\n{tail}")


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.3):
        return True


def deploy_broker_config(directory: Path, *, port: int, mtls_port: int) -> Path:
    """deploy/mosquitto/mosquitto.conf with its ports and paths moved into ``directory``."""
    text = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text(encoding="utf-8")
    rules = [
        (r"(?m)^listener 8883$", f"listener {port} 127.0.0.1"),
        (r"(?m)^listener 8884$", f"listener {mtls_port} 127.0.0.1"),
        (r"/etc/mosquitto/ldp/", f"{directory}/"),
        (r"(?m)^persistence_location .*$", f"persistence_location {directory}/data/"),
        (r"(?m)^user .*$", f"user {getpass.getuser()}"),
        (r"(?m)^pid_file .*$", ""),
        (r"(?m)^log_dest .*$", f"log_dest file {directory}/mosquitto.log"),
    ]
    for pattern, replacement in rules:
        text, count = re.subn(pattern, replacement, text)
        if count == 0 and "listener" in pattern:
            raise AssertionError(f"deploy/mosquitto/mosquitto.conf has no line matching {pattern}")
    path = directory / "mosquitto.conf"
    path.write_text(text, encoding="utf-8")
    return path


def _collector_config(directory: Path, *, port: int, http_port: int, tls: tuple[Path, Path] | None) -> Path:
    auth = ""
    if tls is not None:
        ca, password = tls
        auth = f'username = "collector"\npassword_file = "{password}"\n[mqtt.tls]\nca_file = "{ca}"\n'
    path = directory / "collector.toml"
    path.write_text(
        f"""registry = "{FLEET_REGISTRY}"
instance = "fleet-test"

[mqtt]
host = "127.0.0.1"
port = {port}
client_id = "ldp-collector-fleet-test"
keepalive_s = 10
reconnect_max_s = 0.5
{auth}
[ingest]
commit_interval_s = 0.05
retention_periods = 400
require_device_identity = {"true" if tls is not None else "false"}

[store]
path = "{directory / "collector.sqlite3"}"

[http]
host = "127.0.0.1"
port = {http_port}

[estimation]
workers = 0
""",
        encoding="utf-8",
    )
    return path


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def running_stack(directory: Path, *, tls: bool, users: tuple[str, ...] = ()) -> Iterator[Stack]:
    """Start a broker (the deploy config with TLS and the ACL, or a plain one) and a collector.

    ``users``: more broker users beyond ``collector`` and ``fleet-sim`` (TLS only), each with
    its password in ``<directory>/secrets/<user>.password``; the ACL gives them a device's rights.
    """
    binary = find_mosquitto()
    if binary is None:
        raise RuntimeError("mosquitto is not installed; ./deploy/test.sh installs it")
    broker_dir = directory / "broker"
    (broker_dir / "data").mkdir(parents=True)
    port = free_port()
    ca_file = devices_password = None
    tls_pair: tuple[Path, Path] | None = None
    if tls:
        pki, secrets = directory / "pki", directory / "secrets"
        subprocess.run([str(DEPLOY / "make-test-ca.sh"), str(pki)], check=True, capture_output=True, timeout=60)
        subprocess.run(
            [
                str(DEPLOY / "make-broker-users.sh"),
                *("--user", "collector", "--user", "fleet-sim"),
                *(arg for user in users for arg in ("--user", user)),
                str(broker_dir / "passwd"),
                str(secrets),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for name in ("ca.pem", "broker.pem", "broker.key"):
            shutil.copy(pki / name, broker_dir / name)
        # The production ACL plus the simulator's sub-identities, as deploy/run-demo.sh builds it.
        acl = (DEPLOY / "mosquitto" / "acl").read_text(encoding="utf-8")
        acl += (DEPLOY / "mosquitto" / "acl.fleet-sim").read_text(encoding="utf-8")
        (broker_dir / "acl").write_text(acl, encoding="utf-8")
        config = deploy_broker_config(broker_dir, port=port, mtls_port=free_port())
        ca_file, devices_password = pki / "ca.pem", secrets / "fleet-sim.password"
        tls_pair = (ca_file, secrets / "collector.password")
    else:
        config = broker_dir / "mosquitto.conf"
        config.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"log_dest file {broker_dir}/mosquitto.log\nuser {getpass.getuser()}\n",
            encoding="utf-8",
        )
    broker_log = broker_dir / "mosquitto.log"
    broker = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    collector: subprocess.Popen[bytes] | None = None
    try:
        _wait(lambda: _listening(port), 120, "mosquitto", broker_log)
        http_port = free_port()
        collector_dir = directory / "collector"
        collector_dir.mkdir()
        cfg = _collector_config(collector_dir, port=port, http_port=http_port, tls=tls_pair)
        log = collector_dir / "collector.log"
        with log.open("wb") as out:
            collector = subprocess.Popen(
                [sys.executable, "-m", "collector", "--config", str(cfg), "--log-level", "WARNING", "run"],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{http_port}"

        def connected() -> bool:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                return bool(json.load(r).get("connected"))

        _wait(connected, 120, "the collector", log)
        yield Stack(port, url, ca_file, devices_password, directory)
    finally:
        if collector is not None:
            _stop(collector)
        _stop(broker)
