"""The C client (clients/c/), built with every warning an error, against a real agent daemon: one value
of each kind with its outcome read back, busy, unknown use cases, refused values, an expired use case;
and against a fake agent's malformed, oversized or missing replies (under the sanitizers, where the
compiler has them)."""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from protocol.registry import parse_registry
from tests.clients.cbuild import CBuild, build
from tests.clients.conftest import (
    FLEET_REGISTRY,
    FakeAgent,
    RunningAgent,
    agent_daemon,
    held_connections,
    wait_until_busy,
)

REGISTRY = parse_registry(FLEET_REGISTRY.read_bytes(), source=str(FLEET_REGISTRY))
FakeAgents = Callable[[Sequence[bytes | None]], FakeAgent]

# One value of each kind, as the driver takes it: (type, use case, value, key).
EACH_KIND = [
    ("bool", "dark-mode-enabled", "true", "-"),
    ("int", "app-usage-seconds", "1800", "firefox"),
    ("double", "app-usage-histogram", "1234.5", "-"),
    ("string", "emoji", "😀", "-"),
    ("string", "safari-energy-domains", "example.com", "-"),
    ("string", "default-browser", "firefox", "-"),
    ("text", "dark-mode-enabled", "false", "-"),  # a second flag the same day: over its daily limit of 1
]


def _ok(**fields: object) -> bytes:
    reply: dict[str, object] = {"ok": True, "outcome": "recorded", "counter": False, "offered": 1, "limit": 1}
    reply |= {"over_limit": 0, "note": None} | fields
    return json.dumps({k: v for k, v in reply.items() if v is not ...}).encode() + b"\n"


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> CBuild:
    """The client's library (clients/c/Makefile, `make check`) and the tests' driver, built once."""
    return build(tmp_path_factory.mktemp("c-client"))


def _run(program: Path, socket: Path, *args: str) -> dict[str, str]:
    """Run the driver; what it printed, by name."""
    done = subprocess.run([str(program), str(socket), *args], capture_output=True, text=True, timeout=120, check=False)
    assert "Sanitizer" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert found["status"] == "ok" if done.returncode == 0 else found["status"] != "ok", done.stdout
    return found


def test_each_kind_of_value_is_recorded_and_its_outcome_read_back(
    c_client: CBuild, running_agent: RunningAgent
) -> None:
    """bool, int (with a counter's key), double, strings, a category and text: each recorded, each outcome read."""
    offered: dict[str, int] = {}
    for kind, name, value, key in EACH_KIND:
        uc = REGISTRY[name]
        counter = uc.mechanism.privatization.value == "counter"
        n = offered[name] = 0 if counter else offered.get(name, 0) + 1
        found = _run(c_client.driver, running_agent.socket, kind, name, value, key)
        assert found["status"] == "ok", found
        assert (found["outcome"], found["counter"], found["note"]) == ("recorded", str(int(counter)), "")
        assert (found["offered"], found["limit"]) == (str(n), str(uc.daily_limit))
        assert found["over_limit"] == str(max(0, n - uc.daily_limit))
    assert _run(c_client.driver, running_agent.socket, "string", "default-browser", "firefox")["outcome"] == "duplicate"
    clamped = _run(c_client.driver, running_agent.socket, "int", "app-usage-seconds", "30000", "firefox")
    assert "clamped" in clamped["note"]
    rows = {r["use_case"]: r for r in json.loads(running_agent.cli("status", "--json").stdout)["use_cases"]}
    assert rows["emoji"]["pending_records"] == 1
    assert rows["dark-mode-enabled"]["pending_records"] == 1  # one record a day: the reservoir holds one of two
    assert rows["app-usage-histogram"]["open_counters"] == 1


