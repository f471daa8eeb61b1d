"""The local API: one JSON request per line over a Unix socket, and its dispatcher.

Requests (one per connection, at most 64 KiB)::

    {"op": "record", "use_case": "emoji", "value": "😀"}             # typed JSON value
    {"op": "record", "use_case": "app-seconds", "value": 30, "key": "firefox"}
    {"op": "record", "use_case": "dark-mode", "text": "true"}         # text, coerced by use case
    {"op": "consent", "action": "grant" | "revoke" | "show"}
    {"op": "status"}
    {"op": "ledger"}

A ``record`` reply says what happened: ``outcome`` (``recorded``, ``duplicate``, ``dropped``);
``counter`` (true: the value joined the period's running total, sent once when the period
ends); ``offered`` (values recorded this period, for event-level use cases), ``limit`` (the
daily record limit) and ``over_limit`` (how many of them the limit drops); ``note`` (a counter
value beyond its mechanism's range, and the clamping that applies).

docs/agent-api.md describes every operation, its fields, its replies and the error kinds.
Replies are ``{"ok": true, ...}`` or ``{"ok": false, "error": <kind>, "message": <text>}`` with
kind one of ``bad-request``, ``unknown-use-case``, ``value-refused``, ``consent-required``,
``use-case-stopped``, ``use-case-expired`` (past its end date), ``state-unreadable``,
``state-unwritable`` (a full disk: recording pauses and resumes by itself), ``busy``. The same
dispatcher serves the CLI when no daemon runs, so both paths behave identically. Access is
controlled by the socket's file mode.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from agent.core import Agent
from agent.errors import (
    ConsentRequiredError,
    ConsentUnreadableError,
    StateUnreadableError,
    StateWriteError,
    UseCaseExpiredError,
    UseCaseStoppedError,
    ValueRefusedError,
)
from agent.mechanism_calls import coerce_text
from agent.state import LedgerEntry
from protocol.plain import Json, JsonObject, Plain
from runtime.accept_errors import AcceptErrorLog

if TYPE_CHECKING:
    import asyncio

__all__ = ["MAX_REQUEST_BYTES", "handle_request", "ledger_json", "serve"]

log = logging.getLogger("ldp_agent.api")

MAX_REQUEST_BYTES = 64 * 1024
"""Longest request line accepted."""

MAX_CONNECTIONS = 32
"""Requests served at once; beyond it a request is answered ``busy`` (and counted)."""

REQUEST_TIMEOUT = 10.0
"""Seconds a client has to send its request line."""


def _json(value: Plain) -> Json:
    """JSON-ready: bytes as hex, map keys as strings."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    return value


def ledger_json(entries: list[LedgerEntry]) -> list[Json]:
    """Ledger entries as JSON objects (bytes as hex)."""
    return [_json(e.to_plain()) for e in entries]


def _error(kind: str, message: str) -> JsonObject:
    return {"ok": False, "error": kind, "message": message}


Request: TypeAlias = Mapping[str, Json]
"""A decoded request: a JSON object, whose fields each handler checks."""


def _record(agent: Agent, request: Request, on_change: Callable[[], None] | None) -> JsonObject:
    name = request.get("use_case")
    if not isinstance(name, str):
        return _error("bad-request", 'record needs a string "use_case"')
    key = request.get("key")
    if key is not None and not isinstance(key, str):
        return _error("bad-request", '"key" must be a string')
    use_case = agent.registry.use_cases.get(name)
    if use_case is None:
        # A name the registry does not have is a mistake in the request, not a value refused.
        known = ", ".join(agent.registry.use_cases)
        return _error("unknown-use-case", f"unknown use case {name!r}; the registry has: {known}")
    if "text" in request:
        text = request["text"]
        if not isinstance(text, str):
            return _error("bad-request", '"text" must be a string')
        value: object = coerce_text(use_case, text)
    elif "value" in request:
        value = request["value"]
    else:
        return _error("bad-request", 'record needs "value" or "text"')
    outcome = agent.record(name, value, key=key)
    return {
        "ok": True,
        "outcome": outcome.outcome,
        "counter": outcome.counter,
        "offered": outcome.offered,
        "limit": outcome.limit,
        "over_limit": outcome.over_limit,
        "note": outcome.note,
    }


def _consent(agent: Agent, request: Request, on_change: Callable[[], None] | None) -> JsonObject:
    action = request.get("action")
    if action == "grant":
        doc = agent.grant_consent()
        if on_change:
            on_change()
        return {"ok": True, "consent": True, "granted_at": doc.granted_at}
    if action == "revoke":
        removed = agent.revoke_consent()
        if on_change:
            on_change()
        return {"ok": True, "consent": False, "files_removed": removed}
    if action == "show":
        c = agent.consent
        return {"ok": True, "consent": c is not None, "granted_at": None if c is None else c.granted_at}
    return _error("bad-request", 'consent "action" is one of grant, revoke, show')


