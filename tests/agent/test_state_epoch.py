"""No fresh start by deletion (docs/state-integrity.md, "Deleting part of the state"): consent, the
ledger and the schedule are bound to the manifest's device, so removing any part of the state
directory short of all of it stops the device or is harmless; only the operator's explicit
re-enrolment starts stopped use cases anew, carrying their ε spent forward; status never shows
less ε than any file records."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.core import Agent
from agent.errors import UseCaseStoppedError
from agent.re_enrolment import NothingToReEnrolError
from agent.sealed import Sealer
from agent.state import AgentDoc
from agent.status import UseCaseStatus
from protocol.randomness import SeededRandom
from tests.agent.conftest import KEY, read_sealed
from tests.support.clocks import FakeClock

DAY = 86_400.0
VALUES: dict[str, object] = {"seconds": 10, "hist": 10.5, "procs": "bash", "flag": 1, "words": "hello"}
MEMOIZED = ("seconds", "hist", "procs")


def _use(agent: Agent, clock: FakeClock, days: int = 1) -> None:
    for _ in range(days):
        for name, value in VALUES.items():
            agent.record(name, value, key="a" if name == "seconds" else None)
        clock.set(clock.time() + DAY)
        agent.collect()
        agent.acknowledge(agent.outbox())
    agent.save_schedule(AgentDoc(next_cycle=clock.time() + 3_600.0, cycles=days))


def _rows(agent: Agent) -> dict[str, UseCaseStatus]:
    return {r.use_case: r for r in agent.use_case_status()}


def _spent(agent: Agent) -> dict[str, float]:
    out = {}
    for name, row in _rows(agent).items():
        assert row.epsilon_total is not None, (name, row.state)
        out[name] = row.epsilon_total
    return out


def _permanent(state: Path) -> dict[str, Any]:
    return {n: read_sealed(state / f"uc-{n}.sealed", f"usecase:{n}")["permanent"] for n in MEMOIZED}


def _used_device(make_agent: Callable[..., Agent], clock: FakeClock) -> Agent:
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock, days=2)
    return agent


def _delete(state: Path, *names: str) -> None:
    for name in names:
        for path in state.glob(name):
            path.unlink()


def test_deleting_the_manifest_and_every_use_case_file_stops_the_device_until_re_enrolment(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Consent and the ledger kept: nothing is recorded, drawn or sent, across restarts, until `re_enrol`;
    then every use case starts anew with ε spent carried forward and each new memo charged."""
    state = tmp_path / "state"
    spent = _spent(_used_device(make_agent, clock))
    _delete(state, "manifest.sealed", "uc-*.sealed")
    for restart in range(3):
        agent = make_agent(seed=100 + restart)
        for name, row in _rows(agent).items():
            assert row.state.startswith("stopped:"), (name, row.state)
            assert "manifest.sealed is missing" in row.state
            assert str(state / "consent.sealed") in row.state
            assert "ldp-agent re-enrol" in row.state
            # The ledger still records what was sent: status never shows less.
            assert row.epsilon_total is not None
            assert row.epsilon_total >= spent[name] - 1e-9
        for name, value in VALUES.items():
            with pytest.raises(UseCaseStoppedError, match="re-enrol"):
                agent.record(name, value)
        clock.set(clock.time() + DAY)
        agent.collect()
        assert agent.outbox() == []
        # No memo (RAPPOR's B', 1BitMean's memo bits, dBitFlip's buckets) is drawn or kept: no
        # use-case file and no manifest come back while the device is stopped.
        assert sorted(p.name for p in state.glob("*.sealed")) == ["agent.sealed", "consent.sealed", "ledger.sealed"]

    carried = {c.use_case: c.epsilon_total for c in agent.re_enrol()}
    assert set(carried) == set(VALUES)
    for name in VALUES:
        assert carried[name] >= spent[name] - 1e-9  # never reset
    after = _rows(agent)
    for name, row in after.items():
        assert row.state == "active", (name, row.state)
        assert row.epsilon_total is not None
        if name in MEMOIZED:
            assert row.epsilon_total > carried[name]  # the new memo is charged at once
        else:
            assert row.epsilon_total == pytest.approx(carried[name])
    notices = [n.text for n in agent.notices() if n.text.startswith("re-enrolled by the operator")]
    assert len(notices) == len(VALUES)
    assert agent.record("procs", "bash").outcome == "recorded"
    again = make_agent()
    assert all(r.state == "active" for r in _rows(again).values())