def test_refusals_have_their_own_status_with_the_agents_message(c_client: CBuild, running_agent: RunningAgent) -> None:
    """An unknown use case, a value that does not fit, a key where none is taken, no consent: each its status."""
    sock = running_agent.socket
    unknown = _run(c_client.driver, sock, "string", "emojis", "😀")
    assert (unknown["status"], unknown["kind"]) == ("unknown-use-case", "unknown-use-case")
    assert "emoji" in unknown["message"]
    for args in (
        ("text", "dark-mode-enabled", "maybe"),
        ("int", "app-usage-seconds", "-5", "firefox"),
        ("string", "default-browser", "netscape"),
        ("text", "emoji", "😀", "a-key"),
        ("string", "app-usage-seconds", "thirty"),
    ):
        refused = _run(c_client.driver, sock, *args)
        assert refused["status"] == "value-refused", (args, refused)
        assert refused["message"]
    assert running_agent.cli("consent", "revoke").returncode == 0
    assert _run(c_client.driver, sock, "string", "emoji", "😀")["status"] == "consent-required"


def test_a_busy_agent_is_ldp_busy_and_serves_again_once_free(c_client: CBuild, running_agent: RunningAgent) -> None:
    """With every request slot of the real agent held and no retries: LDP_BUSY; freed: recorded."""
    sock = running_agent.socket
    once = ("bool", "dark-mode-enabled", "true", "-", "0")  # no busy retries
    with held_connections(sock):
        wait_until_busy(sock, lambda: _run(c_client.driver, sock, *once)["status"] == "busy")
    assert _run(c_client.driver, sock, *once)["status"] == "ok"


def test_busy_is_asked_again_then_given_up(c_client: CBuild, fake_agent: FakeAgents) -> None:
    """busy_retries = 2: two busy answers then an outcome is ok after three requests; three busy are LDP_BUSY."""
    busy = b'{"ok": false, "error": "busy", "message": "too many requests at once; retry"}\n'
    ok = _ok()
    for replies, status in (([busy, busy, ok], "ok"), ([busy, busy, busy, ok], "busy")):
        fake = fake_agent(replies)
        assert _run(c_client.driver, fake.path, "bool", "flag", "true", "-", "2")["status"] == status
        assert len(fake.requests) == 3


def test_the_request_is_the_protocols_json_with_every_string_escaped(c_client: CBuild, fake_agent: FakeAgents) -> None:
    """Quotes, backslashes, control characters and non-ASCII text arrive as the same string; numbers as numbers."""
    fake = fake_agent([_ok(counter=True, offered=0, limit=4)])
    tricky = 'a "quoted" \\ back\tslash\x01 é 😀'
    _run(c_client.driver, fake.path, "string", "words", tricky)
    _run(c_client.driver, fake.path, "int", "seconds", "-9223372036854775808", 'editor "x"')
    _run(c_client.driver, fake.path, "double", "hist", "0.1")
    _run(c_client.driver, fake.path, "bool", "flag", "false")
    _run(c_client.driver, fake.path, "text", "flag", "true")
    assert [json.loads(r) for r in fake.requests] == [
        {"op": "record", "use_case": "words", "value": tricky},
        {"op": "record", "use_case": "seconds", "value": -9223372036854775808, "key": 'editor "x"'},
        {"op": "record", "use_case": "hist", "value": 0.1},
        {"op": "record", "use_case": "flag", "value": False},
        {"op": "record", "use_case": "flag", "text": "true"},
    ]
    assert all(r.endswith(b"}\n") and r.count(b"\n") == 1 for r in fake.requests)


HOSTILE: list[tuple[bytes | None, str]] = [
    (None, "protocol-error"),
    (b"\n", "protocol-error"),
    (b"not json\n", "protocol-error"),
    (b"[1, 2]\n", "protocol-error"),
    (b'{"ok": "yes"}\n', "protocol-error"),
    (b'{"ok": true}\n', "protocol-error"),
    (b'{"ok": false}\n', "protocol-error"),
    (b'{"ok": false, "error": 3, "message": "x"}\n', "protocol-error"),
    (_ok(outcome="kept"), "protocol-error"),
    (_ok(counter=1), "protocol-error"),
    (_ok(offered=1.5), "protocol-error"),
    (_ok(offered=99999999999999999999), "protocol-error"),
    (_ok(limit=...), "protocol-error"),
    (_ok(note=5), "protocol-error"),
    (_ok()[:-2] + b" trailing\n", "protocol-error"),
    (_ok()[:-2] + b', "x": "\\ud800"}\n', "protocol-error"),  # a lone surrogate
    (_ok()[:-2] + b', "x": "\xff"}\n', "protocol-error"),  # not UTF-8
    (_ok()[:-2] + b', "x": "tab\there"}\n', "protocol-error"),  # a raw control character
    (_ok()[:-2] + b', "x": ' + b"[" * 40 + b"]" * 40 + b"}\n", "protocol-error"),  # nested too deep
    (b'{"ok": true, "note": "' + b"x" * 70_000, "reply-too-large"),
    (b"x" * 200_000 + b"\n", "reply-too-large"),
    (b'{"ok": false, "error": "new-kind", "message": "a newer agent"}\n', "refused"),
]


