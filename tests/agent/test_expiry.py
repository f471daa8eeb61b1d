"""A use case past its end date: record refused naming date and owner, the period's values still sent,
nothing more charged, the ledger noting the stop, and a later date resuming it with state and ε intact."""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.api import handle_request
from agent.cli import EXIT_CODES, main
from agent.core import Agent
from agent.errors import UseCaseExpiredError, UseCaseStoppedError
from protocol.registry import Registry, parse_registry
from runtime.exit_status import ExitStatus
from tests.agent.conftest import REGISTRY, START, read_sealed
from tests.support.clocks import FakeClock

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400.0
FIRST_DAY = datetime.datetime.fromtimestamp(START, datetime.UTC).date()
ENDS = FIRST_DAY + datetime.timedelta(days=1)
"""The end date of the tests' registry: the day after the fake clock's first day."""
OWNER = "telemetry-team@example.org"


def _with_end(day: datetime.date) -> str:
    """The agent tests' registry with every use case owned and ending on ``day``."""
    lines = f'owner = "{OWNER}"\nexpires = {day.isoformat()}\n'
    text = REGISTRY
    for name in ("flag", "seconds", "hist", "procs", "words"):
        text = text.replace(f"[use_cases.{name}]\n", f"[use_cases.{name}]\n{lines}")
    return text


@pytest.fixture
def ending(tmp_path: Path) -> Registry:
    """The tests' registry, every use case ending at 00:00 UTC after the clock's first day."""
    return parse_registry(_with_end(ENDS), source=str(tmp_path / "usecases.toml"))


def _spent(agent: Agent, name: str) -> float:
    row = next(r for r in agent.use_case_status() if r.use_case == name)
    assert row.epsilon_total is not None
    return row.epsilon_total


def test_past_its_end_date_a_use_case_records_nothing_and_sends_what_it_had(
    make_agent: Callable[..., Agent], clock: FakeClock, ending: Registry, tmp_path: Path
) -> None:
    """Values of the last day are sent and charged; from 00:00 UTC on the date record is refused,
    storing and charging nothing, and later cycles charge nothing more; the ledger notes the stop once."""
    agent = make_agent(registry_override=ending)
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("seconds", 600, key="editor")
    clock.set(START + 20 * 3_600)  # 21:00 UTC, the last evening before the end date
    agent.record("seconds", 60, key="editor")
    state = tmp_path / "state"
    assert _spent(agent, "flag") == 0.0  # charged when sent, not when recorded
    clock.set(START + DAY - 3_600)  # 00:00 UTC on the end date: expired from this instant
    files = {p.name: p.read_bytes() for p in state.iterdir()}
    with pytest.raises(UseCaseExpiredError) as info:
        agent.record("flag", 0)
    assert isinstance(info.value, UseCaseStoppedError)  # a caller handling stops handles it
    assert ENDS.isoformat() in str(info.value)
    assert OWNER in str(info.value)
    with pytest.raises(UseCaseExpiredError):
        agent.record("seconds", "not even a number")  # refused before the value is looked at
    assert {p.name: p.read_bytes() for p in state.iterdir()} == files  # nothing was written
    # The periods that ended at the end date close and are sent whole.
    summary = agent.collect()
    assert summary.reports == 3  # flag's day, and the two 6-hour periods of seconds with a total
    sent = {p.use_case for p in agent.outbox()}
    assert sent == {"flag", "seconds"}
    agent.acknowledge(agent.outbox())
    spent = {name: _spent(agent, name) for name in ("flag", "seconds")}
    assert spent["flag"] == pytest.approx(ending["flag"].cost)
    assert spent["seconds"] > 0
    notices = [n for n in agent.notices() if n.text.startswith("expired on")]
    assert {n.use_case for n in notices} == set(ending.use_cases)
    assert all(f"expired on {ENDS.isoformat()} (owner: {OWNER})" in n.text for n in notices)
    # Days later: nothing more recorded, sent or charged; the notice is not repeated.
    for day in range(1, 4):
        clock.set(START + day * DAY)
        with pytest.raises(UseCaseExpiredError):
            agent.record("flag", 1)
        assert agent.collect().reports == 0
        assert agent.outbox() == []
    assert {name: _spent(agent, name) for name in ("flag", "seconds")} == spent
    assert len([n for n in agent.notices() if n.text.startswith("expired on")]) == len(ending.use_cases)
    row = next(r for r in agent.use_case_status() if r.use_case == "flag")
    assert row.state == f"expired on {ENDS.isoformat()} (owner: {OWNER}): records refused"


