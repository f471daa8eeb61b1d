"""The Python client (agent/client.py), blocking and asyncio, against a real agent daemon: one value of
each kind with its outcome read back, busy, unknown use cases, refused values, an expired use case;
and against a fake agent's malformed, oversized or missing replies."""

from __future__ import annotations

import ast
import asyncio
import datetime
import json
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agent.client import (
    ERRORS,
    MAX_REPLY_BYTES,
    AgentClient,
    AgentUnavailableError,
    AsyncAgentClient,
    BadRequestError,
    BusyError,
    ConsentRequiredError,
    Outcome,
    ProtocolError,
    RecordReply,
    RefusedError,
    UnknownUseCaseError,
    UseCaseExpiredError,
    UseCaseStoppedError,
    ValueRefusedError,
)
from protocol.registry import parse_registry
from tests.clients.conftest import (
    FLEET_REGISTRY,
    ROOT,
    FakeAgent,
    RunningAgent,
    agent_daemon,
    held_connections,
    wait_until_busy,
)

REGISTRY = parse_registry(FLEET_REGISTRY.read_bytes(), source=str(FLEET_REGISTRY))

# One value of each kind the registry's mechanisms take, and what the agent answers for it.
EACH_KIND: list[tuple[str, object, str | None]] = [
    ("dark-mode-enabled", True, None),  # a flag (randomized response)
    ("app-usage-seconds", 1_800, "firefox"),  # a count into a counter (1BitMean), with its key
    ("app-usage-histogram", 1_234.5, None),  # a number into a counter (dBitFlipPM)
    ("emoji", "😀", None),  # a string (Count Mean Sketch)
    ("safari-energy-domains", "example.com", None),  # a string (Hadamard Count Mean Sketch)
    ("default-browser", "firefox", None),  # one of fixed categories (basic RAPPOR)
]

_ABSENT = object()


def _ok(**fields: object) -> bytes:
    """A record reply with ``fields`` changed (``_ABSENT``: left out)."""
    reply = {"ok": True, "outcome": "recorded", "counter": False, "offered": 1, "limit": 1, "over_limit": 0}
    reply |= {"note": None} | fields
    return json.dumps({k: v for k, v in reply.items() if v is not _ABSENT}).encode() + b"\n"


OK_REPLY = _ok()


FakeAgents = Callable[[Sequence[bytes | None]], FakeAgent]


def _record(form: str, path: Path, *, timeout: float = 10.0) -> RecordReply:
    """One record of the flag through the blocking or the asyncio client."""
    if form == "blocking":
        return AgentClient(path, timeout=timeout).record("flag", True)
    return asyncio.run(AsyncAgentClient(path, timeout=timeout).record("flag", True))


def _expected(name: str) -> tuple[Outcome, bool, int]:
    uc = REGISTRY[name]
    return Outcome.RECORDED, uc.mechanism.privatization.value == "counter", uc.daily_limit


def test_the_module_needs_only_the_standard_library() -> None:
    """agent/client.py imports only the standard library, and importing it loads nothing else."""
    tree = ast.parse((ROOT / "agent" / "client.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported
    # Without site-packages at all (-S): the module runs on a Python with nothing installed.
    probe = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import json, agent.client; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], capture_output=True, text=True, cwd="/", check=True, timeout=120
    )
    assert set(json.loads(done.stdout)) - set(sys.stdlib_module_names) - {"agent", "__main__"} == set()


def test_each_kind_of_value_is_recorded_and_its_outcome_read_back_blocking(running_agent: RunningAgent) -> None:
    """The blocking client records a flag, two counters, two strings and a category; each reply is typed."""
    client = AgentClient(running_agent.socket)
    for name, value, key in EACH_KIND:
        assert isinstance(value, bool | int | float | str)
        reply = client.record(name, value, key=key)
        outcome, counter, limit = _expected(name)
        assert reply == RecordReply(
            outcome=outcome, counter=counter, offered=0 if counter else 1, limit=limit, over_limit=0, note=None
        ), name
    # RAPPOR reports each string once per period; a counter beyond its range says how it is clamped.
    assert client.record("default-browser", "firefox").outcome is Outcome.DUPLICATE
    clamped = client.record("app-usage-seconds", 30_000, key="firefox")
    assert clamped.note is not None
    assert "clamped" in clamped.note
    assert client.record_text("dark-mode-enabled", "false").outcome is Outcome.RECORDED
    status = running_agent.cli("status", "--json")
    rows = {row["use_case"]: row for row in json.loads(status.stdout)["use_cases"]}
    assert rows["emoji"]["pending_records"] == 1
    assert rows["app-usage-seconds"]["open_counters"] == 1


