"""systemd's notification protocol (sd_notify) for the collector: never blocks the event loop.

Under ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET`` (a path, or an abstract
socket when it starts with ``@``) and, with ``WatchdogSec=``, ``$WATCHDOG_USEC``. The
collector sends ``READY=1`` once subscribed, ``WATCHDOG=1`` at half the watchdog interval
while its event loop runs, and ``STOPPING=1`` on shutdown.

A datagram socket blocks when the receiver's queue is full (a supervisor that stopped
reading, a test harness): a blocking ``sendto`` from the event loop then froze the whole
collector, HTTP and SIGTERM included, after about ten pings. Here the socket is
non-blocking; a notification that cannot be sent at once is dropped and counted
(``ldp_collector_sd_notify_dropped_total``), never retried: the next ping carries the same
news.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["DEFAULT_WATCHDOG_S", "Notifier"]

DEFAULT_WATCHDOG_S = 5.0
"""Ping interval without ``$WATCHDOG_USEC`` (systemd ignores pings it did not ask for)."""


class Notifier:
    """Sends notifications to the service manager, if there is one, without ever blocking.

    Args:
        environ: the environment to read ``NOTIFY_SOCKET`` and ``WATCHDOG_*`` from.

    Attributes:
        sent: datagrams handed to the kernel.
        dropped: datagrams that could not be sent at once (full queue, no listener) and were dropped.
        watchdog_interval: seconds between ``WATCHDOG=1`` pings: half ``$WATCHDOG_USEC``
            (sd_watchdog_enabled(3)), or :data:`DEFAULT_WATCHDOG_S` when it is not set or is
            meant for another process (``$WATCHDOG_PID``).
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
        self.watchdog_interval = DEFAULT_WATCHDOG_S
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 2e6

    @property
    def enabled(self) -> bool:
        """True when running under a service manager that listens."""
        return self._address is not None

    def notify(self, message: str) -> bool:
        """Send ``message`` (``"READY=1"``) as one datagram; False (and counted) if it cannot go now."""
        if self._address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            self._sock.sendto(message.encode("utf-8"), self._address)
        except OSError:  # BlockingIOError on a full queue; ECONNREFUSED, ENOENT without a listener
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        """Release the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
