"""A server whose process ran out of file descriptors: its failed accepts counted, one log line per interval.

When the process runs out of file descriptors (a flood of slow clients, each holding a
connection until its deadline), asyncio reports every failed ``accept()`` to the event loop's
exception handler, with a traceback, and listens again a second later: hundreds of identical
lines that bury the rest of the log. :class:`AcceptErrorLog`, installed as that handler while
a server runs, logs the first at once, then one line per :data:`ACCEPT_ERROR_INTERVAL_S` with
how many there were, and counts each in a :class:`~runtime.resources.ResourceErrors` when
given; every other report goes to the handler that was there before (or asyncio's default).
The collector's HTTP API and the agent's local API both install one (docs/deploy.md,
"Monitoring and the dashboard").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.resources import ResourceErrors, resource_shortage

if TYPE_CHECKING:
    import asyncio  # annotations only: the agent's offline commands import this module without asyncio

__all__ = ["ACCEPT_ERROR_INTERVAL_S", "AcceptErrorLog"]

ACCEPT_ERROR_INTERVAL_S = 60.0
"""At most one log line per this many seconds about connections that could not be accepted."""

_ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's context message (selector_events)


class AcceptErrorLog:
    """The event loop's exception handler while a server runs: accept failures counted, one line per interval.

    Args:
        loop: the server's event loop.
        logger: where the lines go.
        server: what the lines call the server (``"HTTP API"``).
        unit: the systemd unit whose ``LimitNOFILE=`` the lines point at.
        operation: the name the failures are counted under in ``resources``.
        resources: counts each failure (None: not counted).
        interval: at most one line per this many seconds.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        logger: logging.Logger,
        server: str,
        unit: str,
        operation: str = "accept",
        resources: ResourceErrors | None = None,
        interval: float = ACCEPT_ERROR_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._log = logger
        self._server = server
        self._unit = unit
        self._operation = operation
        self._resources = resources
        self._previous = loop.get_exception_handler()
        self.interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._held = 0
        self._last: object = None
        self._failed = False
        self._closed = False

    def install(self) -> None:
        """Become the loop's exception handler."""
        self._loop.set_exception_handler(self)

    def uninstall(self, *, linger: float = 0.0) -> None:
        """Give the handler back, logging the failures not yet reported.

        Args:
            linger: after an accept failure, stay this many seconds more (the server closing):
                asyncio's retry of a failed accept is a timer that the server's ``close`` does
                not cancel, and it then fails on the closed socket; that failure is expected
                and dropped instead of logged with a traceback.
        """
        if self._held:
            self._report()
        self._closed = True
        if linger > 0 and self._failed:
            self._loop.call_later(linger, self._give_back)
        else:
            self._give_back()

    def _give_back(self) -> None:
        if self._loop.get_exception_handler() is self:
            self._loop.set_exception_handler(self._previous)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if self._closed and "_start_serving" in message and isinstance(context.get("exception"), ValueError):
            self._log.debug("the retry of a failed accept found the server closed, as expected")
            return
        if message != _ACCEPT_FAILED:
            if self._previous is None:
                loop.default_exception_handler(context)
            else:
                self._previous(loop, context)
            return
        self._held += 1
        self._failed = True
        self._last = context.get("exception")
        if self._resources is not None:
            exc = self._last
            name = resource_shortage(exc) if isinstance(exc, BaseException) else None
            self._resources.shortage(self._operation, name or "other")
        if self._clock() >= self._next:
            self._report()

    def _report(self) -> None:
        self._log.error(
            "%s: %d connection(s) could not be accepted (%s); asyncio retries each second; at most one line per "
            "%g s. Raise the open-file limit (LimitNOFILE= in %s) or look for a client holding connections open",
            self._server,
            self._held,
            self._last,
            self.interval,
            self._unit,
        )
        self._held = 0
        self._next = self._clock() + self.interval