def test_each_kind_of_value_is_recorded_and_its_outcome_read_back_asyncio(running_agent: RunningAgent) -> None:
    """The asyncio client does the same, concurrently."""
    client = AsyncAgentClient(running_agent.socket)

    async def main() -> list[RecordReply]:
        return list(await asyncio.gather(*(client.record(n, v, key=k) for n, v, k in EACH_KIND)))  # type: ignore[arg-type]

    for (name, _, _), reply in zip(EACH_KIND, asyncio.run(main()), strict=True):
        outcome, counter, limit = _expected(name)
        assert (reply.outcome, reply.counter, reply.limit) == (outcome, counter, limit), name
    assert asyncio.run(client.record_text("app-usage-histogram", "60")).counter


def test_refusals_raise_their_own_exceptions_in_both_forms(running_agent: RunningAgent) -> None:
    """An unknown use case, a value that does not fit, a key where none is taken and no consent each
    raise the exception of their kind, with the agent's message."""
    client = AgentClient(running_agent.socket)
    aclient = AsyncAgentClient(running_agent.socket)
    with pytest.raises(UnknownUseCaseError) as unknown:
        client.record("emojis", "😀")
    assert unknown.value.kind == "unknown-use-case"
    assert "emoji" in unknown.value.message  # the registry's use cases are listed
    with pytest.raises(UnknownUseCaseError):
        asyncio.run(aclient.record("emojis", "😀"))
    calls: list[Callable[[], RecordReply]] = [
        lambda: client.record("dark-mode-enabled", "maybe"),
        lambda: client.record("app-usage-seconds", -5, key="firefox"),
        lambda: client.record("default-browser", "netscape"),
        lambda: client.record("emoji", "😀", key="k"),
        lambda: asyncio.run(aclient.record("dark-mode-enabled", 7)),
    ]
    for call in calls:
        with pytest.raises(ValueRefusedError) as refused:
            call()
        assert refused.value.kind == "value-refused"
        assert refused.value.message
    with pytest.raises(BadRequestError):
        client.record_text("dark-mode-enabled", 1)  # type: ignore[arg-type]  # the agent's check, not ours
    assert running_agent.cli("consent", "revoke").returncode == 0
    with pytest.raises(ConsentRequiredError):
        client.record("emoji", "😀")
    with pytest.raises(ConsentRequiredError):
        asyncio.run(aclient.record("emoji", "😀"))


