"""The broker's access rules, against a real Mosquitto running deploy/mosquitto/ (TLS,
password file, ACL): devices may only publish reports, only collectors may read them, and
nobody gets in without TLS and a valid credential.

"Received nothing" is checked against a positive control in the same test (another
subscriber does receive the message) and after :meth:`Probe.sync`, the round trip that
guarantees any message the broker routed to the client has arrived. Mosquitto 2.0 grants a
device's SUBSCRIBE (SUBACK with QoS 1: the acl_file cannot refuse subscriptions) and then
withholds every message the read rules do not allow; a later broker may refuse the
SUBSCRIBE with 0x80/0x87 instead. The tests accept either SUBACK and judge by delivery.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
from pathlib import Path

import pytest

from tests.deploy.conftest import Clients
from tests.deploy.probe import DEADLINE, V5, V311, Probe
from tests.deploy.secure_broker import SecureBroker, make_pki

PROTOCOLS = [pytest.param(V311, id="mqtt311"), pytest.param(V5, id="mqtt5")]
GRANTED_OR_REFUSED = ([0], [1], [0x80], [0x87])
REFUSED = {"Not authorized", "Bad user name or password"}


def _collector(
    clients: Clients,
    topic_filter: str = "ldp/v1/reports/#",
    *,
    mtls: bool = False,
    client_id: str = "",
    session_expiry: int = 0,
) -> Probe:
    collector = clients.connected("collector", mtls=mtls, client_id=client_id, session_expiry=session_expiry)
    assert collector.subscribe(topic_filter) == [1], f"collector not granted {topic_filter} at QoS 1"
    return collector


def _observer(clients: Clients) -> Probe:
    observer = clients.connected("observer")
    assert observer.subscribe("#") == [1]
    return observer


# --- devices ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_receives_no_reports(clients: Clients, report_topic: str, protocol: int) -> None:
    """A device subscribed to the reports, to '#' or to a shared group receives no report, not even its own."""
    device = clients.connected("devices", protocol=protocol)
    filters = ["ldp/v1/reports/#", report_topic, "#"]
    if protocol == V5:
        filters.append(f"$share/device-group-{secrets.token_hex(4)}/ldp/v1/reports/#")
    for topic_filter in filters:
        assert device.subscribe(topic_filter) in GRANTED_OR_REFUSED
    collector = _collector(clients)
    other = clients.connected("devices", protocol=V311)

    assert other.publish(report_topic, b"another device's report") == 0
    assert device.publish(report_topic, b"this device's report") == 0

    # Positive control: both reports were routed to subscribers.
    assert sorted(collector.wait_messages(2, report_topic)) == [b"another device's report", b"this device's report"]
    device.sync()
    assert device.received() == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_publishes_only_to_report_topics(clients: Clients, report_topic: str, protocol: int) -> None:
    """A device's messages outside ldp/v1/reports/<use_case> reach nobody (MQTT 5: PUBACK 0x87)."""
    observer = _observer(clients)
    collector = _collector(clients)
    device = clients.connected("devices", protocol=protocol)
    forbidden = [
        "ldp/v1/reports",  # the parent level: matched by the collectors' ldp/v1/reports/#
        f"{report_topic}/deeper",  # one level too deep: also under ldp/v1/reports/#
        "ldp/v1/reports/deploy-x",  # no identity level (the layout before per-device identities)
        "ldp/v1/reports/dev-a/deploy-x",  # another device's identity
        "ldp/v1/commands/all-devices",
        "ldp/v2/reports/x",
        "other",
        "$SYS/broker/fake",
    ]
    for topic in forbidden:
        code = device.publish(topic, b"forbidden " + topic.encode())
        # MQTT 3.1.1 has no refusal in PUBACK: the broker acknowledges and drops the message.
        assert code == (0x87 if protocol == V5 else 0), topic
    assert device.publish(report_topic, b"allowed") == 0

    # The allowed report, published last, arrives; the broker handled the device's packets
    # in order, so any forbidden message it had routed would have arrived before it.
    assert observer.wait_messages(1, report_topic) == [b"allowed"]
    assert collector.wait_messages(1, report_topic) == [b"allowed"]
    observer.sync()
    collector.sync()
    assert observer.received() == [b"allowed"]
    assert collector.received() == [b"allowed"]


