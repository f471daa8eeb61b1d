"""Failover between two real Mosquitto brokers: the primary is killed (SIGKILL) while reports
wait for their receipts; they are sent again through the other broker, and a counter on both
brokers that answers receipts (as the collector does, folding each report id once) counts every
report of the ledger exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.brokers import broker_order
from agent.config import BrokerConfig
from agent.core import Agent
from agent.errors import TransportError
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.transport import Route
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt, encode_receipts
from runtime.backoff import Backoff
from tests.support.broker import Broker, running_broker
from tests.support.clocks import FakeClock

DAY = 86_400.0
DEADLINE = 120.0
"""Seconds a condition may take before the test fails (a guard against a hang, not a measure)."""


class ReceiptCounter:
    """Subscribed to the reports on several brokers; answers each with a "counted" receipt through
    the broker that delivered it, and counts each report id once (the collector's fold)."""

    def __init__(self, brokers: list[Broker]) -> None:
        self._lock = threading.Lock()
        self.counted: Counter[bytes] = Counter()
        self.deliveries: Counter[tuple[bytes, int]] = Counter()
        self.silent: set[int] = set()
        """Ports of brokers whose deliveries are not answered (receipts lost)."""
        self._clients: list[mqtt.Client] = []
        for broker in brokers:
            subscribed = threading.Event()
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"counter-{broker.port}", protocol=mqtt.MQTTv5)
            client.on_connect = lambda c, *_: c.subscribe("ldp/v1/reports/#", qos=1)
            client.on_subscribe = lambda *_a, ev=subscribed: ev.set()
            client.on_message = self._answer(broker.port)
            client.connect("127.0.0.1", broker.port, keepalive=30)
            client.loop_start()
            if not subscribed.wait(DEADLINE):
                raise AssertionError(f"the counter did not subscribe on port {broker.port}")
            self._clients.append(client)

    def _answer(self, port: int) -> Callable[[mqtt.Client, object, mqtt.MQTTMessage], None]:
        def on_message(client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
            props = msg.properties
            correlation = getattr(props, "CorrelationData", None)
            topic = getattr(props, "ResponseTopic", None)
            if not isinstance(correlation, bytes) or not isinstance(topic, str):
                return
            with self._lock:
                self.deliveries[(correlation, port)] += 1
                if port in self.silent:
                    return
                if correlation not in self.counted:
                    self.counted[correlation] += 1
            client.publish(topic, encode_receipts([Receipt(correlation, counted=True)]), qos=0)

        return on_message

    def delivered_through(self, port: int) -> set[bytes]:
        with self._lock:
            return {c for c, p in self.deliveries if p == port}

    def close(self) -> None:
        for client in self._clients:
            client.loop_stop()
            client.disconnect()


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[list[Broker]]:
    with ExitStack() as stack:
        yield [stack.enter_context(running_broker(tmp_path / f"broker-{i}")) for i in range(2)]


def _stage(agent: Agent, clock: FakeClock, n: int) -> set[bytes]:
    before = {p.entry.report_id for p in agent.outbox()}
    agent.record("flag", n % 2)
    agent.record("procs", f"proc-{n}")
    agent.record("seconds", 30 + n)
    clock.set(clock.time() + DAY)
    agent.collect()
    return {p.entry.report_id for p in agent.outbox()} - before


async def _until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE:g} s"
        await asyncio.sleep(0.01)


def test_a_killed_primary_fails_over_and_every_report_is_counted_once(
    two_brokers: list[Broker], make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    cfg = BrokerConfig(
        addresses=tuple(f"127.0.0.1:{b.port}" for b in two_brokers),
        tls=False,
        publish_timeout=DEADLINE,
        receipt_timeout_seconds=3_600.0,  # only a failover sends a report again in this test
        receipt_backoff_max=3_600.0,
    )
    order = broker_order(None, cfg.endpoints)
    by_address = {f"127.0.0.1:{b.port}": b for b in two_brokers}
    primary, second = by_address[str(order[0])], by_address[str(order[1])]
    routes = [Route(str(a), MqttTransport(cfg, SeededRandom(5), address=a)) for a in order]
    agent = make_agent()
    agent.grant_consent()
    counter = ReceiptCounter(two_brokers)
    publisher = Publisher(
        agent,
        routes,
        clock=clock,
        rng=SeededRandom(1),
        backoff=Backoff(initial=0.05, cap=0.05),
        receipts=ReceiptPolicy(timeout=3_600.0, cap=3_600.0),
    )

    def statuses(ids: set[bytes]) -> set[tuple[str, str]]:
        return {(e.status, e.broker) for e in agent.ledger() if e.report_id in ids}

    async def scenario() -> tuple[set[bytes], set[bytes], set[bytes]]:
        task = asyncio.create_task(publisher.run())
        try:
            first = _stage(agent, clock, 1)
            publisher.kick()
            await _until("the first reports counted", lambda: agent.outbox() == [])
            # The primary's receipts stop; reports sent through it wait for them; it is killed.
            counter.silent.add(primary.port)
            waiting = _stage(agent, clock, 2)
            publisher.kick()
            await _until(
                "the second reports sent through the primary",
                lambda: statuses(waiting) == {("sent", f"127.0.0.1:{primary.port}")},
            )
            assert publisher.broker_in_use == f"127.0.0.1:{primary.port}"
            assert primary.process is not None
            primary.process.kill()
            primary.process.wait()
            primary.process = None
            await _until("the waiting reports counted through the other broker", lambda: agent.outbox() == [])
            # With the primary still down, the next reports go through the other broker.
            third = _stage(agent, clock, 3)
            publisher.kick()
            await _until("the third reports counted", lambda: agent.outbox() == [])
            return first, waiting, third
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        first, waiting, third = asyncio.run(scenario())
    finally:
        counter.close()
    recorded = {e.report_id for e in agent.ledger()}
    assert recorded == first | waiting | third
    assert len(recorded) == len(first) + len(waiting) + len(third) >= 9
    # Every report of the ledger counted, and exactly once, whichever broker carried it.
    assert counter.counted == Counter(dict.fromkeys(recorded, 1))
    assert statuses(first) == {("counted", f"127.0.0.1:{primary.port}")}
    assert statuses(waiting | third) == {("counted", f"127.0.0.1:{second.port}")}
    # The waiting reports travelled through both brokers; the others through one each.
    assert counter.delivered_through(primary.port) == first | waiting
    assert counter.delivered_through(second.port) == waiting | third


def test_a_broker_lost_before_its_connack_fails_the_connect_at_once() -> None:
    """A broker that drops the connection after the CONNECT, with no CONNACK (one killed during the
    handshake): the connect fails with a TransportError at once, not at ``publish_timeout``, so
    the publisher can try the next broker (tests/deploy/test_multihost_brokers.py found the wait)."""

    async def scenario() -> None:
        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)  # the CONNECT has begun to arrive
            writer.transport.abort()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # A connect timeout far beyond the hang guard: only a prompt failure passes.
        cfg = BrokerConfig(host="127.0.0.1", port=port, tls=False, publish_timeout=10 * DEADLINE)
        async with server:
            with pytest.raises(TransportError):
                async with asyncio.timeout(DEADLINE), MqttTransport(cfg, SeededRandom(3)).connect_receipts():
                    pass

    asyncio.run(scenario())