@pytest.mark.parametrize(("reply", "status"), HOSTILE, ids=range(len(HOSTILE)))
def test_a_malformed_or_oversized_reply_is_refused_whole(
    c_client: CBuild, fake_agent: FakeAgents, reply: bytes | None, status: str
) -> None:
    """Every reply that is not the protocol's has its status and a message, and nothing of it is read as
    an outcome; under the sanitizers, no read or write leaves its buffer."""
    program = c_client.checked_driver or c_client.driver
    found = _run(program, fake_agent([reply]).path, "bool", "flag", "true")
    assert found["status"] == status, found
    assert found["message"]
    assert "outcome" not in found
    if status == "refused":
        assert found["kind"] == "new-kind"


def test_extra_fields_and_escapes_of_a_reply_are_read(c_client: CBuild, fake_agent: FakeAgents) -> None:
    """Unknown fields of any type are read past; the message's escapes (é, 😀 as a surrogate pair) decode to UTF-8."""
    program = c_client.checked_driver or c_client.driver
    extra = _ok(note="beyond the range: clamped")[:-2] + b', "since": {"a": [1, 2.5e3, null, true]}, "r": -0.5}\n'
    found = _run(program, fake_agent([extra]).path, "bool", "flag", "true")
    assert (found["status"], found["note"]) == ("ok", "beyond the range: clamped")
    refusal = b'{"ok": false, "error": "value-refused", "message": "caf\\u00e9 \\ud83d\\ude00 \\"q\\""}\n'
    found = _run(program, fake_agent([refusal]).path, "bool", "flag", "true")
    assert (found["status"], found["message"]) == ("value-refused", 'café 😀 "q"')


def test_no_agent_and_bad_arguments(c_client: CBuild, tmp_path: Path) -> None:
    """No socket: LDP_UNAVAILABLE; text that is not UTF-8, a NaN, a path too long: LDP_INVALID_ARGUMENT."""
    missing = Path("/nonexistent-ldp/agent.sock")
    assert _run(c_client.driver, missing, "bool", "flag", "true")["status"] == "unavailable"
    # The request is written before the socket is tried: the text is refused first.
    args = [bytes(c_client.driver), bytes(missing), b"string", b"flag", b"caf\xe9"]
    done = subprocess.run(args, capture_output=True, timeout=60, check=False)
    assert done.stdout.startswith(b"status=invalid-argument\n"), done.stdout
    assert _run(c_client.driver, missing, "double", "hist", "nan")["status"] == "invalid-argument"
    assert _run(c_client.driver, Path("/" + "x" * 200), "bool", "flag", "true")["status"] == "invalid-argument"


def test_an_expired_use_case_is_ldp_use_case_expired(c_client: CBuild) -> None:
    """A daemon whose clock is past a use case's end date: LDP_USE_CASE_EXPIRED, the message naming date and owner."""
    text = FLEET_REGISTRY.read_text(encoding="utf-8").replace("expires = 2028-12-31", "expires = 2027-03-01")
    after = datetime.datetime(2027, 3, 2, tzinfo=datetime.UTC).timestamp()
    with agent_daemon(text, start=after) as agent:
        found = _run(c_client.driver, agent.socket, "string", "emoji", "😀")
    assert (found["status"], found["kind"]) == ("use-case-expired", "use-case-expired")
    assert "expired on 2027-03-01 (owner: keyboard-team@example.org)" in found["message"]