def test_device_cannot_retain_a_report(clients: Clients, report_topic: str) -> None:
    """A retained report is refused (the device is disconnected) and never reaches a collector, now or later."""
    observer = _observer(clients)
    device = clients.connected("devices", protocol=V311)
    assert device.publish(report_topic, b"retained", retain=True) is None
    device.wait_disconnected()

    late = _collector(clients)  # a collector subscribing afterwards would get a retained message first
    observer.sync()
    late.sync()
    assert observer.received(report_topic) == []
    assert late.received(report_topic) == []


def test_oversize_packet_is_dropped(clients: Clients, report_topic: str) -> None:
    """A report of 64 KiB (the decoder's cap) passes; a larger packet disconnects its sender and reaches nobody."""
    observer = _observer(clients)
    device = clients.connected("devices", protocol=V311)
    largest = bytes(64 * 1024)
    assert device.publish(report_topic, largest) == 0
    assert observer.wait_messages(1, report_topic) == [largest]

    for size in (64 * 1024 + 1024, 200 * 1024):
        flood = clients.connected("devices", protocol=V311)
        assert flood.publish(report_topic, bytes(size)) is None
        flood.wait_disconnected()
    observer.sync()
    assert observer.received(report_topic) == [largest]


# --- collectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic_filter", ["ldp/v1/reports/#", "$share/collectors/ldp/v1/reports/#"], ids=["direct", "shared"]
)
@pytest.mark.parametrize("device_protocol", PROTOCOLS)
def test_collector_receives_device_reports(
    clients: Clients, report_topic: str, topic_filter: str, device_protocol: int
) -> None:
    """A collector subscribed directly or in a shared group gets QoS 1 and every device report, byte for byte."""
    group = secrets.token_hex(8)
    collector = _collector(clients, topic_filter.replace("collectors", group))
    device = clients.connected("devices", protocol=device_protocol)
    payloads = [b"report %d" % i + bytes(range(256)) for i in range(5)]
    for payload in payloads:
        assert device.publish(report_topic, payload) == 0
    assert collector.wait_messages(5, report_topic) == payloads


def test_shared_group_splits_reports_exactly(clients: Clients, report_topic: str) -> None:
    """Two collectors in one shared group receive each report exactly once between them."""
    group = f"$share/{secrets.token_hex(8)}/ldp/v1/reports/#"
    first, second = _collector(clients, group), _collector(clients, group)
    device = clients.connected("devices", protocol=V311)
    payloads = [b"%d" % i for i in range(40)]
    device.publish_many(report_topic, payloads)
    observer = _observer(clients)
    assert device.publish(report_topic, b"end") == 0
    observer.wait_messages(1, report_topic)

    first.sync()
    second.sync()
    got = first.received(report_topic) + second.received(report_topic)
    assert sorted(got) == sorted([*payloads, b"end"])
    assert first.received(report_topic)
    assert second.received(report_topic)


def test_collector_cannot_publish(clients: Clients, report_topic: str) -> None:
    """A collector's publish to a report topic is refused (PUBACK 0x87) and reaches nobody."""
    observer = _observer(clients)
    collector = clients.connected("collector")
    assert collector.publish(report_topic, b"injected by a collector") == 0x87
    device = clients.connected("devices", protocol=V311)
    assert device.publish(report_topic, b"device") == 0
    assert observer.wait_messages(1, report_topic) == [b"device"]
    observer.sync()
    assert observer.received(report_topic) == [b"device"]


# --- why the collectors' client id and shared-group name are secrets ----------------------
# Mosquitto 2.0's acl_file cannot refuse a SUBSCRIBE or a client id. These two tests pin the
# two consequences docs/deploy.md guards against by making both names unguessable; if a
# broker upgrade makes either test fail, the broker has closed the hole: update the docs.


