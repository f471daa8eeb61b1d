"""A seeded agent's state and reports are pinned: every sealed write (its plaintext, in order) and
every published report of a seeded run hash to the figures the agent wrote before the state's
transaction (docs/state-integrity.md, "The manifest"): a change to them changes the bytes on
the device, and comes with a version, a migration or a refusal (tests/compat/)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import msgpack
import pytest

from agent.core import Agent
from agent.publisher import Publisher
from agent.sealed import Sealer
from agent.transport import MemoryTransport
from protocol.plain import Plain
from protocol.randomness import SeededRandom
from tests.support.clocks import FakeClock

PINNED_WRITES = "9633b5cf69ab19716b14b7fee046e44d9d2e6cd9004773d18850ec59e4872ace"
"""SHA-256 over the purpose, version and plaintext of every sealed write of the run, in order."""
PINNED_REPORTS = "927232086749d3c7f1431f7c0bbca17c06fc8d6145646a2437a75fe8566296cd"
"""SHA-256 over the topic and payload of every report the run published, in order."""


def _values(round_: int) -> list[tuple[str, object, str | None]]:
    """What the run records in round ``round_``: every use case of the tests' registry, two
    counter keys, strings repeated across rounds (memos reused, duplicates refused)."""
    word = "abcd"[round_ % 4]
    return [
        ("flag", round_ % 2, None),
        ("seconds", 600 * (round_ + 1), f"app{round_ % 3}"),
        ("seconds", 300 + round_, None),
        ("hist", 1800.0 + 97 * round_, None),
        ("procs", f"proc-{word}", None),
        ("words", f"word-{word}", None),
        ("words", "word-a", None),
    ]


def test_a_seeded_run_writes_and_publishes_the_pinned_bytes(
    make_agent: Callable[..., Agent], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six 6-hour cycles with a restart: the sealed plaintexts and published reports hash to the pinned figures."""
    writes = hashlib.sha256()
    real = Sealer.seal

    def seal(self: Sealer, purpose: str, version: int, document: Plain) -> bytes:
        writes.update(b"%s\x00%d\x00" % (purpose.encode(), version))
        writes.update(hashlib.sha256(msgpack.packb(document, use_bin_type=True)).digest())
        return real(self, purpose, version, document)

    monkeypatch.setattr(Sealer, "seal", seal)
    agent = make_agent()
    agent.grant_consent()
    transport = MemoryTransport()
    rng = SeededRandom(11)
    for round_ in range(6):
        agent.record_many(_values(round_))
        clock.set(clock.time() + 6 * 3600.0)
        agent.collect()
        asyncio.run(Publisher(agent, transport, clock=clock, rng=rng).drain_once())
        if round_ == 2:
            agent = make_agent()  # a restart reads what was written
    reports = hashlib.sha256()
    for message in transport.published:
        reports.update(hashlib.sha256(message.topic.encode() + b"\x00" + message.payload).digest())
    assert len(transport.published) >= 10
    assert (writes.hexdigest(), reports.hexdigest()) == (PINNED_WRITES, PINNED_REPORTS)
