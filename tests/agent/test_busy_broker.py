"""The agent's reconnects against a broker that grants the receipt subscription and then sends DISCONNECT 0x89.

The agent's real MQTT client (agent.mqtt over aiomqtt) talks to the scripted broker of
tests/collector/fake_broker.py: CONNACK, SUBACK, then DISCONNECT "server busy" on every
connection. No report is ever acknowledged, so the backoff never resets, and the busy reason
makes it grow four times as fast, to the cap. The publisher's waits are recorded through its
clock as computed; nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from agent.config import BrokerConfig
from agent.core import Agent
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from protocol.randomness import SeededRandom
from runtime.backoff import Backoff
from tests.collector.fake_broker import running_fake_broker
from tests.support.clocks import FakeClock

DAY = 86_400.0
CONNECTIONS = 8
MIN_S, MAX_S = 0.05, 0.8
DEADLINE = 60.0


class _RecordingClock:
    """The agent's fake wall clock; each backoff sleep is recorded and returns at once, until
    ``CONNECTIONS`` are recorded: then the publisher stays in that sleep, between connections,
    where the test cancels it (cancelling it in the middle of a connection attempt can be lost
    in aiomqtt's wait_for on Python 3.11, and leaves that connection's socket open)."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.sleeps: list[float] = []
        self.parked = asyncio.Event()

    def time(self) -> float:
        return self._clock.time()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) >= CONNECTIONS:
            self.parked.set()
            await asyncio.Event().wait()  # until cancelled
        await asyncio.sleep(0)

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(0)


async def _waits(agent: Agent, clock: FakeClock, reason: int) -> tuple[list[float], int]:
    """The publisher's reconnect waits against a broker disconnecting with ``reason``, and its connections."""
    with running_fake_broker([bytes([0xE0, 1, reason])] * (CONNECTIONS + 2)) as broker:
        config = BrokerConfig(host="127.0.0.1", port=broker.port, tls=False, publish_timeout=DEADLINE)
        recording = _RecordingClock(clock)
        publisher = Publisher(
            agent,
            MqttTransport(config, SeededRandom(5)),
            clock=recording,
            rng=SeededRandom(6),
            backoff=Backoff(initial=MIN_S, cap=MAX_S),
            receipts=ReceiptPolicy(timeout=3600.0, cap=3600.0),
        )
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        try:
            await asyncio.wait_for(recording.parked.wait(), DEADLINE)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stats = publisher.statistics()
    assert stats.acknowledged == 0
    return recording.sleeps[:CONNECTIONS], stats.failures


@pytest.mark.parametrize("reason", [0x89, 0x97])
def test_a_busy_broker_sees_the_agents_gaps_grow_to_the_cap(
    make_agent: Callable[..., Agent], clock: FakeClock, reason: int
) -> None:
    """DISCONNECT 0x89 / 0x97 after every SUBACK: the first wait's ceiling is 0.2 s, every later one the cap."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    assert len(agent.outbox()) == 1
    waits, failures = asyncio.run(_waits(agent, clock, reason))
    assert failures >= CONNECTIONS
    assert 0.1 <= waits[0] <= 0.2, waits
    assert all(MAX_S / 2 <= w <= MAX_S for w in waits[1:]), waits
    # Nothing was delivered: the report is still waiting, never sent.
    assert [p.entry.attempts for p in agent.outbox()] == [0]


def test_without_a_busy_reason_the_gaps_double_to_the_cap(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """DISCONNECT 0x8B (shutting down) after every SUBACK: 0.05, 0.1, 0.2, 0.4, then 0.8 s ceilings."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    waits, _ = asyncio.run(_waits(agent, clock, 0x8B))
    ceilings = [min(MAX_S, MIN_S * 2**n) for n in range(CONNECTIONS)]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)), waits
