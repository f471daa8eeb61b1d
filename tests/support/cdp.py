"""A small Chrome DevTools Protocol client, for tests that drive a real page in headless Chromium.

``--dump-dom`` only shows a page as it loads; a test that acts on the page as a user does
(choosing an option, clicking) needs the browser's debugging socket. This module starts
Chromium with that socket on loopback, connects to it with aiohttp's websocket client (no
other dependency), opens a page, and sends commands by id, awaiting each reply. Every wait has
a deadline, and the browser's whole process group is killed on every way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["CdpError", "CdpPage", "open_page", "start_chromium"]

# The flags of the suite's other headless runs (tests/collector/test_dashboard.py), without
# --virtual-time-budget: a page driven over the protocol runs in real time.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


class CdpError(RuntimeError):
    """The browser answered a command with an error, or a script threw."""


async def _debugger_url(proc: asyncio.subprocess.Process, profile: Path, log: Path, timeout: float) -> str:
    """The browser's websocket address, from the DevToolsActivePort file Chromium writes in its
    profile once the socket listens (polled with a deadline; stderr goes to ``log``)."""
    active = profile / "DevToolsActivePort"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if active.exists():
            lines = active.read_text().splitlines()
            if len(lines) >= 2 and lines[0].isdigit():
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        if proc.returncode is not None:
            raise CdpError(f"chromium exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        if loop.time() > deadline:
            raise CdpError(f"no DevTools socket within {timeout} s: {log.read_text(errors='replace')[-2000:]}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def start_chromium(executable: str, profile: Path, *, timeout: float = 60.0) -> AsyncIterator[str]:
    """Run headless Chromium with its debugging socket on loopback; yield the socket's address.

    The browser runs in a session (process group) of its own, killed on leaving, however the
    block is left; its stderr is kept in ``profile``'s sibling ``<profile>.log``.
    """
    profile.mkdir(parents=True, exist_ok=True)
    log = profile.with_name(profile.name + ".log")
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            executable,
            *CHROMIUM_FLAGS,
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        yield await _debugger_url(proc, profile, log, timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 30)


class CdpPage:
    """One page target over the browser's socket: commands by id, each reply awaited."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str | None = None) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())
        self.session_id = session_id

    async def _read(self) -> None:
        """Hand every reply to the command that waits for it (events are not needed here)."""
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(message.data)
                future = self._waiting.pop(data.get("id", -1), None)
                if future is not None and not future.done():
                    future.set_result(data)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(CdpError("the DevTools socket closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0) -> dict[str, Any]:
        """Send one command (to this page's session once attached) and return its result."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        command: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if self.session_id is not None:
            command["sessionId"] = self.session_id
        await self._ws.send_str(json.dumps(command))
        try:
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(ident, None)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def evaluate(self, expression: str, *, timeout: float = 30.0) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(f"{expression[:200]}: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float = 60.0, interval: float = 0.05) -> Any:
        """Poll an expression until it is truthy and return its value; past the deadline, fail
        with the expression's last value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() > deadline:
                raise CdpError(f"still {value!r} after {timeout} s: {expression[:200]}")
            await asyncio.sleep(interval)

    async def navigate(self, url: str, *, timeout: float = 60.0) -> None:
        """Load ``url`` in this page (what the page does next is for the caller to wait on)."""
        result = await self.send("Page.navigate", {"url": url}, timeout=timeout)
        if result.get("errorText"):
            raise CdpError(f"{url}: {result['errorText']}")

    async def close(self) -> None:
        """Stop reading (the socket is closed by :func:`open_page`)."""
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


@contextlib.asynccontextmanager
async def open_page(browser_url: str, *, timeout: float = 30.0) -> AsyncIterator[CdpPage]:
    """A new blank page of the browser at ``browser_url``, attached (flattened session)."""
    async with aiohttp.ClientSession() as http:
        ws = await asyncio.wait_for(http.ws_connect(browser_url, max_msg_size=0), timeout)
        async with ws, _attached(ws, timeout) as page:
            yield page


@contextlib.asynccontextmanager
async def _attached(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> AsyncIterator[CdpPage]:
    """A new blank page on the browser's socket ``ws``, with its session attached."""
    page = CdpPage(ws)
    try:
        target = await page.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
        attached = await page.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, timeout=timeout
        )
        page.session_id = attached["sessionId"]
        await page.send("Page.enable", timeout=timeout)
        yield page
    finally:
        await page.close()
