"""systemd's notification protocol (sd_notify), written by hand: one datagram per message.

Under ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET`` (a path, or an abstract
socket when it starts with ``@``). The agent sends ``READY=1`` once it serves, ``WATCHDOG=1``
at half the ``$WATCHDOG_USEC`` interval while its event loop is alive, ``STATUS=...`` lines,
and ``STOPPING=1`` on shutdown. Outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["Notifier"]


class Notifier:
    """Sends notifications to the service manager, if there is one.

    Args:
        environ: the environment to read ``NOTIFY_SOCKET`` and ``WATCHDOG_*`` from.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            # Ping at half the interval, as sd_watchdog_enabled(3) recommends.
            self.watchdog_interval = int(usec) / 2e6

    @property
    def enabled(self) -> bool:
        """True when running under a service manager that listens."""
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one datagram; False if not sent."""
        if self._address is None:
            return False
        message = "\n".join(fields).encode("utf-8")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(message, self._address)
            except OSError:
                return False
        return True
