"""The publisher with several brokers (agent.publisher): the primary first, the next on failure,
backoff per round, back to the primary on the next round, reports re-sent through the broker
that serves, and the ledger naming the broker that carried each report."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent.core import Agent
from agent.publisher import Publisher, ReceiptPolicy
from agent.transport import MemoryTransport, Published, Route
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from runtime.backoff import Backoff
from tests.support.clocks import FakeClock

DAY = 86_400.0
POLICY = ReceiptPolicy(timeout=10.0, cap=40.0)


def _count(m: Published) -> Receipt:
    return Receipt(m.correlation or b"?", counted=True)


def _stage(agent: Agent, clock: FakeClock) -> set[bytes]:
    agent.record("flag", 1)
    agent.record("procs", "bash")
    agent.record("seconds", 30)
    clock.set(clock.time() + DAY)
    agent.collect()
    return {p.entry.report_id for p in agent.outbox()}


def _routes(*transports: MemoryTransport) -> list[Route]:
    return [Route(t.address, t) for t in transports]


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_with_the_primary_down_reports_go_through_the_next_broker_at_once(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    agent = make_agent()
    agent.grant_consent()
    ids = _stage(agent, clock)
    primary = MemoryTransport(address="a.example:8883", online=False)
    second = MemoryTransport(address="b.example:8883", answer=_count)
    publisher = Publisher(
        agent, _routes(primary, second), clock=clock, rng=SeededRandom(1), receipts=POLICY, backoff=Backoff()
    )
    assert publisher.brokers == ("a.example:8883", "b.example:8883")

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        # No time passes: the failover waits no backoff (the backoff is per round).
        await clock.advance(0.0)
        assert agent.outbox() == []
        await _stop(task)

    asyncio.run(scenario())
    assert {m.correlation for m in second.published} == ids
    assert {(e.status, e.broker) for e in agent.ledger()} == {("counted", "b.example:8883")}
    assert publisher.statistics().failures == 1


def test_the_next_round_starts_at_the_primary_again(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    agent = make_agent()
    agent.grant_consent()
    first = _stage(agent, clock)
    primary = MemoryTransport(address="a.example:8883", online=False, answer=_count)
    second = MemoryTransport(address="b.example:8883", answer=_count)
    publisher = Publisher(agent, _routes(primary, second), clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> set[bytes]:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        assert agent.outbox() == []
        primary.online = True
        later = _stage(agent, clock)
        publisher.kick()
        await clock.advance(1.0)
        assert agent.outbox() == []
        await _stop(task)
        return later

    later = asyncio.run(scenario())
    assert {m.correlation for m in second.published} == first
    assert {m.correlation for m in primary.published} == later
    brokers = {e.report_id: e.broker for e in agent.ledger()}
    assert {brokers[i] for i in first} == {"b.example:8883"}
    assert {brokers[i] for i in later} == {"a.example:8883"}


def test_when_every_broker_fails_the_round_waits_its_backoff_then_starts_at_the_primary(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    agent = make_agent()
    agent.grant_consent()
    _stage(agent, clock)
    primary = MemoryTransport(address="a.example:8883", online=False, answer=_count)
    second = MemoryTransport(address="b.example:8883", online=False, answer=_count)
    publisher = Publisher(
        agent,
        _routes(primary, second),
        clock=clock,
        rng=SeededRandom(1),
        receipts=POLICY,
        backoff=Backoff(initial=8.0, cap=8.0),
    )

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(3.9)  # the first wait is 4 to 8 s
        assert publisher.statistics().failures == 2  # one round: each broker once
        primary.online = True
        await clock.advance(4.2)
        assert agent.outbox() == []
        await _stop(task)

    asyncio.run(scenario())
    assert second.published == []
    assert {e.broker for e in agent.ledger()} == {"a.example:8883"}


def test_reports_waiting_for_receipts_are_sent_again_through_the_next_broker(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Sent through the primary, which then fails before any receipt: the reports go through the
    next broker at once, not after their receipt wait, and are counted there."""
    agent = make_agent()
    agent.grant_consent()
    ids = _stage(agent, clock)
    primary = MemoryTransport(address="a.example:8883")  # acknowledges, never answers
    second = MemoryTransport(address="b.example:8883", answer=_count)
    publisher = Publisher(agent, _routes(primary, second), clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        assert {e.status for e in agent.ledger()} == {"sent"}
        assert {e.broker for e in agent.ledger()} == {"a.example:8883"}
        primary.online = False
        primary.disconnect()
        await clock.advance(0.0)  # less than any receipt wait (10 s) or backoff
        assert agent.outbox() == []
        await _stop(task)

    asyncio.run(scenario())
    assert {m.correlation for m in primary.published} == ids
    assert {m.correlation for m in second.published} == ids
    assert all(m.response_topic == "receipts/1" for m in second.published)  # its own connection's topic
    assert {(e.status, e.broker) for e in agent.ledger()} == {("counted", "b.example:8883")}


def test_a_reconnection_to_the_same_broker_keeps_the_receipt_wait(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Only a failover re-sends at once: a new connection to the same broker waits the receipt wait."""
    agent = make_agent()
    agent.grant_consent()
    _stage(agent, clock)
    only = MemoryTransport(address="a.example:8883")
    publisher = Publisher(agent, _routes(only), clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        assert len(only.published) == 3
        only.disconnect()
        await clock.advance(5.0)  # reconnected (backoff under 1 s), receipt wait not over (10 s)
        assert only.connections == 2
        assert len(only.published) == 3
        await _stop(task)

    asyncio.run(scenario())


def test_without_receipts_the_ledger_names_the_broker_that_acknowledged(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    agent = make_agent()
    agent.grant_consent()
    ids = _stage(agent, clock)
    primary = MemoryTransport(address="a.example:8883", fail_after=1)
    second = MemoryTransport(address="b.example:8883")
    publisher = Publisher(agent, _routes(primary, second), clock=clock, rng=SeededRandom(1))

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(0.0)
        assert agent.outbox() == []
        await _stop(task)

    asyncio.run(scenario())
    by_broker = {e.report_id: e.broker for e in agent.ledger()}
    assert set(by_broker) == ids
    assert sorted(by_broker.values()) == ["a.example:8883", "b.example:8883", "b.example:8883"]
