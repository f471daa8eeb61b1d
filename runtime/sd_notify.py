"""systemd's notification protocol (sd_notify) with its watchdog; never blocks the event loop.

Under ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET`` (a path, or an abstract
socket when it starts with ``@``) and, with ``WatchdogSec=``, ``$WATCHDOG_USEC``. A daemon
sends ``READY=1`` once it serves, ``WATCHDOG=1`` at half the watchdog interval while its
event loop runs (sd_watchdog_enabled(3)), ``STATUS=...`` lines, and ``STOPPING=1`` on
shutdown. Outside systemd every call is a no-op.

A datagram socket blocks when the receiver's queue is full (a supervisor that stopped
reading, a test harness): a blocking ``sendto`` from the event loop then froze the whole
daemon, SIGTERM included, after about ten pings. Here the socket is non-blocking; a
notification that cannot be sent at once is dropped and counted (:attr:`Notifier.dropped`),
never retried: the next ping carries the same news.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping

__all__ = ["Notifier"]


class Notifier:
    """Sends notifications to the service manager, if there is one, without ever blocking.

    Args:
        environ: the environment to read ``NOTIFY_SOCKET`` and ``WATCHDOG_*`` from.

    Attributes:
        sent: datagrams handed to the kernel.
        dropped: datagrams that could not be sent at once (full queue, no listener) and were dropped.
        watchdog_interval: seconds between ``WATCHDOG=1`` pings: half ``$WATCHDOG_USEC``, or
            None when systemd asked for no watchdog (unset, 0, or meant for another process
            by ``$WATCHDOG_PID``): systemd ignores pings it did not ask for.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self._sock: socket.socket | None = None
        self.sent = 0
        self.dropped = 0
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            # Ping at half the interval, as sd_watchdog_enabled(3) recommends.
            self.watchdog_interval = int(usec) / 2e6

    @property
    def enabled(self) -> bool:
        """True when running under a service manager that listens."""
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one datagram; False (and counted) if not sent now."""
        if self._address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            self._sock.sendto("\n".join(fields).encode("utf-8"), self._address)
        except OSError:  # BlockingIOError on a full queue; ECONNREFUSED, ENOENT without a listener
            self.dropped += 1
            return False
        self.sent += 1
        return True

    async def run_watchdog(self, on_ping: Callable[[], None] | None = None) -> None:
        """Send ``WATCHDOG=1`` every :attr:`watchdog_interval` while the event loop runs.

        Run it as a task of its own, not inside other work: a part that is failing (and being
        retried with backoff) must not let systemd kill a daemon that is up and reporting
        itself unhealthy, which would turn a full disk into a restart loop. Returns at once
        when systemd asked for no watchdog.

        Args:
            on_ping: called after each ping (a daemon copies :attr:`dropped` into its metrics).
        """
        interval = self.watchdog_interval
        if interval is None or not self.enabled:
            return
        while True:
            self.notify("WATCHDOG=1")
            if on_ping is not None:
                on_ping()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Release the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
