"""A real Mosquitto broker on a free loopback port, for integration tests.

The broker runs as a child process with its own config, persistence directory and log in a
temporary directory; it listens on 127.0.0.1 only. ``restart()`` stops and starts it on the
same port (with persistence on, queued QoS 1 messages survive), for fault tests.
"""

from __future__ import annotations

import contextlib
import getpass
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Broker", "find_mosquitto", "free_port", "running_broker"]


def find_mosquitto() -> str | None:
    """Path of the mosquitto binary, or None when it is not installed."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"mosquitto did not start listening on 127.0.0.1:{port}")


@dataclass
class Broker:
    """A running Mosquitto child process."""

    directory: Path
    port: int
    extra_config: str = ""
    persistence: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        """The loopback address the broker listens on."""
        return "127.0.0.1"

    @property
    def config_path(self) -> Path:
        """The generated mosquitto.conf."""
        return self.directory / "mosquitto.conf"

    @property
    def log_path(self) -> Path:
        """The broker's log file."""
        return self.directory / "mosquitto.log"

    def _write_config(self) -> None:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            f"persistence {'true' if self.persistence else 'false'}",
            f"persistence_location {self.directory}/",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "max_queued_messages 0",
            "max_inflight_messages 0",
            # Run as the invoking user: mosquitto started as root would otherwise switch to
            # the "mosquitto" user, which cannot write the test's persistence directory.
            f"user {getpass.getuser()}",
            self.extra_config,
        ]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def start(self, timeout: float = 60.0) -> None:
        """Start the broker and wait until it accepts connections."""
        binary = find_mosquitto()
        if binary is None:
            raise RuntimeError("mosquitto is not installed; ./deploy/test.sh installs it")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.process = subprocess.Popen(
            [binary, "-c", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_listening(self.port, time.monotonic() + timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker gracefully (it saves its persistence file)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port."""
        self.stop()
        self.start()


@contextlib.contextmanager
def running_broker(directory: Path, *, extra_config: str = "", persistence: bool = True) -> Iterator[Broker]:
    """A broker for the duration of the ``with`` block."""
    broker = Broker(directory=directory, port=free_port(), extra_config=extra_config, persistence=persistence)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
