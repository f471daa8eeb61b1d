"""A collector group for fault tests and benchmarks: members of one MQTT shared subscription, one store.

Each member is an ``ldp-collector run`` process with its own ``instance`` and ``client_id``
(its persistent session at the broker), all in one ``[mqtt] shared_group`` and all folding
into the same store: a PostgreSQL database (``[store] url``) or, on one host, a shared SQLite
file (``[store] path``). :class:`StoreTarget` is that choice, so the same test or benchmark
runs on either backend.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from collector.errors import StoreError
from collector.store import Store
from protocol.registry import Registry
from tests.collector.processes import CollectorProcess, open_readonly, write_config

__all__ = ["CollectorGroup", "StoreTarget", "committed", "open_reader", "wait_committed"]


@dataclass(frozen=True)
class StoreTarget:
    """Where a group folds: ``url`` (PostgreSQL) when set, else the SQLite file ``path``."""

    path: Path | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.url is None):
            raise ValueError("a store target is either an SQLite path or a PostgreSQL url")

    @property
    def backend(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return "postgresql" if self.url is not None else "sqlite"

    @property
    def location(self) -> Path | str:
        """What ``write_config`` and ``open_readonly`` take: the SQLite path or the URL."""
        return self.url if self.url is not None else cast(Path, self.path)


def open_reader(target: StoreTarget, registry: Registry) -> Store:
    """The store opened for reading (totals, aggregates, counters), as ``ldp-collector status`` opens it.

    Raises:
        StoreError: nothing was written there yet, or it cannot be read now.
    """
    store = open_readonly(target.location, registry)
    if store is None:
        raise StoreError(f"no checkpoint store at {target.location} yet")
    return store


def committed(target: StoreTarget, registry: Registry) -> dict[str, int] | None:
    """Lifetime counters summed over the members; ``{}`` before the first commit, ``None`` while
    the store cannot be read (a database restarting)."""
    try:
        store = open_readonly(target.location, registry)
    except StoreError:
        return None
    if store is None:
        return {}
    try:
        return store.counters()
    except StoreError:
        return None
    finally:
        store.close()


class CollectorGroup:
    """``size`` collector processes in the shared group ``group``, folding into ``target``."""

    def __init__(
        self,
        directory: Path,
        *,
        size: int,
        registry: Path,
        host: str,
        port: int,
        target: StoreTarget,
        group: str = "ldp",
        extra: str = "",
    ) -> None:
        self.directory = directory
        self.target = target
        self.members: list[CollectorProcess] = []
        for i in range(size):
            config = write_config(
                directory,
                registry=registry,
                host=host,
                port=port,
                client_id=f"ldp-collector-{group}-{i}",
                instance=f"member-{i}",
                store=target.location,
                shared_group=group if size > 1 else "",
                extra=extra,
            )
            self.members.append(CollectorProcess(config, log=directory / f"member-{i}.log"))

    def start(self) -> None:
        """Start every member and wait until each is READY (subscribed, store open)."""
        for member in self.members:
            member.launch()
        for member in self.members:
            member.wait_ready()

    def kill9_and_restart(self, index: int) -> None:
        """SIGKILL member ``index`` (no commit, no DISCONNECT), start it again, wait for READY."""
        self.members[index].kill9()
        self.members[index].start()

    def check_alive(self) -> None:
        """Raise naming the member (and its log) that exited on its own."""
        for i, member in enumerate(self.members):
            process = member.process
            if process is not None and process.poll() is not None:
                tail = member.log.read_text(errors="replace")[-3000:] if member.log.exists() else ""
                raise AssertionError(f"member {i} exited with status {process.returncode}; its log ends:\n{tail}")

    def pids(self) -> list[int]:
        """The members' process ids."""
        return [member.pid for member in self.members]

    def stop(self) -> list[int]:
        """SIGTERM every member; their exit statuses."""
        return [member.stop() for member in self.members]

    def close(self) -> None:
        """Kill whatever still runs."""
        for member in self.members:
            member.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[CollectorGroup]:
        """Started for the ``with`` block, closed afterwards."""
        try:
            self.start()
            yield self
        finally:
            self.close()


def wait_committed(
    target: StoreTarget,
    registry: Registry,
    reports: int,
    *,
    timeout: float,
    groups: Sequence[CollectorGroup] = (),
    interval: float = 0.1,
) -> dict[str, int]:
    """Poll the store until ``reports`` reports are committed; a hang guard of ``timeout`` seconds.

    Raises at once if a member of ``groups`` exited by itself (a member must survive a
    database or broker restart on its own).
    """
    deadline = time.monotonic() + timeout
    last: dict[str, int] | None = None
    while True:
        for group in groups:
            group.check_alive()
        counters = committed(target, registry)
        if counters is not None:
            last = counters
            if counters.get("reports", 0) >= reports:
                return counters
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {(last or {}).get('reports', 0)} of {reports} reports committed: {last}")
        time.sleep(interval)
