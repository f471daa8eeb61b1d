"""A state directory written by the previous release's agent is opened and carried on by this one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from agent.core import Agent
from agent.errors import StateUnreadableError
from agent.sealed import Sealer
from protocol.catalog import Catalog
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from protocol.wire import decode_report
from tests.agent.conftest import KEY, REGISTRY, START, read_sealed
from tests.compat.previous_release import PreviousRelease
from tests.support.clocks import FakeClock

DAY = 86_400.0

# Run by the previous release: consent, a value for every use case, a collection cycle, two reports
# acknowledged (in the ledger), and values of the next periods still open.
_WRITE_STATE = """
import json, sys
from pathlib import Path
from agent.core import Agent
from agent.sealed import Sealer
from fleet.clock import FakeClock
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry

state, registry_path, start, key = sys.argv[1], sys.argv[2], float(sys.argv[3]), bytes.fromhex(sys.argv[4])
registry = parse_registry(Path(registry_path).read_bytes(), source=registry_path)
clock = FakeClock(start)
agent = Agent(registry=registry, state_dir=Path(state), sealer=Sealer(key), clock=clock, rng=SeededRandom(7))
agent.grant_consent()
values = {"flag": 1, "seconds": 600, "hist": 300.0, "procs": "bash", "words": "hello"}
for name, value in values.items():
    agent.record(name, value)
clock.set(start + 86_400)
agent.collect()
agent.acknowledge(agent.outbox()[:2])
for name, value in values.items():
    agent.record(name, value)
print(json.dumps({
    "time": clock.time(),
    "spent": {r["use_case"]: r["epsilon_total"] for r in agent.status()["use_cases"]},
    "outbox": [p.entry.payload.hex() for p in agent.outbox()],
    "ledger": len(agent.ledger()),
}))
"""


def _plain(state: Path) -> dict[str, Any]:
    """Every sealed file of the state directory, decrypted."""
    out: dict[str, Any] = {}
    for p in sorted(state.glob("*.sealed")):
        name = p.name.removesuffix(".sealed")
        purpose = "usecase:" + name[3:] if name.startswith("uc-") else name
        try:
            out[p.name] = read_sealed(p, purpose)
        except StateUnreadableError:
            # The previous release's ledger is version 1 until this release first writes it.
            out[p.name] = read_sealed(p, purpose, 1)
    return out


def test_the_previous_releases_state_is_opened_as_it_is_and_carried_on(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """Memos, budgets, outbox and ledger of 0.1.0 open unchanged; its reports still decode; new ones are format 2."""
    registry_path = tmp_path / "usecases.toml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    state = tmp_path / "state"
    old = previous_release.run(_WRITE_STATE, str(state), str(registry_path), str(START), KEY.hex())
    files = {p.name: p.read_bytes() for p in state.glob("*.sealed")}
    before = _plain(state)
    assert old["ledger"] == 2
    assert len(old["outbox"]) >= 3

    clock = FakeClock(old["time"])
    agent = Agent(registry=registry, state_dir=state, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(8))
    # Opening writes nothing: every file is as the previous release left it, byte for byte.
    assert {p.name: p.read_bytes() for p in state.glob("*.sealed")} == files
    assert {r.use_case: r.epsilon_total for r in agent.use_case_status()} == old["spent"]
    assert [p.entry.payload.hex() for p in agent.outbox()] == old["outbox"]
    assert len(agent.ledger()) == 2
    # Its waiting reports are format 1 and a collector of this release given the registry counts them.
    catalog = Catalog.build(registry)
    for payload in old["outbox"]:
        decoded = decode_report(bytes.fromhex(payload), catalog)
        assert decoded.version == 1
        assert decoded.use_case is registry[decoded.use_case.name]

    clock.set(old["time"] + DAY)
    agent.collect()
    after = _plain(state)
    for name, doc in before.items():
        if not name.startswith("uc-"):
            continue
        # Memos only grow: nothing the previous release drew is redrawn.
        permanent = after[name]["permanent"]
        for key, value in doc["permanent"].items():
            assert permanent[key] == value, name
        assert after[name]["budget"]["epsilon_total"] >= doc["budget"]["epsilon_total"]
    fresh = [p for p in agent.outbox() if p.entry.payload.hex() not in old["outbox"]]
    assert fresh
    for p in fresh:
        body = msgpack.unpackb(p.entry.payload, raw=False)
        assert body["v"] == 2
        assert body["h"] == registry[p.use_case].definition


def test_the_previous_releases_consent_and_ledger_are_bound_to_the_device_by_the_first_write(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """0.1.0's consent and ledger name no device (a field this release adds, absent means "not bound
    yet"): the first step that writes binds them to the manifest's device, after which deleting the
    manifest and every use-case file stops the device instead of starting over."""
    registry_path = tmp_path / "usecases.toml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    state = tmp_path / "state"
    old = previous_release.run(_WRITE_STATE, str(state), str(registry_path), str(START), KEY.hex())
    before = _plain(state)
    assert "device" not in before["consent.sealed"]
    assert "device" not in before["ledger.sealed"]

    clock = FakeClock(old["time"] + DAY)
    agent = Agent(registry=registry, state_dir=state, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(8))
    agent.collect()
    agent.acknowledge(agent.outbox()[:1])
    after = _plain(state)
    device = after["manifest.sealed"]["device"]
    assert after["consent.sealed"]["device"] == device
    assert after["ledger.sealed"]["device"] == device
    assert after["manifest.sealed"]["ledger"] is True
    assert after["consent.sealed"]["granted_at"] == before["consent.sealed"]["granted_at"]

    for p in [state / "manifest.sealed", *state.glob("uc-*.sealed")]:
        p.unlink()
    again = Agent(registry=registry, state_dir=state, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(9))
    rows = again.use_case_status()
    assert all(r.state.startswith("stopped:") and "re-enrol" in r.state for r in rows)
    assert not list(state.glob("uc-*.sealed"))