def test_a_later_end_date_resumes_the_same_definition_with_its_state_and_epsilon(
    make_agent: Callable[..., Agent], clock: FakeClock, ending: Registry, tmp_path: Path
) -> None:
    """The renewed registry has the same definition hashes; the memos, the ε spent and the files carry
    over untouched, record works again, and the ledger notes the renewal."""
    agent = make_agent(registry_override=ending)
    agent.grant_consent()
    agent.record("seconds", 600, key="editor")
    agent.record("procs", "bash")
    clock.set(START + DAY)
    agent.collect()
    agent.acknowledge(agent.outbox())
    with pytest.raises(UseCaseExpiredError):
        agent.record("procs", "bash")
    state = tmp_path / "state"
    memos = {n: read_sealed(state / f"uc-{n}.sealed", f"usecase:{n}")["permanent"] for n in ("seconds", "procs")}
    spent = {n: _spent(agent, n) for n in ending.use_cases}
    assert spent["seconds"] > 0
    assert spent["procs"] > 0

    renewed = parse_registry(_with_end(ENDS + datetime.timedelta(days=365)), source=str(tmp_path / "renewed.toml"))
    assert {n: uc.definition for n, uc in renewed.use_cases.items()} == {
        n: uc.definition for n, uc in ending.use_cases.items()
    }
    assert renewed.hash == ending.hash
    files = {p.name: p.read_bytes() for p in state.glob("uc-*.sealed")}
    again = make_agent(registry_override=renewed, seed=99)
    assert {p.name: p.read_bytes() for p in state.glob("uc-*.sealed")} == files  # the same definitions: untouched
    assert {n: _spent(again, n) for n in renewed.use_cases} == spent
    assert again.record("procs", "bash").outcome == "recorded"
    again.record("seconds", 30, key="editor")
    for name, memo in memos.items():
        after = read_sealed(state / f"uc-{name}.sealed", f"usecase:{name}")["permanent"]
        for key, value in memo.items():
            if name == "procs":
                assert value["memo"].items() <= after[key]["memo"].items()
            else:
                assert after[key] == value
    renewals = [n for n in again.notices() if n.text.startswith("renewed:")]
    assert {n.use_case for n in renewals} == set(renewed.use_cases)
    assert all(str(ENDS + datetime.timedelta(days=365)) in n.text for n in renewals)


def test_the_api_names_the_expiry_and_the_command_exits_with_the_stopped_status(
    make_agent: Callable[..., Agent], clock: FakeClock, ending: Registry
) -> None:
    """The socket's reply is use-case-expired with the date and the owner; ldp-agent maps it to status 5."""
    agent = make_agent(registry_override=ending)
    agent.grant_consent()
    clock.set(START + DAY)
    reply = handle_request(agent, {"op": "record", "use_case": "words", "value": "hello"})
    assert reply["ok"] is False
    assert reply["error"] == "use-case-expired"
    assert ENDS.isoformat() in str(reply["message"])
    assert OWNER in str(reply["message"])
    assert EXIT_CODES["use-case-expired"] == ExitStatus.STOPPED


def test_ldp_agent_record_after_the_end_date_exits_5_naming_date_and_owner(tmp_path: Path) -> None:
    """The command, on a clock past the date (the tests' launcher), refuses with status 5 and says why."""
    cfg = _config(tmp_path, _with_end(ENDS))

    def run(at: float, *args: str) -> subprocess.CompletedProcess[str]:
        launcher = [sys.executable, "-m", "tests.support.agent_launcher", "--rate=1", f"--start={at}", "--"]
        return subprocess.run(
            [*launcher, "--config", str(cfg), *args], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
        )

    assert run(START, "consent", "grant").returncode == 0
    assert run(START, "record", "flag", "true").returncode == 0
    done = run(START + DAY, "record", "flag", "true")
    assert done.returncode == ExitStatus.STOPPED, done.stderr
    assert f"expired on {ENDS.isoformat()} (owner: {OWNER})" in done.stderr
    checked = run(START + DAY, "check-config")
    assert checked.returncode == 0, checked.stderr
    assert f"warning: use case 'flag' expired on {ENDS.isoformat()} (owner: {OWNER})" in checked.stdout


def _config(tmp_path: Path, registry: str) -> Path:
    (tmp_path / "usecases.toml").write_text(registry, encoding="utf-8")
    key = tmp_path / "state.key"
    key.write_bytes(bytes(range(32)))
    key.chmod(0o600)
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[broker]\nhost = "127.0.0.1"\nport = 1\ntls = false\n[registry]\npath = "usecases.toml"\n'
        '[state]\ndirectory = "state"\nkey_file = "state.key"\n[api]\nsocket = "agent.sock"\n',
        encoding="utf-8",
    )
    return cfg


def test_check_config_warns_of_each_use_case_without_owner_or_end_date_and_strict_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without strict: status 0 and one warning per use case lacking metadata; with strict: status 2 naming each."""
    owned = REGISTRY.replace("[use_cases.flag]\n", f'[use_cases.flag]\nowner = "{OWNER}"\nexpires = 2099-01-01\n')
    cfg = _config(tmp_path, owned)
    assert main(["--config", str(cfg), "check-config"]) == 0
    out = capsys.readouterr().out
    lacking = {"seconds", "hist", "procs", "words"}
    for name in lacking:
        assert f"warning: use case {name!r} has no owner and no expires" in out
    assert "'flag'" not in out
    cfg = _config(tmp_path, owned.replace("format = 1\n", "format = 1\nstrict = true\n", 1))
    assert main(["--config", str(cfg), "check-config"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "strict = true" in err
    assert "4 lack them" in err
    for name in lacking:
        assert f"{name} (no owner and no expires)" in err


def test_the_ledger_prints_end_date_notices_as_such(
    make_agent: Callable[..., Agent], clock: FakeClock, ending: Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ldp-agent ledger` labels the stop "end date", not "registry change" (the prefixes are agent.expiry's)."""
    from agent import expiry, verbs  # noqa: PLC0415

    assert (expiry.EXPIRED, expiry.RENEWED) == verbs._END_DATE_NOTICES
    agent = make_agent(registry_override=ending)
    agent.grant_consent()
    clock.set(START + DAY)
    agent.collect()
    verbs._print_ledger([], [n.to_plain() for n in agent.notices()])
    lines = capsys.readouterr().out.splitlines()
    assert any(
        line.endswith(
            f"flag  end date: expired on {ENDS.isoformat()} (owner: {OWNER}): values are refused "
            "from then on; those recorded before are sent when their period ends, and nothing more "
            "is charged"
        )
        for line in lines
    ), lines
