"""Commit receipts on the agent: sent is not counted; a report leaves the outbox only with its receipt."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent.core import Agent
from agent.errors import TransportError
from agent.outbox import receipt_wait
from agent.publisher import Publisher, ReceiptPolicy
from agent.state import LedgerEntry, OutboxEntry
from agent.transport import MemoryTransport, Published
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from tests.support.clocks import FakeClock

DAY = 86_400.0
POLICY = ReceiptPolicy(timeout=10.0, cap=40.0)


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


def _statuses(agent: Agent) -> list[str]:
    return sorted(e.status for e in agent.ledger())


async def _run(publisher: Publisher, clock: FakeClock, seconds: float) -> None:
    task = asyncio.create_task(publisher.run())
    publisher.kick()
    await clock.advance(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_counted_receipt_empties_the_outbox(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Each report is published once with its id as correlation; the receipt ends it as counted."""
    agent = _agent_with_reports(make_agent, clock)
    ids = {p.entry.report_id for p in agent.outbox()}
    transport = MemoryTransport(answer=lambda m: Receipt(m.correlation or b"?", counted=True))
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)
    asyncio.run(_run(publisher, clock, 5.0))
    assert agent.outbox() == []
    assert {m.correlation for m in transport.published} == ids
    assert all(m.response_topic == "receipts/1" for m in transport.published)
    assert len(transport.published) == 3
    assert _statuses(agent) == ["counted"] * 3
    assert publisher.statistics().settled == 3


def test_without_a_receipt_the_same_bytes_are_resent_with_backoff(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """A PUBACKed report without a receipt stays "sent", is resent identically after its wait, then counted."""
    agent = _agent_with_reports(make_agent, clock)
    before = {p.entry.report_id: p.entry.payload for p in agent.outbox()}
    silent = True

    def answer(m: Published) -> Receipt | None:
        return None if silent else Receipt(m.correlation or b"?", counted=True)

    transport = MemoryTransport(answer=answer)
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> None:
        nonlocal silent
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        assert len(transport.published) == 3
        assert len(agent.outbox()) == 3
        assert _statuses(agent) == ["sent"] * 3
        assert all(p.entry.attempts == 1 for p in agent.outbox())
        # Waits 10..15 s, then 20..30 s: by 1 + 15 + 30 s each was sent three times.
        await clock.advance(46.0)
        assert len(transport.published) == 9
        silent = False
        await clock.advance(200.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert agent.outbox() == []
    assert _statuses(agent) == ["counted"] * 3
    for m in transport.published:
        assert m.payload == before[m.correlation or b""]  # never re-randomized


def test_refused_receipt_ends_the_report_with_its_reason(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """A refusal is final: out of the outbox, the ledger names the reason, no resend."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport(answer=lambda m: Receipt(m.correlation or b"?", counted=False, reason="period-expired"))
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)
    asyncio.run(_run(publisher, clock, 100.0))
    assert agent.outbox() == []
    assert len(transport.published) == 3
    assert _statuses(agent) == ["refused: period-expired"] * 3


def test_sent_state_survives_a_restart(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """The send time and count are sealed with the outbox: a restarted agent knows what waits for a receipt."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport()  # never answers
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)
    asyncio.run(_run(publisher, clock, 1.0))
    again = make_agent()
    assert [p.entry.attempts for p in again.outbox()] == [1, 1, 1]
    assert all(p.entry.sent_at > 0 for p in again.outbox())
    due, later = again.due(clock.time(), POLICY.timeout, POLICY.cap)
    assert due == []
    assert later is not None
    assert clock.time() + POLICY.timeout - 1.0 <= later <= clock.time() + 1.5 * POLICY.timeout
    # A receipt for a report the agent already settled, or never sent, changes nothing.
    assert again.settle([Receipt(b"\x00" * 16, counted=True)]) == 0


def test_a_broken_connection_is_replaced_and_receipts_go_to_the_new_topic(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """After a disconnect the reports are resent from a new connection with a new response topic."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport()
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(1.0)
        transport.disconnect()
        transport.answer = lambda m: Receipt(m.correlation or b"?", counted=True)
        await clock.advance(100.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert agent.outbox() == []
    assert transport.connections >= 2
    topics = {m.response_topic for m in transport.published}
    assert len(topics) >= 2


def test_old_state_files_without_send_fields_still_load() -> None:
    """Outbox and ledger entries written before receipts read as never sent and as "sent"."""
    entry = OutboxEntry(
        report_id=b"r" * 16, period=3, payload=b"x", records=1, epsilon=1.0, created=5.0, day=1,
        epsilon_today=1.0, epsilon_total=1.0,
    )  # fmt: skip
    plain = entry.to_plain()
    del plain["sent_at"], plain["attempts"]
    restored = OutboxEntry.from_plain(plain, "outbox[0]")
    assert (restored.sent_at, restored.attempts) == (0.0, 0)
    ledger = LedgerEntry(b"r" * 16, "flag", 3, [1], 1.0, 1, 1.0, 1.0, 5.0).to_plain()
    del ledger["status"]
    assert LedgerEntry.from_plain(ledger, "ledger").status == "sent"
    ledger["status"] = "lost"
    with pytest.raises(ValueError, match=r"ledger\.status"):
        LedgerEntry.from_plain(ledger, "ledger")


@pytest.mark.parametrize("attempts", range(1, 9))
def test_receipt_wait_doubles_up_to_the_cap_with_jitter(attempts: int) -> None:
    """The wait lies in [c, 1.5 c] with c = min(cap, timeout * 2**(attempts - 1)) and varies by report."""
    ceiling = min(40.0, 10.0 * 2 ** (attempts - 1))
    waits = set()
    for i in range(20):
        e = OutboxEntry(bytes([i]) * 16, 0, b"", 0, 0.0, 0.0, 0, 0.0, 0.0, sent_at=1.0, attempts=attempts)
        waits.add(receipt_wait(e, 10.0, 40.0))
    assert all(ceiling <= w <= 1.5 * ceiling for w in waits)
    assert len(waits) > 1


def test_a_session_leaves_no_task_behind(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """The receipt listener and the wait's alarm belong to their session: none outlives it, whether the
    connection breaks (the session raises the TransportError itself) or the outbox empties."""
    agent = _agent_with_reports(make_agent, clock)
    transport = MemoryTransport()  # answers nothing until told to
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), receipts=POLICY)

    async def scenario() -> tuple[set[str], set[asyncio.Task[object]], int, set[asyncio.Task[object]]]:
        session = asyncio.create_task(publisher.receipt_session())
        await clock.advance(1.0)  # sent; waiting for receipts, with an alarm for the resend
        during = {t.get_name() for t in asyncio.all_tasks()}
        transport.disconnect()
        with pytest.raises(TransportError):
            await session
        after_break = asyncio.all_tasks() - {asyncio.current_task()}
        transport.answer = lambda m: Receipt(m.correlation or b"?", counted=True)
        session = asyncio.create_task(publisher.receipt_session())
        await clock.advance(100.0)
        settled = await session
        return during, after_break, settled, asyncio.all_tasks() - {asyncio.current_task()}

    during, after_break, settled, after_end = asyncio.run(scenario())
    assert {"receipts", "receipt-wait"} <= during
    assert after_break == set()
    assert settled == 3
    assert after_end == set()
    assert agent.outbox() == []
