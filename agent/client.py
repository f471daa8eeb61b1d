"""Record values from an application: a client of the agent's local API (docs/agent-api.md).

Standard library only, so an application imports it without the agent's own dependencies
(``tests/clients/test_python_client.py`` holds that line). Two forms with the same methods:
:class:`AgentClient` blocks, :class:`AsyncAgentClient` awaits::

    from agent.client import AgentClient, ValueRefusedError

    client = AgentClient()                       # $LDP_AGENT_SOCKET, else /run/ldp-agent/agent.sock
    reply = client.record("emoji", "😀")         # RecordReply(outcome=Outcome.RECORDED, ...)
    client.record("app-usage-seconds", 30, key="firefox")

Each ``error`` kind of the protocol is an exception of its own (:data:`ERRORS`), all
subclasses of :class:`RefusedError`; :class:`UseCaseExpiredError` is a
:class:`UseCaseStoppedError`. An agent that is not there (no socket, nothing listening, no
answer within the timeout) is :class:`AgentUnavailableError`; a reply that is not one line of
the protocol's JSON, or longer than :data:`MAX_REPLY_BYTES`, is :class:`ProtocolError`. A
``busy`` agent is asked again ``busy_retries`` times, waiting twice as long each time, before
:class:`BusyError` is raised.

``ldp-agent generate --language python REGISTRY`` writes one typed method per use case on top
of this module (``agent/codegen_python.py``).
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias

__all__ = [
    "DEFAULT_SOCKET",
    "ERRORS",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "SOCKET_VARIABLE",
    "AgentClient",
    "AgentUnavailableError",
    "AsyncAgentClient",
    "BadRequestError",
    "BusyError",
    "ClientError",
    "ConsentRequiredError",
    "Outcome",
    "ProtocolError",
    "RecordReply",
    "RefusedError",
    "StateUnreadableError",
    "StateUnwritableError",
    "UnknownUseCaseError",
    "UseCaseExpiredError",
    "UseCaseStoppedError",
    "Value",
    "ValueRefusedError",
    "socket_path",
]

DEFAULT_SOCKET: Final = Path("/run/ldp-agent/agent.sock")
"""Where a deployed agent listens (``[api] socket`` of deploy/agent.example.toml)."""

SOCKET_VARIABLE: Final = "LDP_AGENT_SOCKET"
"""The environment variable that names another socket."""

MAX_REQUEST_BYTES: Final = 64 * 1024
"""The longest request line the agent reads (``agent.api.MAX_REQUEST_BYTES``)."""

MAX_REPLY_BYTES: Final = 64 * 1024
"""The longest reply line this client reads: a ``record`` reply is a few hundred bytes."""

Value: TypeAlias = bool | int | float | str
"""A value to record: a number for a counter, a bool (or 0/1) for a flag, a string otherwise."""


class Outcome(enum.Enum):
    """What the agent did with a recorded value."""

    RECORDED = "recorded"
    """Kept: privatized now, or added to the period's running total."""
    DUPLICATE = "duplicate"
    """Not added: this string is already recorded this period (it is reported once)."""
    DROPPED = "dropped"
    """Not added: too many distinct strings this period."""


@dataclass(frozen=True, slots=True)
class RecordReply:
    """The agent's answer to a ``record`` (docs/agent-api.md, "record").

    Attributes:
        outcome: what happened to the value.
        counter: the value joined the period's running total, privatized and sent once when
            the period ends.
        offered: values recorded this period (event-level use cases).
        limit: the daily record limit.
        over_limit: how many of the offered values the limit drops (a random sample is sent).
        note: a counter value beyond its mechanism's range and the clamping that applies, or None.
    """

    outcome: Outcome
    counter: bool
    offered: int
    limit: int
    over_limit: int
    note: str | None


class ClientError(Exception):
    """Base of every error this client raises."""


class AgentUnavailableError(ClientError):
    """No agent answered: no socket, nothing listening on it, or no reply within the timeout."""


class ProtocolError(ClientError):
    """The reply is not what the protocol says: not one line of JSON, of the wrong shape, or too long."""


class RefusedError(ClientError):
    """The agent answered ``{"ok": false}``; a subclass per known ``error`` kind.

    Attributes:
        kind: the ``error`` kind as the agent sent it.
        message: the agent's sentence saying what is wrong.
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


class BadRequestError(RefusedError):
    """The request is malformed (a bug in the caller or in this client)."""


class UnknownUseCaseError(RefusedError):
    """The agent's registry has no such use case; the message lists those it has."""


class ValueRefusedError(RefusedError):
    """The value does not fit its use case (wrong type, out of range, outside the alphabet)."""