def test_device_in_the_collectors_group_takes_reports_away(clients: Clients, report_topic: str) -> None:
    """A device that joins the collectors' shared group gets nothing, but the reports routed to it are lost."""
    group = f"$share/{secrets.token_hex(8)}/ldp/v1/reports/#"
    collector = _collector(clients, group)
    intruder = clients.connected("devices")
    assert intruder.subscribe(group) in GRANTED_OR_REFUSED
    device = clients.connected("devices", protocol=V311)
    payloads = [b"%d" % i for i in range(20)]
    device.publish_many(report_topic, payloads)
    observer = _observer(clients)
    assert device.publish(report_topic, b"end") == 0
    observer.wait_messages(1, report_topic)
    collector.sync()
    intruder.sync()
    assert intruder.received() == []
    assert len(collector.received(report_topic)) < len(payloads) + 1


def test_device_with_the_collectors_client_id_destroys_its_backlog(clients: Clients, report_topic: str) -> None:
    """A device reusing a collector's client id takes over its session: it reads nothing, but the backlog is lost."""
    client_id = f"ldp-collector-{secrets.token_hex(8)}"
    _collector(clients, client_id=client_id, session_expiry=300).close()
    device = clients.connected("devices", protocol=V311)
    device.publish_many(report_topic, [b"queued %d" % i for i in range(5)])

    thief = clients.connected("devices", client_id=client_id, session_expiry=300)
    thief.sync()
    assert thief.received() == []
    thief.close()

    resumed = clients.connected("collector", client_id=client_id, session_expiry=1)
    # Positive control: the session kept its subscription, and new reports are delivered.
    assert device.publish(report_topic, b"after the takeover") == 0
    assert resumed.wait_messages(1, report_topic) == [b"after the takeover"]
    resumed.sync()
    assert resumed.received(report_topic) == [b"after the takeover"]


# --- who gets in ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("user", "password"),
    [
        (None, None),
        ("devices", "wrong password"),
        ("collector", "wrong password"),
        ("devices", ""),
        ("nobody", "whatever"),
    ],
    ids=["anonymous", "devices-wrong-password", "collector-wrong-password", "devices-empty-password", "unknown-user"],
)
def test_password_listener_refuses_bad_credentials(
    clients: Clients, protocol: int, user: str | None, password: str | None
) -> None:
    """Over TLS, an anonymous client, a wrong or empty password and an unknown user are refused at CONNACK."""
    probe = clients.probe(user=user, password=password, protocol=protocol)
    result = probe.connect()
    assert not result.accepted
    assert result.connack in REFUSED, result
    probe.wait_disconnected()


def test_client_certificate_does_not_replace_the_password(clients: Clients) -> None:
    """On the password listener, a valid collector certificate without a password is still anonymous: refused."""
    result = clients.probe(cert="collector").connect()
    assert not result.accepted
    assert result.connack in REFUSED, result


def _plaintext_connect(username: str, password: str) -> bytes:
    """An MQTT 3.1.1 CONNECT packet with a user name and password (clean session, empty client id)."""
    body = b"\x00\x04MQTT\x04\xc2\x00\x1e" + b"\x00\x00"
    for field in (username.encode(), password.encode()):
        body += struct.pack(">H", len(field)) + field
    return bytes([0x10, len(body)]) + body


@pytest.mark.parametrize("listener", ["tls", "mtls"])
def test_plaintext_client_is_refused(secure_broker: SecureBroker, listener: str) -> None:
    """A client speaking MQTT without TLS, even with a valid password, gets no CONNACK and is disconnected."""
    port = secure_broker.tls_port if listener == "tls" else secure_broker.mtls_port
    packet = _plaintext_connect("collector", secure_broker.passwords["collector"])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(packet)
        # The loop ends when the broker closes (a reset: it closed with our bytes unread);
        # a broker that kept the connection open would make recv time out and fail the test.
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                answer += chunk
    # Nothing, or a TLS alert record (content type 21): never a CONNACK (packet type 2).
    assert answer == b"" or answer[0] == 0x15, answer.hex()


def test_plaintext_paho_client_is_refused(secure_broker: SecureBroker) -> None:
    """A paho client without TLS, with the collector's password, never gets a CONNACK."""
    with Probe(
        secure_broker.tls_port, context=None, username="collector", password=secure_broker.passwords["collector"]
    ) as probe:
        result = probe.connect()
    assert not result.accepted
    assert result.connack is None, result


# --- the mutual-TLS listener ----------------------------------------------------------------


