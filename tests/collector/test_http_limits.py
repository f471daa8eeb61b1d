"""The HTTP API against hostile and broken clients: every refusal has the right status and a
JSON body that leaks nothing (no exception class, message or traceback), and no client can
hold a connection open without sending a request.
(/healthz's 503 while the store cannot commit is in test_store_failures.py.)"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from collector.config import parse_config
from collector.http import HttpApi
from collector.store import CheckpointStore
from protocol.registry import Period, Registry
from tests.collector.support import run_async

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@asynccontextmanager
async def _serving(tmp_path: Path, registry: Registry, registry_path: Path, **kwargs: Any) -> AsyncIterator[HttpApi]:
    CheckpointStore(tmp_path / "h.sqlite3", registry, instance="h").close()
    config = parse_config(
        {
            "registry": str(registry_path),
            "store": {"path": str(tmp_path / "h.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
            "estimation": {"workers": 0},
        }
    )
    api = HttpApi(config, **kwargs)
    await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        yield api
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def _request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def _refused(port: int, raw: bytes) -> int:
    """The status of the answer to an oversize request, or 0 if the connection was reset.

    The server answers after reading past its limit and then closes with the rest unread;
    the kernel may turn that close into a reset that overtakes the answer.
    """
    try:
        answer = await _request(port, raw)
    except ConnectionError:
        return 0
    assert not _leaks(answer), answer[:300]
    return _answer(answer)[0]


def _answer(raw: bytes) -> tuple[int, dict[str, Any]]:
    """The status and the JSON body of a raw response."""
    match = _STATUS.match(raw)
    assert match, raw[:200]
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(match[1]), json.loads(body)


def _leaks(body: bytes) -> list[str]:
    """What in a response body would reveal the server's insides."""
    text = body.decode("latin-1")
    words = ("Traceback", "Error:", "KeyError", "Exception", "aiohttp", "sqlite3", 'File "', "secret-internal")
    return [w for w in words if w in text]