class ConsentRequiredError(RefusedError):
    """The device's user has not opted in: nothing is recorded or sent."""


class UseCaseStoppedError(RefusedError):
    """The use case stopped (its lifetime ε spent, its state files deleted or replaced)."""


class UseCaseExpiredError(UseCaseStoppedError):
    """The use case is past its end date; the message names the date and the owner."""


class StateUnreadableError(RefusedError):
    """The agent's sealed state cannot be opened (most often: not the key it was written with)."""


class StateUnwritableError(RefusedError):
    """The agent's state cannot be written (a full disk): the value was not kept; try later."""


class BusyError(RefusedError):
    """The agent served too many requests at once, every time it was asked."""


ERRORS: Final[Mapping[str, type[RefusedError]]] = {
    "bad-request": BadRequestError,
    "unknown-use-case": UnknownUseCaseError,
    "value-refused": ValueRefusedError,
    "consent-required": ConsentRequiredError,
    "use-case-stopped": UseCaseStoppedError,
    "use-case-expired": UseCaseExpiredError,
    "state-unreadable": StateUnreadableError,
    "state-unwritable": StateUnwritableError,
    "busy": BusyError,
}
"""The exception of each ``error`` kind; a kind not listed (a newer agent's) raises :class:`RefusedError`."""


def socket_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$LDP_AGENT_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get(SOCKET_VARIABLE) or DEFAULT_SOCKET)


def _request(use_case: str, field: str, value: Value, key: str | None) -> bytes:
    """The request line; ``TypeError``/``ValueError`` for arguments no agent could take."""
    if not isinstance(use_case, str):
        raise TypeError(f"use_case is a string; got {type(use_case).__name__}")
    if not isinstance(value, bool | int | float | str):
        raise TypeError(f"a value is a bool, an int, a float or a str; got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a value must be finite (JSON has no {value!r})")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key is a string; got {type(key).__name__}")
    request: dict[str, Value] = {"op": "record", "use_case": use_case, field: value}
    if key is not None:
        request["key"] = key
    line = json.dumps(request, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
    if len(line) > MAX_REQUEST_BYTES:
        raise ValueError(f"the request is {len(line):,} bytes, over the agent's {MAX_REQUEST_BYTES:,}")
    return line


def _integer(reply: Mapping[str, object], name: str) -> int:
    value = reply.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"the reply's {name!r} is not an integer: {value!r}")
    return value


def _reply(data: bytes) -> RecordReply:
    """A reply line read into its outcome; the refusal it carries raised as its exception."""
    if not data:
        raise ProtocolError("the agent closed the connection without a reply")
    try:
        reply = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"the reply is not JSON: {data[:80]!r}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ProtocolError(f'the reply is not an object with a boolean "ok": {data[:80]!r}')
    if not reply["ok"]:
        kind, message = reply.get("error"), reply.get("message")
        if not isinstance(kind, str) or not isinstance(message, str):
            raise ProtocolError(f'a refusal without a string "error" and "message": {data[:80]!r}')
        raise ERRORS.get(kind, RefusedError)(kind, message)
    try:
        outcome = Outcome(reply.get("outcome"))
    except ValueError:
        raise ProtocolError(f"the reply's outcome is not one of recorded, duplicate, dropped: {data[:80]!r}") from None
    counter, note = reply.get("counter"), reply.get("note")
    if not isinstance(counter, bool):
        raise ProtocolError(f"the reply's 'counter' is not a boolean: {counter!r}")
    if note is not None and not isinstance(note, str):
        raise ProtocolError(f"the reply's 'note' is not a string: {note!r}")
    return RecordReply(
        outcome=outcome,
        counter=counter,
        offered=_integer(reply, "offered"),
        limit=_integer(reply, "limit"),
        over_limit=_integer(reply, "over_limit"),
        note=note or None,
    )


def _line(buffer: bytearray, chunk: bytes) -> bytes | None:
    """Add ``chunk`` to what was read; the reply line once it is whole (None: read on).

    Raises:
        ProtocolError: the reply is longer than :data:`MAX_REPLY_BYTES`.
    """
    buffer += chunk
    end = buffer.find(b"\n")
    if end > MAX_REPLY_BYTES or (end < 0 and len(buffer) > MAX_REPLY_BYTES):
        raise ProtocolError(f"the reply is longer than {MAX_REPLY_BYTES:,} bytes")
    if end >= 0:
        return bytes(buffer[:end])
    return None if chunk else bytes(buffer)


def _received(recv: Callable[[int], bytes], size: int) -> bytes:
    """``recv(size)``, a reset read as the end of the reply.

    An agent may answer before it reads the request (``busy`` does) and close the connection
    with the request unread: the send then fails, and the reply is still there to read, followed
    by a reset rather than an end of file. So a failed send is not an error (the clients read on),
    and a reset after the reply ends it as an end of file would.
    """
    try:
        return recv(size)
    except ConnectionResetError:
        return b""


