"""End to end with a Unicode alphabet: agents -> a real Mosquitto -> the collector -> the words released.

Fifteen agents record yesterday's words of a use case whose alphabet has "ñ", "ß" and "ã"
(``parameters.alphabet``), some of them typing "não" decomposed (a, then U+0303 COMBINING
TILDE); a word with a letter outside the alphabet is refused at ``record`` and never sent. The
agents publish through Mosquitto with commit receipts to a collector process, and the
collector's estimate, read from its store as ``ldp-collector estimate`` reads it, releases
"año", "straße" and "não" with their counts: every report is folded under one spelling of
each word (NFC on both sides, protocol/sfp.py "Encoding"). Every coin is seeded, so the reports
and the collector's aggregate are the same on every run.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.config import BrokerConfig
from agent.core import Agent
from agent.errors import ValueRefusedError
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from collector.config import load_config
from collector.estimation import compute_estimate
from collector.results import ReleaseDecision
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from runtime.backoff import Backoff
from tests.collector.processes import CollectorProcess, write_config
from tests.collector.support import run_async
from tests.support.broker import Broker

DAY = 86_400.0
AGENTS = 15
WORDS_PER_AGENT = 20
SETTLE_SECONDS = 120.0
"""A hang guard: every report is committed long before (the collector commits every 50 ms)."""

REGISTRY = """
format = 1
salt = "5d0c6a1f0f3e4b9a8c7d2e1f00112233"

[use_cases.palabras]
description = "New words in Spanish, German and Portuguese."
mechanism = "sfp"
# A report costs ε + ε' = 20; high ε and 1,024-wide sketches let 300 reports find three words.
epsilon = 20
period = "1d"
daily_limit = 20
lifetime_epsilon = 1_000
[use_cases.palabras.parameters]
epsilon = 8
epsilon_fragment = 12
k = 4
m = 1_024
k_fragment = 4
m_fragment = 1_024
alphabet = "abcdefghijklmnopqrstuvwxyzñßãé' "
[use_cases.palabras.collector]
min_reports = 10
release_threshold = 20
"""

TRUTH = {"año": 100, "straße": 100, "não": 100}


class _OffsetClock:
    """Real time shifted by ``offset`` (the agents record "yesterday", then collect now)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.time()))


def _values() -> list[list[str]]:
    """Each agent's words, 20 apiece; every other "não" typed decomposed."""
    words = [w for w, count in TRUTH.items() for _ in range(count)]
    words = [("na\u0303o" if w == "não" and i % 2 else w) for i, w in enumerate(words)]
    return [words[i::AGENTS] for i in range(AGENTS)]


async def _publish_all(agents: list[Agent], clock: _OffsetClock, port: int) -> None:
    """Each agent's publisher until its outbox is empty: every report committed by the collector."""
    broker = BrokerConfig(
        host="127.0.0.1",
        port=port,
        tls=False,
        publish_timeout=10.0,
        receipt_timeout_seconds=1.0,
        receipt_backoff_max=4.0,
    )
    publishers = [
        Publisher(
            agent,
            MqttTransport(broker, SeededRandom(200 + i)),
            clock=clock,
            rng=SeededRandom(300 + i),
            backoff=Backoff(initial=0.2, cap=2.0),
            receipts=ReceiptPolicy(timeout=1.0, cap=4.0),
        )
        for i, agent in enumerate(agents)
    ]
    tasks = [asyncio.create_task(p.run()) for p in publishers]
    for p in publishers:
        p.kick()
    deadline = time.monotonic() + SETTLE_SECONDS
    try:
        while any(a.outbox() for a in agents) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@run_async
async def test_unicode_words_travel_from_agents_to_a_released_estimate(mosquitto: Broker, tmp_path: Path) -> None:
    """ "año", "straße" and "não" (half of it decomposed) are released with their counts; "für" is refused."""
    registry_path = tmp_path / "usecases.toml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    config_path = write_config(tmp_path / "collector", registry=registry_path, host="127.0.0.1", port=mosquitto.port)
    collector = CollectorProcess(config_path, log=tmp_path / "collector.log")
    await asyncio.to_thread(collector.start)
    try:
        clock = _OffsetClock(-DAY)
        agents = []
        for i, words in enumerate(_values()):
            agent = Agent(
                registry=registry,
                state_dir=tmp_path / f"agent-{i}",
                sealer=Sealer(bytes([i + 1]) * 32),
                clock=clock,
                rng=SeededRandom(100 + i),
            )
            agent.grant_consent()
            for word in words:
                assert agent.record("palabras", word).outcome == "recorded"
            with pytest.raises(ValueRefusedError, match="U\\+00FC LATIN SMALL LETTER U WITH DIAERESIS"):
                agent.record("palabras", "für")
            agents.append(agent)
        assert sum(len(w) for w in _values()) == sum(TRUTH.values()) == AGENTS * WORDS_PER_AGENT
        clock.offset = 0.0
        for agent in agents:
            agent.collect()
            assert [p.entry.records for p in agent.outbox()] == [WORDS_PER_AGENT]
        await _publish_all(agents, clock, mosquitto.port)
        assert not any(a.outbox() for a in agents), "some reports were never committed"
        assert all(e.status == "counted" for a in agents for e in a.ledger())
    finally:
        await asyncio.to_thread(collector.stop)
    result = compute_estimate(load_config(config_path), "palabras")
    assert result.released, result.withheld_reason
    assert result.reports == AGENTS
    estimate = result.estimate
    assert isinstance(estimate, ReleaseDecision)
    found = {item.value: (item.count, item.standard_error) for item in estimate.items}
    assert set(found) == set(TRUTH)
    for word, count in TRUTH.items():
        estimated, se = found[word]
        assert estimated is not None
        assert se is not None
        assert abs(estimated - count) <= 5 * se, (word, estimated, se)
    assert estimate.alphabet == "abcdefghijklmnopqrstuvwxyzñßãé' "
