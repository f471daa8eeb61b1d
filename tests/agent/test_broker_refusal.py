"""The broker's word on the agent: a refused publish is in the ledger and waits; a busy broker is backed off from.

The real broker's side (Mosquitto's ACL answering PUBACK 0x87) is
tests/deploy/test_broker_word.py; the reconnect schedule against a broker that sends
DISCONNECT 0x89 is tests/agent/test_busy_broker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from agent.core import Agent
from agent.errors import TransportError
from agent.publisher import Publisher, ReceiptPolicy
from agent.transport import BrokerBusyError, MemoryTransport, ReceiptConnection
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from runtime.backoff import Backoff
from tests.support.clocks import FakeClock

DAY = 86_400.0
POLICY = ReceiptPolicy(timeout=10.0, cap=40.0)
REFUSED = "refused by the broker: not authorized"


def _agent_with_reports(make_agent: Callable[..., Agent], clock: FakeClock) -> Agent:
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("procs", "bash")
    agent.record("seconds", 30)
    clock.set(clock.time() + DAY)
    agent.collect()
    assert len(agent.outbox()) == 3
    return agent


def test_a_refused_publish_is_in_the_ledger_and_waits_its_turn(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """The refused report stays (ε is spent), is not re-sent before its wait, and is counted once allowed."""
    agent = _agent_with_reports(make_agent, clock)
    flag = next(p for p in agent.outbox() if p.use_case == "flag")
    attempts: list[str] = []
    allowed = False

    def refuse(topic: str) -> str | None:
        attempts.append(topic)
        return None if allowed or not topic.endswith("/flag") else "not authorized"

    transport = MemoryTransport(answer=lambda m: Receipt(m.correlation or b"?", counted=True), refuse=refuse)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> None:
        nonlocal allowed
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        assert [p.entry.report_id for p in agent.outbox()] == [flag.entry.report_id]
        assert agent.outbox()[0].entry.attempts == 1
        status = {e.report_id: e.status for e in agent.ledger()}
        assert status.pop(flag.entry.report_id) == REFUSED
        assert set(status.values()) == {"counted"}
        stats = publisher.statistics()
        assert (stats.refused_by_broker, stats.failures, stats.connections) == (1, 0, 1)
        # Not retried blindly: nothing is sent again before the receipt wait (10..15 s).
        await clock.advance(8.0)
        assert attempts.count(flag.topic) == 1
        # The ACL is fixed: the next try goes through and the collector counts it.
        allowed = True
        await clock.advance(60.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert agent.outbox() == []
    assert attempts.count(flag.topic) == 2
    assert {e.status for e in agent.ledger()} == {"counted"}


def test_a_second_refusal_waits_twice_as_long(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """The waits double per refused send up to the cap, as for a report without a receipt."""
    agent = _agent_with_reports(make_agent, clock)
    sent_at: list[float] = []

    def refuse(topic: str) -> str | None:
        if topic.endswith("/flag"):
            sent_at.append(clock.time())
            return "not authorized"
        return None

    transport = MemoryTransport(answer=lambda m: Receipt(m.correlation or b"?", counted=True), refuse=refuse)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(2), receipts=POLICY)

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(200.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert len(gaps) >= 3
    # Wait n in [c, 1.5 c] with c = min(40, 10 * 2**(n-1)) (agent.outbox.receipt_wait).
    for n, gap in enumerate(gaps, start=1):
        ceiling = min(40.0, 10.0 * 2 ** (n - 1))
        assert ceiling <= gap <= 1.5 * ceiling + 1e-6, (n, gaps)
    assert {e.status for e in agent.ledger() if e.use_case == "flag"} == {REFUSED}


@dataclass
class _NoService(MemoryTransport):
    """Every connection fails at once: with a busy broker's reason code, or without one."""

    busy: bool = False

    @contextlib.asynccontextmanager
    async def connect_receipts(self) -> AsyncIterator[ReceiptConnection]:
        self.connections += 1
        if self.busy:
            raise BrokerBusyError("the broker is busy (reason code 0x89)")
        raise TransportError("the connection ended before anything was delivered")
        yield  # an async generator, as the base's


@pytest.mark.parametrize("busy", [False, True])
def test_connections_that_deliver_nothing_never_reset_the_backoff(
    make_agent: Callable[..., Agent], clock: FakeClock, monkeypatch: pytest.MonkeyPatch, busy: bool
) -> None:
    """The waits double up to the cap (0.05 s .. 0.8 s), and a busy broker's grow four times as fast."""
    agent = _agent_with_reports(make_agent, clock)
    sleeps: list[float] = []  # the publisher's backoff waits, as computed
    fake_sleep = clock.sleep

    async def recording(seconds: float) -> None:
        sleeps.append(seconds)
        await fake_sleep(seconds)

    monkeypatch.setattr(clock, "sleep", recording)
    transport = _NoService(busy=busy)
    backoff = Backoff(initial=0.05, cap=0.8)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(3), backoff=backoff, receipts=POLICY)

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(10.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    ceilings = [0.2, 0.8] if busy else [0.05, 0.1, 0.2, 0.4, 0.8]
    assert len(sleeps) >= len(ceilings) + 3
    assert transport.connections == len(sleeps) or transport.connections == len(sleeps) + 1
    for ceiling, slept in zip(ceilings, sleeps, strict=False):
        assert ceiling / 2 <= slept <= ceiling, sleeps
    assert all(0.4 <= s <= 0.8 for s in sleeps[len(ceilings) - 1 :]), sleeps
