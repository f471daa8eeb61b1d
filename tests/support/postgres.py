"""A throwaway PostgreSQL server for store tests: ``initdb`` and ``pg_ctl`` in a temp directory.

The server listens on 127.0.0.1 at a free port and on a Unix socket in its own directory,
with ``trust`` authentication for local connections only; it is stopped (``pg_ctl stop -m
immediate`` when a test killed it) and its directory removed afterwards. ``initdb`` refuses
to run as root, so as root the cluster belongs to an unprivileged account (``nobody`` by
default): the data directory is made for it and the binaries run under ``runuser``.

Debian's ``postgresql`` package puts the binaries under ``/usr/lib/postgresql/<major>/bin``,
not on ``PATH``; :func:`find_postgres` looks there first (newest major), then on ``PATH``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.broker import free_port

__all__ = ["PostgresServer", "find_postgres", "running_postgres"]

_RUN_AS = "nobody"


def find_postgres() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None when not installed."""
    base = Path("/usr/lib/postgresql")
    if base.is_dir():
        majors = sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        for major in majors:
            if (major / "bin" / "initdb").exists() and (major / "bin" / "postgres").exists():
                return major / "bin"
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("postgres") is not None:
        return Path(initdb).resolve().parent
    return None


def _wait_listening(port: int, deadline: float, proc_log: Path) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    tail = proc_log.read_text(errors="replace")[-2000:] if proc_log.exists() else ""
    raise TimeoutError(f"PostgreSQL did not start listening on 127.0.0.1:{port}; its log ends with:\n{tail}")


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``directory``, running as a child of ``pg_ctl``."""

    directory: Path
    port: int
    bindir: Path
    user: str = "ldp"
    database: str = "ldp"
    _owner: str | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.directory / "data"

    @property
    def socket_dir(self) -> Path:
        """The directory of the server's Unix socket."""
        return self.directory / "socket"

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.directory / "postgres.log"

    @property
    def url(self) -> str:
        """A libpq URL over TCP on loopback (no password: trust authentication)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def socket_url(self) -> str:
        """A libpq URL over the Unix socket."""
        return f"postgresql://{self.user}@/{self.database}?host={self.socket_dir}&port={self.port}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._owner is not None:
            cmd = ["runuser", "-u", self._owner, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        """Create the cluster, its role and its database (``initdb`` + one ``psql`` batch)."""
        if os.geteuid() == 0:
            self._owner = _RUN_AS
            entry = pwd.getpwnam(_RUN_AS)
            self.directory.mkdir(parents=True, exist_ok=True)
            # The cluster's owner must reach its directory; the parents stay the test's.
            for path in (self.directory, *self.directory.parents):
                if path == Path("/"):
                    break
                mode = path.stat().st_mode
                if not mode & 0o001:
                    path.chmod(mode | 0o001)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self.socket_dir.mkdir(exist_ok=True)
        if self._owner is not None:
            entry = pwd.getpwnam(self._owner)
            os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        )
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                # Throwaway clusters: durability comes from the tests' own kill/restart steps.
                "fsync = off\nsynchronous_commit = on\nfull_page_writes = off\n"
                "max_connections = 100\nshared_buffers = 64MB\n"
            )

    def start(self, timeout: float = 120.0) -> None:  # a hang guard only
        """Start the server and wait until it accepts TCP connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", str(int(timeout)), "start")
        _wait_listening(self.port, time.monotonic() + timeout, self.log_path)

    def run_sql(self, sql: str) -> str:
        """Run ``sql`` as the cluster's superuser through ``psql`` over the socket; its output."""
        done = self._run(
            "psql", "-h", str(self.socket_dir), "-p", str(self.port), "-U", "postgres", "-X", "-q", "-At", "-c", sql
        )
        return done.stdout

    def create_database(self) -> None:
        """Create the test role and database (once, after the first start)."""
        self.run_sql(f"CREATE ROLE {self.user} LOGIN SUPERUSER")
        self.run_sql(f"CREATE DATABASE {self.database} OWNER {self.user}")

    def with_database(self, database: str) -> PostgresServer:
        """The same running server, addressed at another database."""
        return dataclasses.replace(self, database=database)

    def stop(self, *, mode: str = "fast") -> None:
        """Stop the server (``fast``; ``immediate`` is a crash, recovered at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, *, mode: str = "fast") -> None:
        """Stop and start on the same port; committed data survives."""
        self.stop(mode=mode)
        self.start()


@contextlib.contextmanager
def running_postgres(directory: Path) -> Iterator[PostgresServer]:
    """A fresh cluster for ``directory`` with database ``ldp`` owned by role ``ldp``.

    As root, the cluster itself lives in a directory of its own under the system temp
    directory, and ``directory`` is a symbolic link to it: pytest's temp tree
    (``/tmp/pytest-of-root``) is set back to mode 0700 by every pytest session that starts
    on the machine, which would lock the cluster's owner out of a cluster inside it.

    Raises:
        RuntimeError: PostgreSQL is not installed (``apt-get install postgresql``).
    """
    bindir = find_postgres()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (deploy/test.sh does)")
    home = directory
    if os.geteuid() == 0:
        home = Path(tempfile.mkdtemp(prefix="ldp-postgres-"))
    try:
        if home != directory:
            if directory.is_dir() and not directory.is_symlink():
                directory.rmdir()  # tmp_path_factory.mktemp made it, empty
            directory.parent.mkdir(parents=True, exist_ok=True)
            directory.symlink_to(home, target_is_directory=True)
        server = PostgresServer(directory=home, port=free_port(), bindir=bindir)
        server.init()
        server.start()
        try:
            server.create_database()
            yield server
        finally:
            server.stop(mode="immediate")
    finally:
        if home != directory:
            shutil.rmtree(home, ignore_errors=True)
