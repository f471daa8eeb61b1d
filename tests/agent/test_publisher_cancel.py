"""SIGTERM always ends the publisher, even when its cancellation meets an acknowledgement.

aiomqtt waits for every acknowledgement through ``asyncio.wait_for``; on Python 3.11 that call
returns the awaited result, and drops the cancellation, when both arrive in the same turn of the
event loop. The publisher then went back to waiting for work and the daemon's task group waited
for it forever after SIGTERM. These tests make both arrive in one turn, deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from agent.core import Agent
from agent.publisher import Publisher, ReceiptPolicy
from agent.transport import Connection, MemoryTransport, ReceiptConnection
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from tests.support.clocks import FakeClock

DAY = 86_400.0
LOOP_TURNS = 1_000
"""Turns of the event loop given to the cancelled task to end (a count, never a time)."""


class _AckedLater:
    """Wraps a memory transport: each publish waits, through ``asyncio.wait_for`` as aiomqtt does,
    for an acknowledgement the test releases."""

    def __init__(self, inner: MemoryTransport) -> None:
        self.inner = inner
        self.acks: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()

    async def _acknowledged(self) -> None:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.put_nowait(ack)
        await asyncio.wait_for(ack, timeout=3600.0)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        async with self.inner.connect() as conn:
            outer = self

            class _Conn:
                async def publish(self, topic: str, payload: bytes) -> None:
                    await outer._acknowledged()
                    await conn.publish(topic, payload)

            yield _Conn()

    @contextlib.asynccontextmanager
    async def connect_receipts(self) -> AsyncIterator[ReceiptConnection]:
        async with self.inner.connect_receipts() as conn:
            outer = self

            class _Conn:
                @property
                def response_topic(self) -> str:
                    return conn.response_topic

                async def publish(self, topic: str, payload: bytes, *, correlation: bytes) -> None:
                    await outer._acknowledged()
                    await conn.publish(topic, payload, correlation=correlation)

                async def receipts(self) -> list[Receipt]:
                    return await conn.receipts()

            yield _Conn()


def _agent_with_reports(make_agent: Callable[..., Agent], clock: FakeClock) -> Agent:
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    assert len(agent.outbox()) == 2
    return agent


async def _cancel_at_an_acknowledgement(publisher: Publisher, transport: _AckedLater) -> asyncio.Task[None]:
    task = asyncio.create_task(publisher.run())
    publisher.kick()
    ack = await transport.acks.get()  # the publisher waits for its first acknowledgement
    ack.set_result(None)  # the acknowledgement and SIGTERM's cancellation in the same turn
    task.cancel()
    for _ in range(LOOP_TURNS):
        if task.done():
            break
        await asyncio.sleep(0)
    if not task.done():
        task.cancel()  # end the test's loop cleanly; the assertion below reports the failure
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise AssertionError("the publisher went on after its cancellation")
    return task


def test_a_cancellation_at_an_acknowledgement_ends_the_publisher(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Without commit receipts: the cancelled publisher ends, and the acknowledged report is out."""
    agent = _agent_with_reports(make_agent, clock)
    transport = _AckedLater(MemoryTransport())
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1))

    async def scenario() -> None:
        task = await _cancel_at_an_acknowledgement(publisher, transport)
        assert task.cancelled()

    asyncio.run(scenario())
    assert len(agent.outbox()) == 1  # the first report was acknowledged, the second never sent


def test_a_cancellation_at_an_acknowledgement_ends_a_receipt_session(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """With commit receipts: the cancelled session ends instead of waiting for receipts."""
    agent = _agent_with_reports(make_agent, clock)
    transport = _AckedLater(MemoryTransport())
    publisher = Publisher(
        agent, transport, clock=clock, rng=SeededRandom(1), receipts=ReceiptPolicy(timeout=10.0, cap=40.0)
    )

    async def scenario() -> None:
        task = await _cancel_at_an_acknowledgement(publisher, transport)
        assert task.cancelled()

    asyncio.run(scenario())
    assert len(agent.outbox()) == 2  # sent but not settled: both wait for their receipts
