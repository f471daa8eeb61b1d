"""Connections the HTTP API cannot accept (no file descriptor left) are logged once per interval
with a count, not once per retry; every other loop error still reaches the handler before."""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

import pytest

from collector.http import AcceptErrorLog

_HTTP = logging.getLogger("collector.http")


def _handler(loop: asyncio.AbstractEventLoop, **kwargs: Any) -> AcceptErrorLog:
    """The handler as the HTTP API installs it."""
    return AcceptErrorLog(loop, logger=_HTTP, server="HTTP API", unit="deploy/ldp-collector.service", **kwargs)


_CONTEXT = {
    "message": "socket.accept() out of system resource",
    "exception": OSError(errno.EMFILE, "Too many open files"),
}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "collector.http"]


def test_a_flood_of_accept_failures_is_one_line_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    """900 failures in one interval: one line at the first, one with the count after, one at the end."""
    loop = asyncio.new_event_loop()
    clock = _Clock()
    handler = _handler(loop, interval=60.0, clock=clock)
    handler.install()
    try:
        with caplog.at_level(logging.ERROR, logger="collector.http"):
            for _ in range(900):
                loop.call_exception_handler(dict(_CONTEXT))
            assert len(_lines(caplog)) == 1
            assert "1 connection(s) could not be accepted" in _lines(caplog)[0]
            assert "Too many open files" in _lines(caplog)[0]
            clock.now += 60.0
            loop.call_exception_handler(dict(_CONTEXT))
            assert len(_lines(caplog)) == 2
            assert "900 connection(s)" in _lines(caplog)[1]
            for _ in range(5):
                loop.call_exception_handler(dict(_CONTEXT))
            handler.uninstall()
            assert len(_lines(caplog)) == 3
            assert "5 connection(s)" in _lines(caplog)[2]
        assert loop.get_exception_handler() is None
    finally:
        loop.close()


def test_other_loop_errors_reach_the_handler_that_was_there() -> None:
    """The handler only takes accept failures; anything else goes to the previous handler."""
    loop = asyncio.new_event_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    handler = _handler(loop)
    handler.install()
    try:
        loop.call_exception_handler({"message": "something else"})
        assert [c["message"] for c in seen] == ["something else"]
        handler.uninstall()
        assert loop.get_exception_handler() is not handler
    finally:
        loop.close()


def test_the_accept_retry_that_fires_after_the_server_closed_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """Closed after a failure: asyncio's retry timer failing on the closed socket is no error; then the handler goes."""
    loop = asyncio.new_event_loop()
    handler = _handler(loop)
    handler.install()
    try:
        with caplog.at_level(logging.DEBUG):
            loop.call_exception_handler(dict(_CONTEXT))
            handler.uninstall(linger=0.01)
            assert loop.get_exception_handler() is handler  # the retry timer may still fire
            loop.call_exception_handler(
                {
                    "message": "Exception in callback BaseSelectorEventLoop._start_serving(...)",
                    "exception": ValueError("Invalid file descriptor: -1"),
                }
            )
            deadline = loop.time() + 30.0
            while loop.get_exception_handler() is handler:
                assert loop.time() < deadline, "the handler was never given back"
                loop.run_until_complete(asyncio.sleep(0))
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors  # the failure's own line (nothing held back), no traceback
        assert not any(r.exc_info for r in caplog.records)
    finally:
        loop.close()