@run_async
async def test_bad_period_is_400_and_an_oversize_head_is_431(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """?period=99999999999999999999999 and negative periods give 400 naming the range; a 20 KiB head gives 431."""
    async with _serving(tmp_path, registry, registry_path) as api:
        top = max(p.max_index for p in Period)
        for period in ("99999999999999999999999", "-1", str(top + 1)):
            answer = await _request(
                api.port, f"GET /api/v1/use-cases/usage/estimate?period={period} HTTP/1.1\r\nHost: h\r\n\r\n".encode()
            )
            status, body = _answer(answer)
            assert status == 400, answer[:200]
            assert f"[0, {top}]" in body["error"]
        big = b"GET / HTTP/1.1\r\nHost: h\r\nX-Filler: " + b"a" * (20 * 1024) + b"\r\n\r\n"
        answer = await _request(api.port, big)
        assert re.match(rb"HTTP/1\.[01] 431 Request Header Fields Too Large\r\n", answer), answer[:200]
        assert b"aaaa" not in answer  # the input is not echoed back
        ok = await _request(api.port, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")


@run_async
async def test_huge_request_lines_and_too_many_headers_are_refused(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """A 64 KiB URL and 200 header fields are 431; 1 MiB of header lines is refused; the server stays up."""
    async with _serving(tmp_path, registry, registry_path) as api:
        assert await _refused(api.port, b"GET /" + b"x" * 65536 + b" HTTP/1.1\r\nHost: h\r\n\r\n") in (0, 431)
        many = b"".join(b"X-%d: y\r\n" % i for i in range(200))
        status, body = _answer(await _request(api.port, b"GET / HTTP/1.1\r\nHost: h\r\n" + many + b"\r\n"))
        assert status == 431, body
        assert body == {"error": "a request may carry at most 32 header fields"}
        flood = b"".join(b"X-%d: %s\r\n" % (i, b"z" * 8000) for i in range(128))
        assert await _refused(api.port, b"GET / HTTP/1.1\r\nHost: h\r\n" + flood + b"\r\n") in (0, 431)
        assert (await _request(api.port, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")).startswith(b"HTTP/1.1 200")


@run_async
async def test_a_slow_or_silent_client_is_disconnected_and_others_are_served(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """A client that trickles its head and one that sends nothing are cut off; others are served meanwhile."""
    async with _serving(tmp_path, registry, registry_path, head_timeout=1.0) as api:
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", api.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: h\r\n")
        trickled = 0
        closed = False
        deadline = time.monotonic() + 120  # generous: the server's deadline is 1 s
        try:
            while time.monotonic() < deadline:
                if trickled == 2:
                    ok = await _request(api.port, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
                    assert ok.startswith(b"HTTP/1.1 200")
                try:
                    writer.write(b"X-Slow: " if trickled % 2 == 0 else b"y\r\n")
                    await writer.drain()
                except ConnectionError:
                    closed = True
                    break
                trickled += 1
                try:
                    got = await asyncio.wait_for(reader.read(1024), 0.2)
                except TimeoutError:
                    continue
                except ConnectionError:
                    closed = True
                    break
                assert got == b"", got  # no response to a head that never ended: only the close
                closed = True
                break
            assert closed, f"still connected after {trickled} trickles"
            assert await asyncio.wait_for(silent_reader.read(), 120) == b""
        finally:
            writer.close()
            silent_writer.close()


@run_async
async def test_methods_other_than_get_and_head_are_405_without_reading_a_body(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Methods but GET/HEAD get 405 with Allow, an invented one 400; an upload is not read; HEAD has no body."""
    async with _serving(tmp_path, registry, registry_path) as api:
        # llhttp knows the registered methods only: an invented one is a malformed request.
        status, body = _answer(await _request(api.port, b"BREW /pot HTTP/1.1\r\nHost: h\r\n\r\n"))
        assert (status, body) == (400, {"error": "malformed HTTP/1.1 request"})
        for method in (b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"PROPFIND"):
            for path in (b"/", b"/api/v1/status", b"/nowhere"):
                answer = await _request(api.port, method + b" " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
                status, body = _answer(answer)
                assert status == 405, (method, path, body)
                assert b"allow: get, head" in answer.lower()
        # A declared 10 MiB body: answered at once, the body never read or waited for.
        answer = await _request(
            api.port, b"POST /api/v1/status HTTP/1.1\r\nHost: h\r\nContent-Length: 10485760\r\n\r\n" + b"x" * 4096
        )
        assert _answer(answer)[0] == 405
        status, body = _answer(await _request(api.port, b"GET /api/v1/status/ HTTP/1.1\r\nHost: h\r\n\r\n"))
        assert (status, body) == (308, {"location": "/api/v1/status"})
        head = await _request(api.port, b"HEAD /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert head.endswith(b"\r\n\r\n")  # the head only


@run_async
async def test_path_traversal_finds_nothing(tmp_path: Path, registry: Registry, registry_path: Path) -> None:
    """Dot-dot paths, encoded or not, are 404 (or 400) with a JSON error: no route reads a file."""
    async with _serving(tmp_path, registry, registry_path) as api:
        for path in (
            b"/../../../../etc/passwd",
            b"/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            b"/api/v1/use-cases/..%2f..%2f..%2fetc%2fpasswd/estimate",
            b"/api/v1/use-cases/../../../../etc/passwd",
            b"/api/v1/use-cases/usage/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
            b"//etc/passwd",
            b"/api/v1/use-cases/%00/estimate",
            b"/static/..%5c..%5cwindows%5cwin.ini",
        ):
            answer = await _request(api.port, b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
            match = _STATUS.match(answer)
            assert match, answer[:300]
            assert int(match[1]) in (400, 404), (path, answer[:300])
            assert b"root:" not in answer
            assert not _leaks(answer.partition(b"\r\n\r\n")[2]), (path, answer)


@run_async
async def test_internal_errors_are_500_with_a_generic_message_and_a_log_line(
    tmp_path: Path, registry: Registry, registry_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An internal KeyError is a 500 (not a 404) whose body names no exception; the traceback goes to the log."""
    async with _serving(tmp_path, registry, registry_path) as api:

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise KeyError("secret-internal")

        async def crashing(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("secret-internal /var/lib/ldp-collector/collector.sqlite3")

        api.live.estimate = broken  # type: ignore[method-assign]
        api.live.series = crashing  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="collector.http"):
            for path, fault in (
                (b"/api/v1/use-cases/usage/estimate", "KeyError"),
                (b"/api/v1/use-cases/usage/series", "RuntimeError"),
            ):
                answer = await _request(api.port, b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
                status, body = _answer(answer)
                assert status == 500, body
                assert not _leaks(answer.partition(b"\r\n\r\n")[2]), answer
                assert "log" in body["error"]
                failed = [r.exc_info[0].__name__ for r in caplog.records if r.exc_info and r.exc_info[0]]
                assert failed[-1:] == [fault]
        # An unknown use case is still 404, decided by the registry.
        status, body = _answer(
            await _request(api.port, b"GET /api/v1/use-cases/nope/estimate HTTP/1.1\r\nHost: h\r\n\r\n")
        )
        assert status == 404
        assert body["error"].startswith("unknown use case or definition 'nope'; the use cases are ")
