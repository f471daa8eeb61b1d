"""Publishing through the transport seam: acknowledged-only removal, identical retries, backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent.core import Agent
from agent.errors import TransportError
from agent.publisher import Publisher
from agent.transport import MemoryTransport
from protocol.randomness import SeededRandom
from runtime.backoff import Backoff
from tests.support.clocks import FakeClock

DAY = 86_400.0


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


def test_report_leaves_outbox_only_when_acknowledged(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """A delivered but unacknowledged report stays; the retry sends the identical bytes."""
    agent = _agent_with_reports(make_agent, clock)
    before = [p.entry.payload for p in agent.outbox()]
    transport = MemoryTransport(drop_acks=True)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1))
    with pytest.raises(TransportError):
        asyncio.run(publisher.drain_once())
    assert [p.entry.payload for p in agent.outbox()] == before
    transport.drop_acks = False
    assert asyncio.run(publisher.drain_once()) == 3
    assert agent.outbox() == []
    sent = [m.payload for m in transport.published]
    assert sent[0] == before[0]  # the unacknowledged first try
    assert sorted(sent[1:]) == sorted(before)  # the retry: the same bytes, not re-randomized
    assert len(agent.ledger()) == 3


def test_acknowledged_part_of_a_batch_is_kept_out(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """When the connection breaks mid-batch, what was acknowledged is out of the outbox and in the ledger."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport(fail_after=1)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1))
    with pytest.raises(TransportError):
        asyncio.run(publisher.drain_once())
    assert len(agent.outbox()) == 2
    assert len(agent.ledger()) == 1
    assert publisher.statistics().acknowledged == 1


def test_broker_down_then_back(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """While the broker is down reports wait; once it is back each goes out exactly once."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport(online=False)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), backoff=Backoff(initial=1.0, cap=8.0))

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(60.0)
        assert publisher.statistics().failures >= 5
        assert len(agent.outbox()) == 3
        transport.online = True
        await clock.advance(10.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert agent.outbox() == []
    assert len(transport.published) == 3
    assert len({m.payload for m in transport.published}) == 3
    assert transport.connections == 1
