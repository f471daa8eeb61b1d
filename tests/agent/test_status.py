"""The typed status and its JSON: the keys scripts read (``ldp-agent status --json``) stay as they were."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent import verbs
from agent.api import handle_request
from agent.core import Agent
from agent.status import AgentStatus, UseCaseStatus
from tests.support.clocks import FakeClock

DAY = 86_400.0

STATUS_KEYS = [
    "consent",
    "consent_granted_at",
    "registry",
    "registry_source",
    "next_cycle",
    "last_cycle",
    "cycles",
    "outbox",
    "ledger",
    "use_cases",
    "pid",
    "recording",
]
DEFINITION_KEYS = [
    "use_case",
    "definition",
    "mechanism",
    "period",
    "daily_limit",
    "epsilon_per_record",
    "epsilon_cap",
    "state",
]
FIGURE_KEYS = [
    "records_today",
    "epsilon_today",
    "epsilon_total",
    "pending_records",
    "open_counters",
    "outbox",
    "awaiting_receipt",
    "dropped_reports",
    "unsent_records",
    "memo_generation",
]


def _status_json(agent: Agent) -> dict[str, Any]:
    """The status as the API answers it (and ``ldp-agent status --json`` prints it), through JSON."""
    reply = handle_request(agent, {"op": "status"})
    assert reply["ok"] is True
    decoded = json.loads(json.dumps(reply["status"]))
    assert isinstance(decoded, dict)
    return decoded


def _rows(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["use_case"]: row for row in status["use_cases"]}


def test_without_consent_the_json_has_the_definitions_only(make_agent: Callable[..., Agent]) -> None:
    """Before consent: every top-level key in its order, and each use case's definition keys and state only."""
    status = _status_json(make_agent())
    assert list(status) == STATUS_KEYS
    assert status["consent"] is False
    assert (status["consent_granted_at"], status["next_cycle"], status["last_cycle"]) == (None, None, None)
    for row in _rows(status).values():
        assert list(row) == DEFINITION_KEYS
        assert row["state"] == "no consent"


def test_each_state_of_a_use_case_has_its_keys_in_order(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Active and capped use cases show every figure; a stopped one only the ε its manifest recorded; types hold."""
    agent = make_agent()
    agent.grant_consent()
    for _ in range(4):  # three records of ε 1 a day against the cap of 10 of "flag"
        for i in range(3):
            agent.record("flag", i % 2)
        agent.record("hist", 300.0)
        clock.set(clock.time() + DAY)
        agent.collect()
    (tmp_path / "state" / "uc-hist.sealed").unlink()
    rows = _rows(_status_json(make_agent()))
    assert rows["flag"]["state"] == "stopped: lifetime ε cap reached"
    assert rows["seconds"]["state"] == "active"
    for name in ("flag", "seconds", "procs", "words"):
        assert list(rows[name]) == DEFINITION_KEYS + FIGURE_KEYS, name
        assert all(isinstance(rows[name][k], int) for k in FIGURE_KEYS if not k.startswith("epsilon")), name
        assert all(isinstance(rows[name][k], float) for k in ("epsilon_today", "epsilon_total")), name
    stopped = rows["hist"]
    assert str(stopped["state"]).startswith("stopped: state file")
    assert list(stopped) == [*DEFINITION_KEYS, "epsilon_total"]
    assert isinstance(stopped["epsilon_total"], float)
    assert stopped["epsilon_total"] > 0


def test_the_status_reads_back_from_its_json(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """What the CLI reads from the daemon's JSON is the status the core built."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    status = agent.status()
    assert isinstance(status.use_cases, tuple)
    assert all(isinstance(row, UseCaseStatus) for row in status.use_cases)
    assert AgentStatus.from_json(json.loads(json.dumps(status.to_json()))) == status
    with pytest.raises(ValueError, match="'outbox'"):
        AgentStatus.from_json({**status.to_json(), "outbox": "3"})


def test_the_status_text_shows_a_stopped_use_case_with_its_epsilon(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ldp-agent status` prints a use case stopped with the ε its manifest recorded (no missing figure)."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    (tmp_path / "state" / "uc-flag.sealed").unlink()
    status = AgentStatus.from_json(_status_json(make_agent()))
    verbs._print_status(status)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    flag = lines[next(name for name in lines if name.startswith("flag@"))]
    assert "stopped: state file" in flag
    assert flag.endswith("; lifetime ε 1/10")
    seconds = lines[next(name for name in lines if name.startswith("seconds@"))]
    assert "active; today 0/8 records, ε 0; lifetime ε 0/100; outbox 0" in seconds