def test_arguments_no_agent_could_take_are_refused_before_sending(running_agent: RunningAgent) -> None:
    """Wrong Python types and non-finite numbers are the caller's mistake: TypeError or ValueError."""
    client = AgentClient(running_agent.socket)
    with pytest.raises(TypeError):
        client.record("emoji", ["😀"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        client.record("app-usage-histogram", float("nan"))
    with pytest.raises(ValueError, match="bytes"):
        client.record("emoji", "x" * 70_000)


def test_a_busy_agent_is_busy_error_and_serves_again_once_free(running_agent: RunningAgent) -> None:
    """With every request slot of the real agent held, a request without retries is BusyError (both
    forms); once the slots are free, the same request is recorded."""
    client = AgentClient(running_agent.socket, busy_retries=0)
    aclient = AsyncAgentClient(running_agent.socket, busy_retries=0)

    def busy() -> bool:
        try:
            client.record("dark-mode-enabled", True)
        except BusyError:
            return True
        return False

    with held_connections(running_agent.socket):
        wait_until_busy(running_agent.socket, busy)
        with pytest.raises(BusyError) as info:
            asyncio.run(aclient.record("dark-mode-enabled", True))
        assert info.value.kind == "busy"
    assert client.record("dark-mode-enabled", True).outcome is Outcome.RECORDED


@pytest.mark.parametrize("form", ["blocking", "asyncio"])
def test_busy_is_asked_again_then_given_up(
    form: str, fake_agent: Callable[[Sequence[bytes | None]], FakeAgent]
) -> None:
    """busy_retries = 2: two busy answers then an outcome is an outcome, after three requests; three
    busy answers are BusyError after three requests."""
    busy = b'{"ok": false, "error": "busy", "message": "too many requests at once; retry"}\n'
    for replies, succeeds in (([busy, busy, OK_REPLY], True), ([busy, busy, busy, OK_REPLY], False)):
        fake = fake_agent(replies)

        def record(fake: FakeAgent = fake) -> RecordReply:
            if form == "blocking":
                return AgentClient(fake.path, busy_retries=2, busy_backoff=0.001).record("flag", True)
            return asyncio.run(AsyncAgentClient(fake.path, busy_retries=2, busy_backoff=0.001).record("flag", True))

        if succeeds:
            assert record().outcome is Outcome.RECORDED
        else:
            with pytest.raises(BusyError):
                record()
        assert len(fake.requests) == 3
        assert all(json.loads(r) == {"op": "record", "use_case": "flag", "value": True} for r in fake.requests)


HOSTILE: list[tuple[bytes | None, type[Exception], str]] = [
    (None, ProtocolError, "without a reply"),
    (b"\n", ProtocolError, "without a reply"),
    (b"not json\n", ProtocolError, "not JSON"),
    (b"\xff\xfe\n", ProtocolError, "not JSON"),
    (b"[1, 2]\n", ProtocolError, "boolean"),
    (b'{"outcome": "recorded"}\n', ProtocolError, "boolean"),
    (b'{"ok": "yes"}\n', ProtocolError, "boolean"),
    (b'{"ok": false}\n', ProtocolError, "refusal"),
    (b'{"ok": false, "error": 3, "message": "x"}\n', ProtocolError, "refusal"),
    (b'{"ok": true}\n', ProtocolError, "outcome"),
    (_ok(outcome="kept"), ProtocolError, "outcome"),
    (_ok(counter=1), ProtocolError, "counter"),
    (_ok(offered=True), ProtocolError, "offered"),
    (_ok(offered=1.5), ProtocolError, "offered"),
    (_ok(limit=_ABSENT), ProtocolError, "limit"),
    (_ok(note=5), ProtocolError, "note"),
    (b"x" * (MAX_REPLY_BYTES + 10), ProtocolError, "longer than"),
    (b'{"ok": true, "pad": "' + b"x" * MAX_REPLY_BYTES + b'"}\n', ProtocolError, "longer than"),
    (b'{"ok": false, "error": "new-kind", "message": "a newer agent"}\n', RefusedError, "new-kind"),
]


@pytest.mark.parametrize(("reply", "error", "words"), HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("form", ["blocking", "asyncio"])
def test_a_malformed_or_oversized_reply_is_a_protocol_error(
    fake_agent: FakeAgents,
    form: str,
    reply: bytes | None,
    error: type[Exception],
    words: str,
) -> None:
    """Every reply that is not the protocol's (missing, not JSON, the wrong shape, over 64 KiB) raises
    ProtocolError saying what is wrong; an error kind this client does not know is a RefusedError."""
    fake = fake_agent([reply])
    with pytest.raises(error, match=words) as info:
        _record(form, fake.path)
    if error is RefusedError:
        assert isinstance(info.value, RefusedError)
        assert type(info.value) is RefusedError
        assert info.value.kind == "new-kind"


def test_extra_fields_of_a_newer_agent_are_read_past(fake_agent: FakeAgents) -> None:
    """Fields this client does not know, of any type, do not disturb the outcome."""
    extra = OK_REPLY[:-2] + b', "since": {"nested": [1, {"a": null}]}, "ratio": 0.5}\n'
    assert AgentClient(fake_agent([extra]).path).record("flag", True).outcome is Outcome.RECORDED


@pytest.mark.parametrize("form", ["blocking", "asyncio"])
def test_no_agent_or_a_silent_one_is_agent_unavailable(form: str) -> None:
    """No socket file, and a socket whose listener never answers (within the timeout), are AgentUnavailableError."""
    directory = Path(tempfile.mkdtemp(prefix="ldp-none-"))
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.bind(str(directory / "silent.sock"))
        silent.listen(1)  # never accepted: the request sits in the backlog unanswered
        for name, words in (("missing.sock", "no agent listens"), ("silent.sock", "did not answer")):
            with pytest.raises(AgentUnavailableError, match=words):
                _record(form, directory / name, timeout=0.3)
    finally:
        silent.close()


def test_every_error_kind_of_the_protocol_has_its_exception() -> None:
    """The client knows each error kind the agent's API sends (agent/api.py), and expired is a stop."""
    from agent.api import _REFUSAL_KINDS  # noqa: PLC0415 - the server's table, read only here

    kinds = {kind for _, kind in _REFUSAL_KINDS} | {"bad-request", "unknown-use-case", "busy"}
    assert kinds == set(ERRORS)
    assert issubclass(UseCaseExpiredError, UseCaseStoppedError)


def test_an_expired_use_case_is_use_case_expired_error(tmp_path: Path) -> None:
    """A daemon whose clock is past a use case's end date refuses it: UseCaseExpiredError naming date and owner."""
    ends = datetime.date(2027, 3, 1)
    text = FLEET_REGISTRY.read_text(encoding="utf-8").replace("expires = 2028-12-31", f"expires = {ends.isoformat()}")
    after = datetime.datetime(2027, 3, 2, tzinfo=datetime.UTC).timestamp()
    with agent_daemon(text, start=after) as agent:
        with pytest.raises(UseCaseExpiredError) as info:
            AgentClient(agent.socket).record("emoji", "😀")
        assert "expired on 2027-03-01 (owner: keyboard-team@example.org)" in info.value.message
        with pytest.raises(UseCaseStoppedError):
            asyncio.run(AsyncAgentClient(agent.socket).record("dark-mode-enabled", True))
