"""Against a real Mosquitto on loopback: exactly the expected reports, none without consent, outbox
survives a broker outage, no PUBACK means no removal, TLS with a client certificate or a password."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import BrokerConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.errors import TransportError
from agent.mqtt import MqttTransport, random_client_id
from agent.publisher import Publisher
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from protocol.wire import decode_report
from runtime.backoff import Backoff
from runtime.clock import SystemClock
from tests.support.broker import Broker, free_port, running_broker
from tests.support.clocks import FakeClock

DAY = 86_400.0
TOPICS = "ldp/v1/reports/#"
SENTINEL = "ldp/v1/reports/zz-sentinel"


def _wait(predicate: Callable[[], bool], timeout: float = 120.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Subscriber:
    """A paho client collecting everything under ldp/v1/reports/#."""

    def __init__(self, port: int, *, client_id: str = "", persistent: bool = False) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=not persistent)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        if not self._subscribed.wait(60):
            raise AssertionError("subscriber did not subscribe")

    def _on_connect(self, client: mqtt.Client, *_: object) -> None:
        client.subscribe(TOPICS, qos=1)

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload)))

    def reports(self) -> list[tuple[str, bytes]]:
        """Messages received so far, without the sentinels."""
        with self._lock:
            return [m for m in self.messages if m[0] != SENTINEL]

    def drain(self, port: int) -> list[tuple[str, bytes]]:
        """Publish a sentinel after everything else and wait for it: then nothing is in flight."""
        token = f"{time.monotonic_ns()}".encode()
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1", "-t", SENTINEL, "-m", token], check=True
        )
        _wait(lambda: any(m == (SENTINEL, token) for m in list(self.messages)), what="the sentinel")
        return self.reports()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@contextlib.contextmanager
def subscriber(port: int, **kw: object) -> Iterator[Subscriber]:
    """A subscriber for the duration of the block."""
    s = Subscriber(port, **kw)  # type: ignore[arg-type]
    try:
        yield s
    finally:
        s.close()


def _broker_cfg(port: int, *, publish_timeout: float = 30.0) -> BrokerConfig:
    return BrokerConfig(host="127.0.0.1", port=port, tls=False, publish_timeout=publish_timeout)


def _stage(agent: Agent, clock: FakeClock) -> None:
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("flag", 0)
    agent.record("seconds", 600, key="editor")
    agent.record("seconds", 60, key="shell")
    agent.record("hist", 1234.5)
    agent.record("procs", "bash")
    agent.record("words", "hello")
    clock.set(clock.time() + DAY)
    agent.collect()


def test_with_consent_exactly_the_expected_reports_arrive(
    mosquitto: Broker, make_agent: Callable[..., Agent], clock: FakeClock, registry: Registry
) -> None:
    """The daemon publishes each staged report once, on its use case's topic, and the collector decodes it."""
    agent = make_agent()
    _stage(agent, clock)
    expected = {(p.topic, p.entry.payload) for p in agent.outbox()}
    assert len(expected) == 5
    with subscriber(mosquitto.port) as sub:
        transport = MqttTransport(_broker_cfg(mosquitto.port), SeededRandom(1))
        daemon = Daemon(agent, transport, clock=clock, rng=SeededRandom(2))

        async def main() -> None:
            task = asyncio.create_task(daemon.publisher.run())
            daemon.publisher.kick()
            deadline = time.monotonic() + 120  # a hang guard only
            while agent.outbox() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert agent.outbox() == []
        got = sub.drain(mosquitto.port)
    assert sorted(got) == sorted(expected)
    for topic, payload in got:
        report = decode_report(payload, registry)
        assert topic == f"ldp/v1/reports/{report.use_case.name}"
    assert {e.report_id for e in agent.ledger()} == {decode_report(p, registry).report_id for _, p in got}


