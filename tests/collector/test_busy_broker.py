"""The collector's reconnects against a broker that grants the subscription and then sends DISCONNECT.

A session that only reached SUBACK has delivered nothing, so it does not reset the backoff:
the gaps between connections grow to ``reconnect_max_s``, four times as fast when the
DISCONNECT says the server is busy (0x89) or over quota (0x97). The delays are recorded as the
transport computes them (its injected sleep), so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from collector.config import MqttConfig
from collector.mqtt import MqttTransport
from tests.collector.fake_broker import publish, running_fake_broker
from tests.collector.support import run_async

CONNECTIONS = 10
MIN_S, MAX_S = 0.05, 0.8


def _disconnect(reason: int) -> bytes:
    return bytes([0xE0, 1, reason])


async def _gaps(script: list[bytes]) -> list[float]:
    """The reconnect delays the transport computed against a fake broker serving ``script``."""
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)  # the schedule is what is tested, not the waiting

    with running_fake_broker(script) as broker:
        # A keep-alive interval longer than the whole test: no session lasts long enough to count as served.
        config = MqttConfig(
            host="127.0.0.1",
            port=broker.port,
            client_id="busy",
            keepalive_s=600,
            reconnect_min_s=MIN_S,
            reconnect_max_s=MAX_S,
        )
        transport = MqttTransport(config, sleep=record)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections > len(script))
            await asyncio.wait_for(transport.wait_subscribed(), 30)
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)
    return delays[: len(script)]


@pytest.mark.parametrize("reason", [0x89, 0x97])
@run_async
async def test_a_busy_broker_sees_gaps_that_grow_to_the_cap(reason: int) -> None:
    """DISCONNECT 0x89 / 0x97 after every SUBACK: ceilings 0.2 s, then the cap 0.8 s; never a reset."""
    gaps = await _gaps([_disconnect(reason)] * CONNECTIONS)
    assert len(gaps) == CONNECTIONS
    assert 0.1 <= gaps[0] <= 0.2, gaps
    assert all(MAX_S / 2 <= g <= MAX_S for g in gaps[1:]), gaps


@run_async
async def test_sessions_that_deliver_nothing_double_the_gap_to_the_cap() -> None:
    """DISCONNECT without a busy reason (0x8B, shutting down): the gaps double from 0.05 s to the cap."""
    gaps = await _gaps([_disconnect(0x8B)] * CONNECTIONS)
    ceilings = [min(MAX_S, MIN_S * 2**n) for n in range(CONNECTIONS)]
    assert all(c / 2 <= g <= c for g, c in zip(gaps, ceilings, strict=True)), gaps
    # Each gap is at least the one before while below the cap (equal jitter: [c/2, c], then [c, 2c]).
    assert all(a <= b for a, b in itertools.pairwise(gaps[:5])), gaps


@run_async
async def test_a_session_that_received_a_report_resets_the_backoff() -> None:
    """A report on the subscription before the busy DISCONNECT: the next gap starts from the busy ceiling again."""
    report = publish(b"ldp/v1/reports/dev/flag", b"\x90", qos=1)
    gaps = await _gaps([report + _disconnect(0x89)] * CONNECTIONS)
    assert all(0.1 <= g <= 0.2 for g in gaps), gaps