def test_re_enrolment_is_refused_when_nothing_is_stopped(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """An intact state is never re-enrolled: that would only cost ε."""
    agent = _used_device(make_agent, clock)
    before = _permanent(tmp_path / "state")
    with pytest.raises(NothingToReEnrolError):
        agent.re_enrol()
    assert _permanent(tmp_path / "state") == before


def test_re_enrolling_one_deleted_use_case_leaves_the_others_alone(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """With the manifest in force only the stopped use case starts anew; the others keep their memos."""
    state = tmp_path / "state"
    spent = _spent(_used_device(make_agent, clock))
    before = _permanent(state)
    _delete(state, "uc-procs.sealed")
    agent = make_agent()
    assert "uc-procs.sealed is missing" in _rows(agent)["procs"].state
    assert [c.use_case for c in agent.re_enrol()] == ["procs"]
    rows = _rows(agent)
    assert rows["procs"].state == "active"
    assert rows["procs"].epsilon_total is not None
    assert rows["procs"].epsilon_total > spent["procs"]
    after = _permanent(state)
    assert after["seconds"] == before["seconds"]
    assert after["hist"] == before["hist"]


# Each subset of the state directory short of all of it: (files deleted, what the next start shows).
SUBSETS = {
    "ledger only": (("ledger.sealed",), "harmless"),
    "schedule only": (("agent.sealed",), "harmless"),
    "consent only": (("consent.sealed",), "no consent"),
    "manifest only": (("manifest.sealed",), "stopped"),
    "one use-case file": (("uc-hist.sealed",), "stopped"),
    "manifest and use-case files": (("manifest.sealed", "uc-*.sealed"), "stopped"),
    "manifest and ledger": (("manifest.sealed", "ledger.sealed"), "stopped"),
    "manifest, use-case files and ledger": (("manifest.sealed", "uc-*.sealed", "ledger.sealed"), "stopped"),
    "manifest, use-case files and schedule": (("manifest.sealed", "uc-*.sealed", "agent.sealed"), "stopped"),
    "all but the schedule": (("manifest.sealed", "uc-*.sealed", "ledger.sealed", "consent.sealed"), "no consent"),
    "all but consent": (("manifest.sealed", "uc-*.sealed", "ledger.sealed", "agent.sealed"), "stopped"),
}


@pytest.mark.parametrize("subset", SUBSETS)
def test_every_partial_deletion_is_detected_or_harmless(
    subset: str, make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """The table of docs/state-integrity.md: each subset stops the device, or leaves every memo and
    every ε spent as it was; granting consent again never starts over while anything is left."""
    state = tmp_path / "state"
    spent = _spent(_used_device(make_agent, clock))
    before = _permanent(state)
    deleted, outcome = SUBSETS[subset]
    _delete(state, *deleted)
    agent = make_agent(seed=77)
    if outcome == "no consent":
        assert not agent.consented
        agent.grant_consent()  # the user opts in again: the state left decides
        outcome = "harmless" if (state / "manifest.sealed").exists() else "stopped"
    rows = _rows(agent)
    if outcome == "harmless":
        assert all(r.state == "active" for r in rows.values()), rows
        assert _spent(agent) == pytest.approx(spent)
        assert _permanent(state) == before
        if "ledger" in subset:
            assert agent.status().ledger.startswith("started anew: ")
    else:
        stopped = [n for n, r in rows.items() if r.state.startswith("stopped:")]
        assert stopped, rows
        for name in stopped:
            assert "re-enrol" in rows[name].state
            assert "is missing" in rows[name].state or "belong" in rows[name].state
        for name in MEMOIZED:
            path = state / f"uc-{name}.sealed"
            if name in stopped:
                assert not path.exists() or read_sealed(path, f"usecase:{name}")["permanent"] == before[name]
        assert agent.outbox() == [] or len(stopped) < len(rows)


def test_status_after_a_manifest_rollback_shows_the_use_case_files_epsilon(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """The manifest put back one generation: the use cases stop, and status shows at least the ε each
    use-case file records (the most any file records), not the old manifest's figure."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    old_manifest = (state / "manifest.sealed").read_bytes()
    _use(agent, clock, days=2)
    (state / "manifest.sealed").write_bytes(old_manifest)
    again = make_agent()
    for name, row in _rows(again).items():
        on_file = read_sealed(state / f"uc-{name}.sealed", f"usecase:{name}")["budget"]["epsilon_total"]
        assert row.state.startswith("stopped:"), (name, row.state)
        assert row.epsilon_total is not None
        assert row.epsilon_total >= on_file > 0


def test_manifest_and_use_case_files_put_back_together_under_a_newer_ledger_stop(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """The manifest and every use-case file restored from a day-1 copy agree with each other, but
    the ledger kept from day 4 records more ε for the reports it sent: every use case that sent
    something stops instead of enforcing the older, lower ε, and status shows the ledger's figure."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    saved = {p.name: p.read_bytes() for p in [*state.glob("uc-*.sealed"), state / "manifest.sealed"]}
    _use(agent, clock, days=3)
    later = _spent(agent)
    for name, data in saved.items():
        (state / name).write_bytes(data)
    again = make_agent()
    rows = _rows(again)
    for name, row in rows.items():
        assert row.state.startswith("stopped:"), (name, row.state)
        assert "ledger" in row.state, row.state
        assert "re-enrol" in row.state, row.state
        assert row.epsilon_total is not None
        assert row.epsilon_total >= later[name] - 1e-9
    with pytest.raises(UseCaseStoppedError):
        again.record(next(iter(VALUES)), VALUES[next(iter(VALUES))])


def test_re_enrolment_replaces_an_unreadable_ledger_so_publishing_resumes(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A ledger that does not open stops publishing; re-enrolment starts a new one saying why,
    so the device publishes again, and no use case's ε goes down."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock, days=2)
    before = _spent(agent)
    (state / "ledger.sealed").write_bytes(b"not a sealed file")
    broken = make_agent()
    assert "unreadable" in broken.status().ledger
    broken.re_enrol()
    again = make_agent()
    assert again.status().ledger == "ok", again.status().ledger
    assert any("started anew by re-enrolment" in n.text for n in again.notices())
    for name, spent in _spent(again).items():
        assert spent >= before[name] - 1e-9, name


def test_a_copied_in_ledger_stops_publishing_until_re_enrolment(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Another device's ledger (or an older device identity's) is refused; re-enrolment rebinds it."""
    agent = _used_device(make_agent, clock)
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "state", other)
    _delete(other, "manifest.sealed", "uc-*.sealed")
    other_agent = Agent(registry=agent.registry, state_dir=other, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(5))
    other_agent.re_enrol()
    other_agent.record("flag", 1)
    other_agent.acknowledge(other_agent.outbox())
    shutil.copyfile(other / "ledger.sealed", tmp_path / "state" / "ledger.sealed")
    again = make_agent()
    assert "belongs to the state of device" in again.status().ledger
    again.record("flag", 1)
    clock.set(clock.time() + DAY)
    again.collect()
    assert again.outbox() == []
    again.re_enrol()
    assert again.status().ledger == "ok"
    assert again.outbox() != []
