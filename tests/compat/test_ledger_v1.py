"""A ledger of version 1 (before it named brokers), written by the release before, is read and
carried on: its entries keep every field, their broker unknown; the next write is version 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.api import ledger_json
from agent.core import Agent
from agent.errors import StateUnreadableError
from agent.sealed import Sealer
from agent.state import LEDGER_VERSION, LedgerDoc
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from tests.agent.conftest import KEY, REGISTRY, START
from tests.support.clocks import FakeClock

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ledger-v1"
"""Written by tests/compat/make_ledger_v1.py with the code of commit 4c821b8 (ledger version 1)."""

# What that script printed: each report id and its status in the ledger it wrote.
WRITTEN = {
    "f60de4eb1af712973fb5038d3672e93f": "sent",
    "37f3c24de66ec8e86bf86329884cb6db": "counted",
    "bc51e400b57a0462d15c50ba9ba02197": "refused: late",
    "523301539ab2a03d062a5a1b07b39f11": "refused by the broker: not authorized",
}


def _state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(FIXTURE, state)
    state.chmod(0o700)
    for p in state.iterdir():
        p.chmod(0o600)
    return state


def _agent(state: Path, clock: FakeClock) -> Agent:
    registry = parse_registry(REGISTRY.encode("utf-8"), source="usecases.toml")
    return Agent(registry=registry, state_dir=state, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(3))


def test_the_fixture_is_a_ledger_of_version_1() -> None:
    sealer = Sealer(KEY)
    assert LEDGER_VERSION == 2
    old = sealer.read(FIXTURE / "ledger.sealed", "ledger", 1)
    assert old is not None
    assert all("broker" not in e for e in old["entries"])
    with pytest.raises(StateUnreadableError):
        sealer.read(FIXTURE / "ledger.sealed", "ledger", LEDGER_VERSION)


def test_a_version_1_ledger_opens_with_every_entry_and_no_broker(tmp_path: Path) -> None:
    state = _state(tmp_path)
    before = Sealer(KEY).read(state / "ledger.sealed", "ledger", 1)
    assert before is not None
    files = {p.name: p.read_bytes() for p in state.iterdir()}
    device = _agent(state, FakeClock(START + 86_400))
    assert device.status().ledger == "ok"
    entries = device.ledger()
    assert {e.report_id.hex(): e.status for e in entries} == WRITTEN
    assert [e.broker for e in entries] == [""] * len(WRITTEN)
    # Every field of version 1 is kept as it was.
    assert [{k: v for k, v in e.to_plain().items() if k != "broker"} for e in entries] == before["entries"]
    assert all(row["broker"] == "" for row in ledger_json(entries) if isinstance(row, dict))
    # Opening writes nothing: the previous release can still read the directory.
    assert {p.name: p.read_bytes() for p in state.iterdir()} == files


def test_the_next_write_is_version_2_and_records_the_broker(tmp_path: Path) -> None:
    state = _state(tmp_path)
    clock = FakeClock(START + 86_400)
    device = _agent(state, clock)
    waiting = [p for p in device.outbox() if p.entry.attempts == 0]
    assert waiting
    clock.set(clock.time() + 60)
    device.mark_sent(waiting[:1], broker="broker-b.example:8883")

    written = LedgerDoc.from_plain(Sealer(KEY).read(state / "ledger.sealed", "ledger", LEDGER_VERSION))
    by_id = {e.report_id.hex(): e for e in written.entries}
    assert by_id[waiting[0].entry.report_id.hex()].broker == "broker-b.example:8883"
    assert {k: by_id[k].status for k in WRITTEN} == WRITTEN
    assert all(by_id[k].broker == "" for k in WRITTEN)
    with pytest.raises(StateUnreadableError):
        Sealer(KEY).read(state / "ledger.sealed", "ledger", 1)
    # And it opens again, as version 2.
    again = _agent(state, clock)
    assert {e.report_id.hex(): e.broker for e in again.ledger()} == {k: e.broker for k, e in by_id.items()}