def test_mtls_device_certificate_publishes_but_reads_nothing(clients: Clients, report_topic: str) -> None:
    """With CN=devices a client publishes reports but receives none; with CN=collector it receives them."""
    collector = _collector(clients, mtls=True)
    device = clients.connected("devices", mtls=True)
    assert device.subscribe("ldp/v1/reports/#") in GRANTED_OR_REFUSED
    assert device.publish(report_topic, b"over mTLS") == 0
    assert device.publish("ldp/v1/other", b"forbidden") == 0x87
    assert collector.wait_messages(1, report_topic) == [b"over mTLS"]
    device.sync()
    collector.sync()
    assert device.received() == []
    assert collector.received() == [b"over mTLS"]


@pytest.fixture(scope="module")
def rogue_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, unrelated CA with its own devices/collector certificates."""
    return make_pki(tmp_path_factory.mktemp("rogue-pki"))


@pytest.mark.parametrize("case", ["no-certificate", "password-only", "other-ca"])
def test_mtls_listener_refuses_clients_without_a_trusted_certificate(
    clients: Clients, secure_broker: SecureBroker, rogue_pki: Path, case: str
) -> None:
    """The mTLS listener refuses a client without a certificate, with only a password, or with another CA's."""
    if case == "no-certificate":
        probe = clients.probe(mtls=True)
    elif case == "password-only":
        probe = clients.probe(mtls=True, user="collector", password=secure_broker.passwords["collector"])
    else:
        ctx = clients.context()
        ctx.load_cert_chain(str(rogue_pki / "collector.pem"), str(rogue_pki / "collector.key"))
        probe = clients.probe(mtls=True, context=ctx)
    result = probe.connect()
    assert not result.accepted
    assert result.connack is None, result  # refused in the TLS handshake, before any MQTT


# --- commit receipts ----------------------------------------------------------------------


def test_a_device_reads_only_its_own_receipts(clients: Clients) -> None:
    """The collector may publish receipts; each connection gets only those on its user name's and client id's topic."""
    mine_id, theirs_id = f"dev-{secrets.token_hex(6)}", f"dev-{secrets.token_hex(6)}"
    mine = clients.connected("devices", client_id=mine_id)
    theirs = clients.connected("devices", client_id=theirs_id)
    for topic_filter in (
        f"ldp/v1/receipts/devices/{mine_id}",
        f"ldp/v1/receipts/devices/{theirs_id}",
        "ldp/v1/receipts/#",
        "#",
    ):
        assert mine.subscribe(topic_filter) in GRANTED_OR_REFUSED
    assert theirs.subscribe(f"ldp/v1/receipts/devices/{theirs_id}") == [1]
    collector = clients.connected("collector")
    assert collector.publish(f"ldp/v1/receipts/devices/{theirs_id}", b"for them") == 0
    assert collector.publish(f"ldp/v1/receipts/devices/{mine_id}", b"for me") == 0
    # Its client id under another user name is not its topic.
    assert collector.publish(f"ldp/v1/receipts/dev-a/{mine_id}", b"for dev-a") == 0
    # Positive control: the other device got its receipt.
    assert theirs.wait_messages(1, f"ldp/v1/receipts/devices/{theirs_id}") == [b"for them"]
    assert set(mine.wait_messages(1, f"ldp/v1/receipts/devices/{mine_id}")) == {b"for me"}
    mine.sync()
    # One copy per matching subscription (own topic, receipts/#, #), and none of theirs.
    assert set(mine.received()) == {b"for me"}


def test_a_device_cannot_forge_receipts(clients: Clients) -> None:
    """A device publishing to another connection's receipt topic is refused (PUBACK 0x87); nothing arrives."""
    victim_id = f"dev-{secrets.token_hex(6)}"
    victim = clients.connected("devices", client_id=victim_id)
    assert victim.subscribe(f"ldp/v1/receipts/devices/{victim_id}") == [1]
    forger = clients.connected("devices")
    assert forger.publish(f"ldp/v1/receipts/devices/{victim_id}", b"forged: counted") == 0x87
    collector = clients.connected("collector")
    assert collector.publish(f"ldp/v1/receipts/devices/{victim_id}", b"genuine") == 0
    assert victim.wait_messages(1, f"ldp/v1/receipts/devices/{victim_id}") == [b"genuine"]
    victim.sync()
    assert victim.received() == [b"genuine"]
