"""The Unix-socket API: records, consent, status and ledger; malformed requests get a reason, never a crash."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.api import MAX_REQUEST_BYTES, handle_request, serve
from agent.core import Agent


def test_requests_over_the_socket(make_agent: Callable[..., Agent], tmp_path: Path) -> None:
    """Record, consent and status work over the socket; the socket file gets the configured mode."""
    agent = make_agent()
    sock = tmp_path / "run" / "agent.sock"

    async def main() -> list[dict[str, Any]]:
        replies = []
        async with serve(agent, sock, mode=0o600):
            assert sock.stat().st_mode & 0o777 == 0o600
            for request in (
                {"op": "record", "use_case": "flag", "value": 1},
                {"op": "consent", "action": "grant"},
                {"op": "record", "use_case": "flag", "value": True},
                {"op": "record", "use_case": "seconds", "text": "60", "key": "editor"},
                {"op": "record", "use_case": "procs", "value": "bash"},
                {"op": "record", "use_case": "procs", "value": "bash"},
                {"op": "status"},
            ):
                reader, writer = await asyncio.open_unix_connection(str(sock))
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                replies.append(json.loads(await reader.read()))
                writer.close()
                await writer.wait_closed()
        return replies

    replies = asyncio.run(main())
    assert replies[0] == {"ok": False, "error": "consent-required", "message": replies[0]["message"]}
    assert [r["ok"] for r in replies[1:]] == [True] * 6
    assert [r.get("outcome") for r in replies[2:6]] == ["recorded", "recorded", "recorded", "duplicate"]
    assert replies[6]["status"]["consent"] is True
    assert not sock.exists()


def test_malformed_requests_get_a_reason(make_agent: Callable[..., Agent]) -> None:
    """Every malformed request is answered bad-request (or value-refused) with a message."""
    agent = make_agent()
    agent.grant_consent()
    cases: list[tuple[object, str]] = [
        ("just a string", "bad-request"),
        ({"op": 3}, "bad-request"),
        ({"op": "fly"}, "bad-request"),
        ({"op": "record"}, "bad-request"),
        ({"op": "record", "use_case": "flag"}, "bad-request"),
        ({"op": "record", "use_case": "flag", "text": 1}, "bad-request"),
        ({"op": "record", "use_case": "flag", "value": 1, "key": 5}, "bad-request"),
        # A use case the registry lacks is a wrong request (exit status 2), not a value refused.
        ({"op": "record", "use_case": "nope", "text": "1"}, "unknown-use-case"),
        ({"op": "record", "use_case": "nope", "value": 1}, "unknown-use-case"),
        ({"op": "record", "use_case": "flag", "value": [1]}, "value-refused"),
        ({"op": "record", "use_case": "words", "value": {"a": 1}}, "value-refused"),
        ({"op": "record", "use_case": "procs", "value": None}, "value-refused"),
        ({"op": "consent", "action": "maybe"}, "bad-request"),
    ]
    for request, kind in cases:
        reply = handle_request(agent, request)
        assert reply["ok"] is False
        assert reply["error"] == kind, request
        assert reply["message"]


def test_an_unknown_op_is_answered_with_the_operations(make_agent: Callable[..., Agent]) -> None:
    """The reply names every operation and where they are described."""
    reply = handle_request(make_agent(), {"op": "fly"})
    assert reply["error"] == "bad-request"
    operations = "record, consent, status, ledger"
    assert reply["message"] == f"unknown op 'fly'; the operations are: {operations} (docs/agent-api.md)"


def test_garbage_and_oversize_lines(make_agent: Callable[..., Agent], tmp_path: Path) -> None:
    """A line that is not JSON, or longer than the limit, is refused; the server keeps serving."""
    agent = make_agent()
    sock = tmp_path / "agent.sock"

    async def main() -> list[dict[str, Any]]:
        out = []
        async with serve(agent, sock):
            for line in (b"{not json\n", b"x" * (MAX_REQUEST_BYTES + 10) + b"\n", b'{"op": "status"}\n'):
                reader, writer = await asyncio.open_unix_connection(str(sock))
                writer.write(line)
                await writer.drain()
                out.append(json.loads(await reader.read()))
                writer.close()
                await writer.wait_closed()
        return out

    bad_json, oversize, status = asyncio.run(main())
    assert bad_json["error"] == "bad-request"
    assert oversize["error"] == "bad-request"
    assert "longer than" in oversize["message"]
    assert status["ok"] is True