def test_without_consent_nothing_is_sent(mosquitto: Broker, make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """An agent that was never opted in publishes nothing, whatever it is asked to do."""
    agent = make_agent()
    transport = MqttTransport(_broker_cfg(mosquitto.port), SeededRandom(1))
    daemon = Daemon(agent, transport, clock=clock, rng=SeededRandom(2))
    with subscriber(mosquitto.port) as sub:

        async def main() -> None:
            task = asyncio.create_task(daemon.publisher.run())
            for _ in range(4):
                daemon.run_cycle()
                daemon.publisher.kick()
                clock.set(clock.time() + DAY)
                await asyncio.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert sub.drain(mosquitto.port) == []
    assert daemon.publisher.statistics().connections == 0


def test_reports_wait_while_the_broker_is_down_and_each_goes_out_once(
    mosquitto: Broker, make_agent: Callable[..., Agent], clock: FakeClock, registry: Registry
) -> None:
    """Broker down: reports stay in the outbox; broker back: every one is delivered, each exactly once."""
    agent = make_agent()
    _stage(agent, clock)
    expected = {p.entry.payload for p in agent.outbox()}
    # A persistent session: the broker keeps what arrives while the subscriber reconnects.
    with subscriber(mosquitto.port, client_id="test-collector", persistent=True) as sub:
        mosquitto.stop()
        transport = MqttTransport(_broker_cfg(mosquitto.port), SeededRandom(1))
        publisher = Publisher(
            agent, transport, clock=SystemClock(), rng=SeededRandom(3), backoff=Backoff(initial=0.05, cap=0.2)
        )

        async def main() -> None:
            task = asyncio.create_task(publisher.run())
            publisher.kick()
            deadline = time.monotonic() + 120  # a hang guard only
            while publisher.statistics().failures < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert {p.entry.payload for p in agent.outbox()} == expected
            await asyncio.to_thread(mosquitto.start)
            while agent.outbox() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert agent.outbox() == []
        got = sub.drain(mosquitto.port)
    payloads = [p for _, p in got]
    assert sorted(payloads) == sorted(expected)  # each exactly once
    assert len(agent.ledger()) == len(expected)
    assert publisher.statistics().acknowledged == len(expected)
    for p in payloads:
        decode_report(p, registry)


async def _silent_broker(port_holder: list[int], stop: asyncio.Event) -> None:
    """Accepts a connection, answers CONNECT with CONNACK, and never acknowledges a PUBLISH."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the CONNECT packet's first byte; the rest is ignored
        writer.write(b"\x20\x02\x00\x00")  # CONNACK, session not present, accepted
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_holder.append(server.sockets[0].getsockname()[1])
    async with server:
        await stop.wait()


def test_a_publish_without_puback_leaves_the_report_in_the_outbox(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """aiomqtt's QoS 1 publish returns only on PUBACK: a broker that never acknowledges keeps reports queued."""
    agent = make_agent()
    _stage(agent, clock)
    before = [p.entry.payload for p in agent.outbox()]

    async def main() -> None:
        stop = asyncio.Event()
        port: list[int] = []
        server = asyncio.create_task(_silent_broker(port, stop))
        while not port:
            await asyncio.sleep(0.01)
        transport = MqttTransport(_broker_cfg(port[0], publish_timeout=0.5), SeededRandom(1))
        publisher = Publisher(agent, transport, clock=SystemClock(), rng=SeededRandom(3))
        with pytest.raises(TransportError, match="not acknowledged"):
            await publisher.drain_once()
        stop.set()
        await server

    asyncio.run(main())
    assert [p.entry.payload for p in agent.outbox()] == before
    assert agent.ledger() == []


def test_client_identifiers_are_random_and_short() -> None:
    """Every connection gets a fresh 22-hex-digit identifier (no link between a device's connections)."""
    rng = SeededRandom(9)
    ids = {random_client_id(rng) for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and int(i, 16) >= 0 for i in ids)


# --------------------------------------------------------------------------- TLS


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write_pki(d: Path) -> None:
    def save(name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        (d / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca_key, ca=True)
    save("ca", ca_key, ca)
    for name in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        save(name, key, _cert(name, key, ca, ca_key, ca=False))


def test_tls_with_client_certificate_and_with_password(
    tmp_path: Path, make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Reports go over TLS with a client certificate, or with a user name and password; a wrong password fails."""
    pki = tmp_path / "pki"
    pki.mkdir()
    _write_pki(pki)
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "device", "s3cret"], check=True)
    cert_port, pass_port = free_port(), free_port()
    extra = "\n".join(
        [
            f"password_file {passwords}",
            f"listener {cert_port} 127.0.0.1",
            f"cafile {pki / 'ca.pem'}",
            f"certfile {pki / 'server.pem'}",
            f"keyfile {pki / 'server.key'}",
            "require_certificate true",
            f"listener {pass_port} 127.0.0.1",
            f"cafile {pki / 'ca.pem'}",
            f"certfile {pki / 'server.pem'}",
            f"keyfile {pki / 'server.key'}",
        ]
    )
    (tmp_path / "secret").write_text("s3cret\n")
    (tmp_path / "wrong").write_text("guess\n")
    for name in ("secret", "wrong"):
        (tmp_path / name).chmod(0o600)  # a password file is readable by its owner only
    with running_broker(tmp_path / "broker", extra_config=extra) as broker:
        configs = {
            "certificate": BrokerConfig(
                host="127.0.0.1",
                port=cert_port,
                ca_file=pki / "ca.pem",
                cert_file=pki / "client.pem",
                key_file=pki / "client.key",
                publish_timeout=5.0,
            ),
            "password": BrokerConfig(
                host="127.0.0.1",
                port=pass_port,
                ca_file=pki / "ca.pem",
                username="device",
                password_file=tmp_path / "secret",
                publish_timeout=5.0,
            ),
            "wrong-password": BrokerConfig(
                host="127.0.0.1",
                port=pass_port,
                ca_file=pki / "ca.pem",
                username="device",
                password_file=tmp_path / "wrong",
                publish_timeout=5.0,
            ),
            # TLS 1.3 reports a missing client certificate only after the handshake: a short timeout.
            "no-certificate": BrokerConfig(
                host="127.0.0.1", port=cert_port, ca_file=pki / "ca.pem", publish_timeout=1.0
            ),
        }
        with subscriber(broker.port) as sub:

            async def send(cfg: BrokerConfig) -> None:
                async with MqttTransport(cfg, SeededRandom(4)).connect() as conn:
                    await conn.publish("ldp/v1/reports/flag", b"x-" + cfg.port.to_bytes(4, "big"))

            asyncio.run(send(configs["certificate"]))
            asyncio.run(send(configs["password"]))
            for name in ("wrong-password", "no-certificate"):
                with pytest.raises(TransportError):
                    asyncio.run(send(configs[name]))
            got = sub.drain(broker.port)
    assert sorted(p for _, p in got) == sorted(
        [b"x-" + cert_port.to_bytes(4, "big"), b"x-" + pass_port.to_bytes(4, "big")]
    )
