"""The production Mosquitto configuration, run for real on loopback ports.

``deploy/mosquitto/mosquitto.conf`` and ``deploy/mosquitto/acl`` are used as shipped, with
only what a test machine forces changed: each ``listener`` moves to a free port on
127.0.0.1, file paths move under a temporary directory, the process keeps the invoking
user, and the log goes to a file there. Everything else (TLS, password file, ACL, retained
messages off, packet size and queue limits, persistence) is the production text. An option
the rewriter does not know how to relocate (a new path-valued option, an unexpected
listener) is an error, so a change to the production file cannot slip past the tests.

The certificates and the password file come from ``deploy/make-test-ca.sh`` and
``deploy/make-broker-users.sh``, run as a deployer would run them. For the tests only, the
ACL gets one extra user, ``observer``, allowed to read every topic (``#``): with it a test
can prove a message was not delivered anywhere, not merely that one collector did not see it.
The fleet simulator's lines (``deploy/mosquitto/acl.fleet-sim``) are appended as
``deploy/run-demo.sh`` appends them.
"""

from __future__ import annotations

import contextlib
import getpass
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.broker import find_mosquitto, free_port

__all__ = [
    "DEPLOY",
    "MTLS_PORT",
    "OBSERVER_ACL",
    "TLS_PORT",
    "SecureBroker",
    "make_pki",
    "make_users",
    "rewrite_config",
    "running_secure_broker",
]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PRODUCTION_CONF = DEPLOY / "mosquitto" / "mosquitto.conf"
PRODUCTION_ACL = DEPLOY / "mosquitto" / "acl"
FLEET_SIM_ACL = DEPLOY / "mosquitto" / "acl.fleet-sim"
TLS_PORT = 8883  # the production listeners this module knows how to move
MTLS_PORT = 8884

OBSERVER_ACL = """
# Added by tests/deploy only: a user that may read everything, to observe deliveries.
user observer
topic read #
"""

# Options whose value is a file the broker reads (moved under <directory>/etc by name).
_INPUT_FILES = frozenset({"cafile", "certfile", "keyfile", "password_file", "acl_file"})
# Options that name files or code the rewriter does not relocate: refuse rather than let a
# test broker read the host's /etc. "port" and "bind_address" open the old-style default
# listener, which the tests could not move either.
_UNSUPPORTED = frozenset(
    {"include_dir", "capath", "crlfile", "dhparamfile", "psk_file", "plugin", "auth_plugin", "port", "bind_address"}
)


def _moved(line: str, key: str, value: str, *, directory: Path, ports: Mapping[int, int], user: str) -> str:
    """One setting of the production config as the test broker has it (unchanged if it names nothing to move)."""
    if key == "listener":
        port = int(value.split(maxsplit=1)[0])
        if port not in ports:
            raise ValueError(f"listener {value!r}: tests/deploy only knows listeners {sorted(ports)}")
        return f"listener {ports[port]} 127.0.0.1"
    if key in _INPUT_FILES:
        return f"{key} {directory / 'etc' / Path(value).name}"
    if key == "persistence_location":
        return f"{key} {directory / 'persist'}/"
    if key == "pid_file":
        return f"{key} {directory / 'mosquitto.pid'}"
    if key == "user":
        return f"user {user}"
    return line


def rewrite_config(text: str, *, directory: Path, ports: Mapping[int, int], user: str) -> str:
    """The production config with its listeners, paths, user and log moved for a test.

    Args:
        text: the production mosquitto.conf.
        directory: where the moved files live (``etc/``, ``persist/``, the log, the pid file).
        ports: production listener port -> loopback port to listen on instead.
        user: the user the broker keeps running as.

    Raises:
        ValueError: the config has a listener or option this function cannot relocate, or a
            path outside ``directory`` survived the rewrite.
    """
    out: list[str] = []
    logged = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            out.append(line)
            continue
        key, _, value = stripped.partition(" ")
        value = value.strip()
        if key == "log_dest":
            # One log file in the test directory, whatever the production destinations are.
            if not logged:
                out.append(f"log_dest file {directory / 'mosquitto.log'}")
                logged = True
        elif key in _UNSUPPORTED:
            raise ValueError(f"{key}: tests/deploy cannot relocate this option; teach rewrite_config about it")
        else:
            out.append(_moved(line, key, value, directory=directory, ports=ports, user=user))
    result = "\n".join(out) + "\n"
    settings = "\n".join(ln for ln in result.splitlines() if not ln.lstrip().startswith("#"))
    for path in re.findall(r"(?<![\w/])/[^\s]*", settings):
        if not path.startswith(str(directory)):
            raise ValueError(f"{path} survived the rewrite: a test broker must not use the host's files")
    return result


