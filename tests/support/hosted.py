"""Services on the hosts of a :class:`tests.support.netns.Network`: PostgreSQL and Mosquitto at a
host's address, and a wait until one host can reach another's port.

Each service listens only at its host's address on the test network, so the other hosts reach
it over the network, as on separate machines (tests/deploy/test_multihost.py,
tests/deploy/test_multihost_brokers.py).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.broker import find_mosquitto
from tests.support.netns import Host
from tests.support.postgres import PostgresServer

__all__ = ["HostedBroker", "HostedPostgres", "wait_reachable"]

GUARD_S = 600.0
"""A hang guard for each wait, not a speed requirement."""


def wait_reachable(client: Host, server: Host, port: int, timeout: float = GUARD_S) -> None:
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
        [sys.executable, "-c", code, server.address, str(port), str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
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
class HostedBroker:
    """Mosquitto on ``host`` at its address, any client and user name allowed (no ACL).

    ``persistence`` keeps Mosquitto's own store in ``directory`` (written at shutdown and
    autosave only, so a ``kill -9`` loses what it held since: the case receipts recover).
    """

    host: Host
    directory: Path
    port: int = 1883
    persistence: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` as agents and collectors list it."""
        return f"{self.host.address}:{self.port}"

    def start(self) -> None:
        """Start the broker (again, after :meth:`kill9`, on the same address and store)."""
        binary = find_mosquitto()
        assert binary is not None, "mosquitto is not installed; ./deploy/test.sh installs it"
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "mosquitto.conf"
        store = f"persistence true\npersistence_location {self.directory}/\n" if self.persistence else ""
        config.write_text(
            f"listener {self.port} {self.host.address}\n"
            "allow_anonymous true\n"
            f"{store}"
            f"log_dest file {self.directory}/mosquitto.log\nlog_type error\nlog_type warning\n"
            "max_queued_messages 0\nmax_inflight_messages 0\n"
            "user root\n",
            encoding="utf-8",
        )
        self.process = self.host.popen(
            [binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def kill9(self) -> None:
        """``kill -9``: no DISCONNECT, no store written, as after a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None