def _silent(path: Path, timeout: float) -> AgentUnavailableError:
    return AgentUnavailableError(f"the agent on {path} did not answer within {timeout:g} s")


class _Settings:
    """Where the agent's socket is and how long and how often a client asks (both clients' arguments).

    Args:
        path: the agent's socket (default: :func:`socket_path`).
        timeout: seconds to connect and to get the reply.
        busy_retries: how many times a ``busy`` agent is asked again before :class:`BusyError`.
        busy_backoff: seconds before the first retry; each next one waits twice as long.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 10.0,
        busy_retries: int = 3,
        busy_backoff: float = 0.05,
    ) -> None:
        self.path = socket_path(path)
        self.timeout = timeout
        self.busy_retries = busy_retries
        self.busy_backoff = busy_backoff


class AgentClient(_Settings):
    """Records values through the agent's socket, blocking (one connection per request).

    Args:
        path: the agent's socket (default: :func:`socket_path`).
        timeout: seconds to connect and to get the reply.
        busy_retries: how many times a ``busy`` agent is asked again before :class:`BusyError`.
        busy_backoff: seconds before the first retry; each next one waits twice as long.
    """

    def record(self, use_case: str, value: Value, *, key: str | None = None) -> RecordReply:
        """Record ``value`` for ``use_case`` (``key``: a counter's key, such as an application).

        Raises:
            RefusedError: the agent refused it (a subclass names why).
            AgentUnavailableError, ProtocolError: no agent, or not the protocol's reply.
        """
        return self._exchange(_request(use_case, "value", value, key))

    def record_text(self, use_case: str, text: str, *, key: str | None = None) -> RecordReply:
        """Record a value given as text, read by the use case's kind (as ``ldp-agent record`` does)."""
        return self._exchange(_request(use_case, "text", text, key))

    def _exchange(self, request: bytes) -> RecordReply:
        for attempt in range(self.busy_retries + 1):
            try:
                return _reply(self._once(request))
            except BusyError:
                if attempt == self.busy_retries:
                    raise
                time.sleep(self.busy_backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _once(self, request: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.path))
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise AgentUnavailableError(f"no agent listens on {self.path}: {e.strerror or e}") from None
            deadline = time.monotonic() + self.timeout
            try:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    sock.sendall(request)  # a busy agent may answer unread: _received
                buffer = bytearray()
                while True:
                    # One deadline for the whole reply, however it is cut up.
                    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                    if (line := _line(buffer, _received(sock.recv, 16_384))) is not None:
                        break
            except TimeoutError:
                raise _silent(self.path, self.timeout) from None
            return line


class AsyncAgentClient(_Settings):
    """Records values through the agent's socket from asyncio code; the same arguments as :class:`AgentClient`."""

    async def record(self, use_case: str, value: Value, *, key: str | None = None) -> RecordReply:
        """As :meth:`AgentClient.record`."""
        return await self._exchange(_request(use_case, "value", value, key))

    async def record_text(self, use_case: str, text: str, *, key: str | None = None) -> RecordReply:
        """As :meth:`AgentClient.record_text`."""
        return await self._exchange(_request(use_case, "text", text, key))

    async def _exchange(self, request: bytes) -> RecordReply:
        # Imported where it is used: asyncio doubles what importing this module costs a program
        # that only blocks (benchmarks/bench_clients.py, "import").
        import asyncio  # noqa: PLC0415

        for attempt in range(self.busy_retries + 1):
            try:
                return _reply(await self._once(request))
            except BusyError:
                if attempt == self.busy_retries:
                    raise
                await asyncio.sleep(self.busy_backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _once(self, request: bytes) -> bytes:
        # The loop's socket calls rather than streams: a stream that meets a reset raises before
        # it hands over what arrived first, and the reply may be just that (_received).
        import asyncio  # noqa: PLC0415 - as in _exchange

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.setblocking(False)
                    try:
                        await loop.sock_connect(sock, str(self.path))
                    except (FileNotFoundError, ConnectionRefusedError) as e:
                        raise AgentUnavailableError(f"no agent listens on {self.path}: {e.strerror or e}") from None
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        await loop.sock_sendall(sock, request)
                    buffer = bytearray()
                    while True:
                        try:
                            chunk = await loop.sock_recv(sock, 16_384)
                        except ConnectionResetError:  # as _received
                            chunk = b""
                        if (line := _line(buffer, chunk)) is not None:
                            return line
        except TimeoutError:
            raise _silent(self.path, self.timeout) from None
