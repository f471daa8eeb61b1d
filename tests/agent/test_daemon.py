"""The daemon's tasks on a fake clock: UTC-aligned jittered cycles, coalescing, consent, probes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack

from agent.config import ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.probes import ProcessNamesProbe, UptimeProbe
from agent.publisher import ReceiptPolicy
from agent.schedule import next_cycle_after, plausible_next
from agent.transport import MemoryTransport
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from tests.support.clocks import FakeClock

HOUR = 3_600.0
DAY = 86_400.0


class _Done(Exception):  # noqa: N818 - a signal to leave the task group, not an error
    """Ends a scenario."""


def _run(daemon: Daemon, body: Callable[[], Awaitable[None]]) -> None:
    """Run the daemon's tasks in a task group while ``body`` drives the fake clock."""

    async def main() -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                daemon.start(tg)
                await body()
                raise _Done
        except* _Done:
            pass

    asyncio.run(main())


def _daemon(agent: Agent, clock: FakeClock, transport: MemoryTransport, **kw: object) -> Daemon:
    schedule = ScheduleConfig(jitter_seconds=600.0, probe_interval_seconds=300.0)
    return Daemon(agent, transport, clock=clock, rng=SeededRandom(3), schedule=schedule, **kw)  # type: ignore[arg-type]


def test_next_cycle_is_utc_aligned_with_bounded_jitter() -> None:
    """Cycles fall in [slot, slot + jitter) for the slots 00, 06, 12, 18 UTC."""
    rng = SeededRandom(5)
    base = 1_700_006_400.0  # 00:00 UTC
    for offset in (0.0, 1.0, 5 * HOUR, 6 * HOUR - 1, 6 * HOUR, 23 * HOUR):
        t = next_cycle_after(base + offset, interval_hours=6, jitter_seconds=900.0, rng=rng)
        slot = t - t % (6 * HOUR)
        assert slot % (6 * HOUR) == 0
        assert slot > base + offset - 1e-9
        assert slot - (base + offset) <= 6 * HOUR
        assert 0 <= t - slot < 900.0
    assert not plausible_next(base + 3 * DAY, base, interval_hours=6, jitter_seconds=900.0)


def test_cycles_every_six_hours_with_jitter(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Over a day the daemon runs four cycles, each within its slot's jitter window, and publishes."""
    agent = make_agent()
    agent.grant_consent()
    transport = MemoryTransport()
    daemon = _daemon(agent, clock, transport)
    times: list[float] = []
    original = daemon.run_cycle

    def spy() -> None:
        times.append(clock.time())
        original()

    daemon.run_cycle = spy  # type: ignore[method-assign]

    async def body() -> None:
        for _ in range(24):
            agent.record("seconds", 60)
            await clock.advance(HOUR)

    _run(daemon, body)
    assert len(times) == 4
    for t in times:
        assert 0 <= t % (6 * HOUR) < 600.0
    assert agent.load_schedule().cycles == 4
    assert len(transport.published) >= 3  # one "seconds" report per closed 6-hour period
    assert agent.outbox() == []


def test_missed_cycles_coalesce_into_one(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """After three days asleep, one cycle runs (not twelve), then the schedule resumes."""
    agent = make_agent()
    agent.grant_consent()
    daemon = _daemon(agent, clock, MemoryTransport())

    async def body() -> None:
        await clock.settle()
        clock.set(clock.time() + 3 * DAY)  # the machine was suspended
        await clock.settle()
        assert agent.load_schedule().cycles == 1
        await clock.advance(6 * HOUR)
        assert agent.load_schedule().cycles == 2

    _run(daemon, body)


def test_due_cycle_from_before_a_restart_runs_at_start(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """A cycle that fell due while the agent was stopped runs as soon as it starts again."""
    agent = make_agent()
    agent.grant_consent()
    doc = agent.load_schedule()
    doc.next_cycle = clock.time() - HOUR
    agent.save_schedule(doc)
    daemon = _daemon(agent, clock, MemoryTransport())

    async def body() -> None:
        await clock.settle()
        assert agent.load_schedule().cycles == 1

    _run(daemon, body)


def test_without_consent_nothing_is_recorded_or_sent(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Probes and cycles run, but before the opt-in nothing is written or published."""
    uptime = tmp_path / "uptime"
    uptime.write_text("100.0 50.0\n")
    agent = make_agent()
    transport = MemoryTransport()
    daemon = _daemon(agent, clock, transport, probes=[UptimeProbe("seconds", uptime)])

    async def body() -> None:
        for i in range(48):
            uptime.write_text(f"{100.0 + (i + 1) * HOUR} 50.0\n")
            await clock.advance(HOUR)

    _run(daemon, body)
    assert transport.published == []
    assert transport.connections == 0
    assert list((tmp_path / "state").glob("*.sealed")) == []


def test_probes_feed_their_use_cases(make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path) -> None:
    """The uptime and process-name probes record into their use cases; their reports are published."""
    uptime = tmp_path / "uptime"
    uptime.write_text("100.0 50.0\n")
    proc = tmp_path / "proc"
    for pid, name in ((1, "init"), (42, "sshd"), (43, "sshd"), (77, "bash")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(name + "\n")
    (proc / "self").mkdir()
    agent = make_agent()
    agent.grant_consent()
    transport = MemoryTransport()
    names = ProcessNamesProbe("procs", proc=proc)
    probes = [UptimeProbe("seconds", uptime), names]
    assert names.sample(0.0) == [("procs", "bash", None), ("procs", "init", None), ("procs", "sshd", None)]
    daemon = _daemon(agent, clock, transport, probes=probes)

    async def body() -> None:
        for i in range(2 * 24 * 4):
            uptime.write_text(f"{100.0 + (i + 1) * 900.0} 50.0\n")
            await clock.advance(900.0)

    _run(daemon, body)
    topics = {m.topic for m in transport.published}
    assert topics == {"ldp/v1/reports/seconds", "ldp/v1/reports/procs"}
    procs = [msgpack.unpackb(m.payload) for m in transport.published if m.topic.endswith("procs")]
    assert all(len(b["r"]) == 3 for b in procs)  # three distinct names a day, within the limit of 5


def test_with_receipts_the_daemon_keeps_reports_until_counted(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Over a day with receipts on, every report is published with its id and ends "counted" in the ledger."""
    agent = make_agent()
    agent.grant_consent()
    transport = MemoryTransport(answer=lambda m: Receipt(m.correlation or b"?", counted=True))
    daemon = _daemon(agent, clock, transport, receipts=ReceiptPolicy(timeout=60.0, cap=600.0))

    async def body() -> None:
        for _ in range(24):
            agent.record("seconds", 60)
            await clock.advance(HOUR)

    _run(daemon, body)
    assert len(transport.published) >= 3
    assert all(m.correlation is not None and m.response_topic for m in transport.published)
    assert agent.outbox() == []
    assert {e.status for e in agent.ledger()} == {"counted"}
    assert {e.report_id for e in agent.ledger()} == {m.correlation for m in transport.published}