def _status(agent: Agent, request: Request, on_change: Callable[[], None] | None) -> JsonObject:
    if agent.consent_broken is not None:
        # Without this, a key that does not open the state shows as "consent: not granted".
        return _error("state-unreadable", _state_key_message(agent))
    return {"ok": True, "status": agent.status().to_json()}


def _state_key_message(agent: Agent) -> str:
    return (
        f"state unreadable: the state key does not open the state in {agent.state_dir} (consent record: "
        f"{agent.consent_broken}): use the key it was written with (key_file or the systemd credential), "
        "or revoke consent to delete the state and start over"
    )


def _ledger(agent: Agent, request: Request, on_change: Callable[[], None] | None) -> JsonObject:
    notices = [_json(n.to_plain()) for n in agent.notices()]
    return {"ok": True, "ledger": ledger_json(agent.ledger()), "notices": notices}


_OPS: dict[str, Callable[[Agent, Request, Callable[[], None] | None], JsonObject]] = {
    "record": _record,
    "consent": _consent,
    "status": _status,
    "ledger": _ledger,
}

# The agent's refusals a request may meet, each with the "error" kind its reply names;
# any other exception is a fault of the agent, not of the request, and propagates.
_REFUSAL_KINDS: tuple[tuple[type[Exception], str], ...] = (
    # Before its base class: a consent record the key does not open is unreadable state, not
    # a missing opt-in (runtime/exit_status.py: 6, not 4).
    (ConsentUnreadableError, "state-unreadable"),
    (ValueRefusedError, "value-refused"),
    (ConsentRequiredError, "consent-required"),
    # Before its base class: past its end date is a stop a registry renews (agent/expiry.py).
    (UseCaseExpiredError, "use-case-expired"),
    (UseCaseStoppedError, "use-case-stopped"),
    (StateUnreadableError, "state-unreadable"),
    (StateWriteError, "state-unwritable"),
)
_REFUSALS = tuple(t for t, _ in _REFUSAL_KINDS)


BrokerUse: TypeAlias = Callable[[], tuple[tuple[str, ...], str | None]]
"""The brokers in the device's order and the one in use (None: no connection open), for ``status``."""


def handle_request(
    agent: Agent,
    request: object,
    *,
    on_change: Callable[[], None] | None = None,
    brokers: BrokerUse | None = None,
) -> JsonObject:
    """Serve one decoded request; never raises for a bad request.

    Args:
        agent: the agent.
        request: the decoded JSON request.
        on_change: called after a change that may concern the daemon (consent).
        brokers: what ``status`` says about the brokers (the daemon's publisher).
    """
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        return _error("bad-request", 'expected a JSON object with a string "op"')
    op = request["op"]
    handler = _OPS.get(op)
    if handler is None:
        return _error("bad-request", f"unknown op {op!r}; the operations are: {', '.join(_OPS)} (docs/agent-api.md)")
    try:
        reply = handler(agent, request, on_change)
        status = reply.get("status")
        if brokers is not None and isinstance(status, dict):
            order, in_use = brokers()
            status.update(brokers=list(order), broker_in_use=in_use)
        return reply
    except _REFUSALS as e:
        return _error(next(kind for t, kind in _REFUSAL_KINDS if isinstance(e, t)), str(e))


@contextlib.asynccontextmanager
async def serve(
    agent: Agent,
    path: Path,
    *,
    mode: int = 0o660,
    on_change: Callable[[], None] | None = None,
    brokers: BrokerUse | None = None,
) -> AsyncIterator[asyncio.Server]:
    """Serve the API on a Unix socket for the duration of the block.

    The caller must hold the state directory lock: a leftover socket file is removed.
    """
    # Only the daemon serves: a command that answers without one never loads asyncio.
    import asyncio  # noqa: PLC0415

    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    refused = 0

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal refused
        try:
            if slots.locked():
                refused += 1
                log.warning("API busy: request refused (%d so far)", refused)
                reply = _error("busy", "too many requests at once; retry")
            else:
                async with slots:
                    reply = await _serve_one(reader)
            writer.write(json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n")
            await writer.drain()
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(reader: asyncio.StreamReader) -> JsonObject:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=REQUEST_TIMEOUT)
        except ValueError:  # longer than the reader's limit
            return _error("bad-request", f"request longer than {MAX_REQUEST_BYTES} bytes")
        try:
            request = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return _error("bad-request", "the request is not one line of JSON")
        return handle_request(agent, request, on_change=on_change, brokers=brokers)

    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = await asyncio.start_unix_server(on_client, path=str(path), limit=MAX_REQUEST_BYTES)
    os.chmod(path, mode)
    # Out of descriptors (a flood of clients holding connections): asyncio's failed accepts are
    # one line a minute, not one traceback a second (runtime/accept_errors.py).
    accept_errors = AcceptErrorLog(
        asyncio.get_running_loop(), logger=log, server="agent API", unit="deploy/ldp-agent.service"
    )
    accept_errors.install()
    try:
        yield server
    finally:
        server.close()
        accept_errors.uninstall(linger=2.0)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