def _run_script(*args: str | Path) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    if done.returncode != 0:
        raise AssertionError(f"{args[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def make_pki(directory: Path, *extra: str) -> Path:
    """Run deploy/make-test-ca.sh into ``directory``; return it."""
    _run_script(DEPLOY / "make-test-ca.sh", *extra, directory)
    return directory


def make_users(passwd: Path, secrets: Path, users: tuple[str, ...]) -> dict[str, str]:
    """Run deploy/make-broker-users.sh for ``users``; return each user's password."""
    _run_script(DEPLOY / "make-broker-users.sh", *(a for u in users for a in ("--user", u)), passwd, secrets)
    return {u: (secrets / f"{u}.password").read_text(encoding="utf-8") for u in users}


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


@dataclass
class SecureBroker:
    """Mosquitto running the production config (relocated) in ``directory``.

    Attributes:
        directory: the broker's files: ``etc/`` (certificates, passwd, acl), ``persist/``,
            ``mosquitto.conf``, ``mosquitto.log``.
        pki: the output of make-test-ca.sh (``ca.pem``, ``<client>.pem``/``.key``).
        passwords: broker user -> password (from make-broker-users.sh).
        tls_port: the loopback port of the production 8883 listener (TLS + password).
        mtls_port: the loopback port of the production 8884 listener (client certificates).
        overrides: production options given another value (small queue limits for a fault
            test); each must already be in the production file.
    """

    directory: Path
    pki: Path
    passwords: dict[str, str]
    tls_port: int = field(default_factory=free_port)
    mtls_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        while self.mtls_port == self.tls_port:
            self.mtls_port = free_port()

    @property
    def ca_file(self) -> Path:
        """The test CA clients trust."""
        return self.pki / "ca.pem"

    @property
    def config_path(self) -> Path:
        """The rewritten mosquitto.conf."""
        return self.directory / "mosquitto.conf"

    def log(self) -> str:
        """The broker's log and stderr so far, for failure messages."""
        parts = [p.read_text(errors="replace") for p in (self.directory / "mosquitto.log", self.directory / "stderr")]
        return "".join(p for p in parts if p)

    def install(self, passwd: Path) -> None:
        """Lay out the files the rewritten config points at."""
        etc = self.directory / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (self.directory / "persist").mkdir(exist_ok=True)
        for name in ("ca.pem", "broker.pem", "broker.key"):
            (etc / name).write_bytes((self.pki / name).read_bytes())
            (etc / name).chmod(0o600)
        (etc / "passwd").write_bytes(passwd.read_bytes())
        (etc / "passwd").chmod(0o600)
        acl = PRODUCTION_ACL.read_text(encoding="utf-8") + FLEET_SIM_ACL.read_text(encoding="utf-8") + OBSERVER_ACL
        (etc / "acl").write_text(acl, encoding="utf-8")
        (etc / "acl").chmod(0o600)
        config = rewrite_config(
            PRODUCTION_CONF.read_text(encoding="utf-8"),
            directory=self.directory,
            ports={TLS_PORT: self.tls_port, MTLS_PORT: self.mtls_port},
            user=getpass.getuser(),
        )
        for key, value in self.overrides.items():
            pattern = re.compile(rf"^{re.escape(key)} .*$", re.M)
            if not pattern.search(config):
                raise ValueError(f"override {key}: not an option of the production mosquitto.conf")
            config = pattern.sub(f"{key} {value}", config)
        self.config_path.write_text(config, encoding="utf-8")

    def start(self, timeout: float = 60.0) -> None:
        """Start mosquitto and wait, with a deadline, until both listeners accept connections."""
        binary = find_mosquitto()
        if binary is None:
            raise RuntimeError("mosquitto is not installed; ./deploy/test.sh installs it")
        with (self.directory / "stderr").open("wb") as err:
            self.process = subprocess.Popen([binary, "-c", str(self.config_path)], stdout=err, stderr=err)
        deadline = time.monotonic() + timeout
        waiting = [self.tls_port, self.mtls_port]
        while waiting:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"mosquitto did not listen on {waiting} within {timeout} s:\n{self.log()}")
            waiting = [p for p in waiting if not _listening(p)]
            if waiting:
                time.sleep(0.02)  # polling a socket that is not open yet, under the deadline above

    def kill9(self) -> None:
        """SIGKILL: no autosave, no clean shutdown (what is not yet persisted is lost)."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=10)
        self.process = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
        self.process = None


@contextlib.contextmanager
def running_secure_broker(
    directory: Path,
    *,
    pki: Path,
    passwd: Path,
    passwords: dict[str, str],
    overrides: Mapping[str, str] | None = None,
) -> Iterator[SecureBroker]:
    """A production-config broker for the duration of the ``with`` block."""
    broker = SecureBroker(directory=directory, pki=pki, passwords=passwords, overrides=dict(overrides or {}))
    broker.install(passwd)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
