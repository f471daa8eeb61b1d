"""A ``NOTIFY_SOCKET`` that listens the way systemd does: it reads every datagram as it comes.

A service's ``sd_notify`` is a blocking ``sendto`` on a Unix datagram socket, and Linux lets
at most ``net.unix.max_dgram_qlen`` (10 by default) datagrams wait unread. A test that read
the socket only while it waited for one message left the watchdog pings piling up, and the
eleventh blocked the service's event loop: how soon depended on how long the test took
between two reads, i.e. on the machine's speed. This listener drains the socket on a thread
of its own, as systemd would, and a test waits on the messages it has collected.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["NotifyListener"]


class NotifyListener:
    """An abstract (or, given ``path``, filesystem) Unix datagram socket, drained continuously.

    Args:
        path: bind to this filesystem path instead of a fresh abstract address.
    """

    def __init__(self, path: str | None = None) -> None:
        self._abstract = path is None
        self._bind = f"\0ldp-test-{secrets.token_hex(8)}" if path is None else path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self._bind)
        self._sock.settimeout(0.2)  # so that close() is seen within 0.2 s
        self._cond = threading.Condition()
        self._messages: list[str] = []
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="notify-listener", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """The value for ``$NOTIFY_SOCKET`` (``@name`` for an abstract socket)."""
        return "@" + self._bind[1:] if self._abstract else self._bind

    def _drain(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._cond:
                self._messages.extend(line for line in data.decode("utf-8", "replace").split("\n") if line)
                self._cond.notify_all()

    def mark(self) -> int:
        """The number of messages so far: pass it to :meth:`wait_for` to wait for a newer one."""
        with self._cond:
            return len(self._messages)

    def wait_for(
        self,
        message: str,
        *,
        since: int = 0,
        timeout: float,
        alive: Callable[[], bool] | None = None,
        what: str = "the service",
    ) -> None:
        """Wait until ``message`` has arrived (at or after index ``since``).

        Raises:
            TimeoutError: after ``timeout`` seconds (a hang guard).
            RuntimeError: ``alive()`` turned false first (the service exited).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while message not in self._messages[since:]:
                if alive is not None and not alive():
                    raise RuntimeError(f"{what} exited before sending {message!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{what} did not send {message!r}; got {self._messages[since:][-10:]}")
                self._cond.wait(min(remaining, 0.5))

    def close(self) -> None:
        """Stop reading and release the socket."""
        self._closed = True
        self._thread.join(timeout=5)
        self._sock.close()
