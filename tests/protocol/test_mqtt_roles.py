"""The MQTT core's one table, held step by step in both roles: Hypothesis plays caller and broker at once.

A stateful test drives a :class:`~protocol.mqtt.session.Session` as publisher or subscriber
through its public API only, with any order of what its caller may ask (connect, subscribe,
publish at QoS 0 and 1, acknowledge, ping, disconnect, lose the connection) and of what a
broker may send (CONNACK accepting or refusing, SUBACK, PUBACK, PUBLISH at QoS 0 and 1,
PINGRESP, DISCONNECT, stray bytes), each whole or cut in two. A model built from
:data:`~protocol.mqtt.states.TRANSITIONS` and the packet ids in use predicts each outcome: the
bytes or :class:`~protocol.mqtt.states.MqttUsageError` for what the caller asks, the event,
delivery or acknowledgement or :class:`~protocol.mqtt.packets.MqttProtocolError` for what the
broker sends, and the state after.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol.mqtt.events import (
    Acknowledged,
    Connected,
    ConnectionRefused,
    Disconnected,
    Subscribed,
    make_token,
    packet_id_of,
)
from protocol.mqtt.packets import MqttProtocolError, encode_varint, publish_packet
from protocol.mqtt.session import Session
from protocol.mqtt.states import TRANSITIONS, MqttUsageError, Role, State, Step, next_state

_ids = st.integers(min_value=0, max_value=12)  # packet ids: 0 is never valid, the rest collide often


@dataclass
class _Model:
    """What the session must hold, computed from the table and the packet ids the caller used."""

    role: Role
    state: State = State.CLOSED
    connection: int = 0
    outgoing: set[int] = field(default_factory=set)
    subscribing: dict[int, int] = field(default_factory=dict)
    unacked: list[int] = field(default_factory=list)  # tokens of QoS 1 deliveries of this connection

    def allows(self, step: Step) -> State | None:
        return next_state(self.role, self.state, step)

    def free(self, pid: int) -> bool:
        return 1 <= pid <= 65535 and pid not in self.outgoing and pid not in self.subscribing

    def new_connection(self) -> None:
        self.connection += 1
        self.outgoing.clear()
        self.subscribing.clear()
        self.unacked.clear()


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_varint(len(body)) + body


class SessionMachine(RuleBasedStateMachine):
    """A session and its model, moved by the same steps."""

    def __init__(self) -> None:
        super().__init__()
        self.session = Session(Role.PUBLISHER)
        self.model = _Model(Role.PUBLISHER)

    @initialize(role=st.sampled_from(Role), tag=st.integers(0, 255))
    def start(self, role: Role, tag: int) -> None:
        self.session = Session(role, topic_prefix=b"r/", tag=tag)
        self.model = _Model(role)
        self.tag = tag

    # -- what the caller asks --------------------------------------------------------------

    def _asked(self, step: Step, allowed: bool, call: object) -> bytes | None:
        """Run ``call``; it must give bytes exactly when the model allows it, and move as the table says."""
        assert callable(call)
        following = self.model.allows(step)
        if following is None or not allowed:
            with pytest.raises(MqttUsageError):
                call()
            return None
        data = call()
        assert isinstance(data, bytes)
        self.model.state = following
        return data

    @rule()
    def connect(self) -> None:
        data = self._asked(
            Step.SEND_CONNECT,
            True,
            lambda: self.session.connect(client_id="c", clean_start=True, keepalive=30),
        )
        if data is not None:
            assert data[0] == 0x10
            self.model.new_connection()

    @precondition(lambda self: self.model.state is not State.CLOSED)
    @rule(pid=_ids, qos=st.integers(0, 2), dup=st.booleans())
    def publish(self, pid: int, qos: int, dup: bool) -> None:
        step = Step.SEND_PUBLISH_QOS1 if qos else Step.SEND_PUBLISH_QOS0
        free = qos == 0 or (qos == 1 and self.model.free(pid))
        data = self._asked(step, free, lambda: self.session.publish(b"t", b"p", qos=qos, packet_id=pid, dup=dup))
        if data is not None:
            assert data == publish_packet(b"t", b"p", qos=qos, packet_id=pid, dup=dup)
            if qos:
                self.model.outgoing.add(pid)

    @precondition(lambda self: self.model.state is not State.CLOSED)
    @rule(pid=_ids, qoses=st.lists(st.integers(0, 1), max_size=3))
    def subscribe(self, pid: int, qoses: list[int]) -> None:
        most = 1 if self.model.role is Role.SUBSCRIBER else 0
        fits = self.model.free(pid) and bool(qoses) and max(qoses) <= most
        filters = [(f"f/{i}", q) for i, q in enumerate(qoses)]
        if self._asked(Step.SEND_SUBSCRIBE, fits, lambda: self.session.subscribe(pid, filters)) is not None:
            self.model.subscribing[pid] = len(filters)

    @precondition(lambda self: self.model.state is not State.CLOSED)
    @rule()
    def ping(self) -> None:
        assert self._asked(Step.SEND_PINGREQ, True, self.session.ping) in (None, b"\xc0\x00")

    def _disconnect(self, reason: int) -> None:
        self._asked(Step.SEND_DISCONNECT, True, lambda: self.session.disconnect(reason))

    def _lose_the_connection(self) -> None:
        self.session.connection_lost()
        self.model.state = TRANSITIONS[self.model.role][self.model.state, Step.LOST]
        self.model.new_connection()

    @precondition(lambda self: self.model.state is State.CLOSED)
    @rule(session_present=st.booleans())
    def open_a_connection(self, session_present: bool) -> None:
        """Connect and read the broker's acceptance: most steps are worth taking only on an open connection."""
        self.connect()
        got = self._read(_packet(0x20, bytes([int(session_present), 0, 0])), 5, "read")
        assert got == [Connected(session_present)]
        self.model.state = State.OPEN

    @precondition(lambda self: self.model.state is not State.CLOSED)
    @rule(count=st.integers(0, 4), stale=st.booleans())
    def acknowledge(self, count: int, stale: bool) -> None:
        model = self.model
        tokens = model.unacked[:count]
        if stale:
            tokens = [*tokens, make_token(model.connection - 1, self.tag, 7)]
        if (State.OPEN, Step.SEND_PUBACK) not in TRANSITIONS[model.role]:
            with pytest.raises(MqttUsageError):
                self.session.acknowledge(tokens)
            return
        data = self.session.acknowledge(tokens)
        if model.state is State.OPEN:
            current = [t for t in tokens if t in model.unacked]
            assert data == b"".join(b"\x40\x02" + struct.pack(">H", packet_id_of(t)) for t in current)
            del model.unacked[:count]
        else:
            assert data == b""

    # -- what the broker sends -------------------------------------------------------------

    def _read(self, packet: bytes, cut: int, outcome: str | None) -> list[object]:
        """Feed ``packet`` in two reads; the outputs, checked against ``outcome`` (None: a protocol error)."""
        cut %= len(packet) + 1
        session = self.session
        events: list[object] = []
        try:
            for part in (packet[:cut], packet[cut:]):
                session.receive_data(part)
                while (event := session.next_event()) is not None:
                    events.append(event)
        except MqttProtocolError:
            assert outcome is None, f"expected {outcome}"
            self.model.state = State.CLOSED
            assert session.take_deliveries() == []
            assert session.take_acknowledgements() == []
            return []
        assert outcome is not None, f"a protocol error expected, got {events}"
        return [*events, *session.take_deliveries(), *session.take_acknowledgements()]

    def _expect(self, reads: bool) -> str | None:
        """ "ignored" while closed, else "read" when the packet fits, None for a protocol error."""
        if self.model.state is State.CLOSED:
            return "ignored"
        return "read" if reads else None

    @precondition(lambda self: self.model.state is not State.OPEN)
    @rule(accept=st.booleans(), code=st.sampled_from([0x86, 0x89, 0x97]), cut=st.integers(0, 8))
    def connack(self, accept: bool, code: int, cut: int) -> None:
        model = self.model
        outcome = self._expect(model.state is State.CONNECTING)
        got = self._read(_packet(0x20, b"\x00\x00\x00" if accept else bytes([0, code])), cut, outcome)
        if outcome == "read":
            cause = "bad user name or password" if code == 0x86 else None
            assert got == ([Connected(False)] if accept else [ConnectionRefused(code, cause)])
            model.state = State.OPEN if accept else State.CLOSED
        elif outcome == "ignored":
            assert got == []

    def _suback(self, pid: int, codes: int, cut: int) -> None:
        model = self.model
        fits = model.state is State.OPEN and model.subscribing.get(pid) == codes
        outcome = self._expect(fits)
        got = self._read(_packet(0x90, struct.pack(">H", pid) + b"\x00" + bytes(codes)), cut, outcome)
        if outcome == "read":
            assert got == [Subscribed(pid, bytes(codes))]
            del model.subscribing[pid]
        elif outcome == "ignored":
            assert got == []

    @precondition(lambda self: self.model.state is State.OPEN and self.model.subscribing)
    @rule(data=st.data(), cut=st.integers(0, 8))
    def answer_a_subscribe(self, data: st.DataObject, cut: int) -> None:
        """A SUBACK for a SUBSCRIBE in flight, with as many codes as it had filters."""
        pid = data.draw(st.sampled_from(sorted(self.model.subscribing)))
        self._suback(pid, self.model.subscribing[pid], cut)

    @precondition(lambda self: self.model.state is State.OPEN and self.model.outgoing)
    @rule(data=st.data(), reason=st.sampled_from([0, 0x10, 0x87]), cut=st.integers(0, 8))
    def answer_a_publish(self, data: st.DataObject, reason: int, cut: int) -> None:
        """A PUBACK for a QoS 1 PUBLISH in flight."""
        self._puback(data.draw(st.sampled_from(sorted(self.model.outgoing))), reason, cut)

    @precondition(lambda self: self.model.state is State.OPEN)
    @rule(pid=_ids, count=st.integers(0, 3), suback=st.booleans(), cut=st.integers(0, 8))
    def an_answer_to_anything(self, pid: int, count: int, suback: bool, cut: int) -> None:
        """A SUBACK or PUBACK with any packet id (and any number of codes): read when it answers
        a packet in flight, a protocol error otherwise."""
        if suback:
            self._suback(pid, count, cut)
        else:
            self._puback(pid, 0x80 + count, cut)

    def _puback(self, pid: int, reason: int, cut: int) -> None:
        model = self.model
        fits = model.state is State.OPEN and model.role is Role.PUBLISHER and pid in model.outgoing
        outcome = self._expect(fits)
        got = self._read(_packet(0x40, struct.pack(">HB", pid, reason)), cut, outcome)
        if outcome == "read":
            assert got == [Acknowledged(pid, reason)]
            model.outgoing.discard(pid)
        elif outcome == "ignored":
            assert got == []

    @precondition(lambda self: self.model.state is State.OPEN)
    @rule(qos=st.sampled_from([0, 0, 1, 1, 2]), pid=st.integers(1, 5), cut=st.integers(0, 12))
    def publish_from_the_broker(self, qos: int, pid: int, cut: int) -> None:
        model = self.model
        most = 1 if model.role is Role.SUBSCRIBER else 0
        outcome = self._expect(model.state is State.OPEN and qos <= most)
        got = self._read(publish_packet(b"r/dev/uc", b"x", qos=qos, packet_id=pid), cut, outcome)
        if outcome == "read":
            (delivery,) = got
            assert (delivery.payload, delivery.sender) == (b"x", b"dev")  # type: ignore[attr-defined]
            assert delivery.token == make_token(model.connection, self.tag, pid if qos else 0)  # type: ignore[attr-defined]
            if qos:
                model.unacked.append(delivery.token)  # type: ignore[attr-defined]
        elif outcome == "ignored":
            assert got == []

    @precondition(lambda self: self.model.state is State.OPEN)
    @rule(cut=st.integers(0, 2))
    def pingresp(self, cut: int) -> None:
        assert self._read(b"\xd0\x00", cut, self._expect(self.model.state is State.OPEN)) == []

    def _disconnect_from_the_broker(self, reason: int, cut: int) -> None:
        model = self.model
        outcome = self._expect(model.state is State.OPEN)
        got = self._read(bytes([0xE0, 1, reason]), cut, outcome)
        if outcome == "read":
            assert got == [Disconnected(reason)]
            model.state = State.CLOSED
        elif outcome == "ignored":
            assert got == []

    @precondition(lambda self: self.model.state is not State.OPEN)
    @rule(
        packet=st.sampled_from(
            [b"\x90\x04\x00\x01\x00\x00", b"\x40\x02\x00\x01", b"\x30\x04\x00\x01t\x00", b"\xd0\x00", b"\xe0\x00"]
        ),
        cut=st.integers(0, 6),
    )
    def a_packet_out_of_turn(self, packet: bytes, cut: int) -> None:
        """Before CONNACK only CONNACK may come; while closed nothing is read."""
        assert self._read(packet, cut, self._expect(False)) == []

    @rule(
        how=st.sampled_from(["the caller disconnects", "the broker disconnects", "lost", "CONNACK", "stray bytes"]),
        reason=st.sampled_from([0, 0x81, 0x89, 0x95]),
        data=st.binary(min_size=1, max_size=12),
        cut=st.integers(0, 6),
    )
    def end_the_connection(self, how: str, reason: int, data: bytes, cut: int) -> None:
        """One rule for every way a connection ends, so that an open one lives for several steps."""
        if how == "the caller disconnects":
            self._disconnect(reason)
        elif how == "the broker disconnects":
            if self.model.state is State.OPEN:
                self._disconnect_from_the_broker(reason, cut)
        elif how == "lost":
            self._lose_the_connection()
        elif how == "CONNACK":
            self.connack(True, 0x86, cut)
        elif self.model.state is not State.CLOSED:
            self._stray_bytes(data)

    def _stray_bytes(self, data: bytes) -> None:
        """Bytes no model predicts: the outputs or the protocol error, nothing else; after an error, closed."""
        try:
            self.session.receive_data(data)
            while self.session.next_event() is not None:
                pass
        except MqttProtocolError:
            self.model.state = State.CLOSED
        # Whatever they were, the connection cannot be modelled further: start a new one.
        self._lose_the_connection()

    # -- what must always hold -------------------------------------------------------------

    @invariant()
    def the_state_is_the_tables(self) -> None:
        assert self.session.state is self.model.state
        assert self.session.connected == (self.model.state is State.OPEN)

    @invariant()
    def the_counts_in_flight_are_the_models(self) -> None:
        assert self.session.outstanding == len(self.model.outgoing)
        assert self.session.in_flight == len(self.model.unacked)


SessionMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50)
test_the_session_follows_its_table_in_both_roles = SessionMachine.TestCase


@pytest.mark.parametrize("role", list(Role))
def test_a_closed_session_sends_nothing_but_connect(role: Role) -> None:
    """Before CONNECT (and after the connection ended) every other packet is the caller's mistake."""
    session = Session(role)
    asks: list[Callable[[], bytes]] = [
        lambda: session.publish(b"t", b"p"),
        lambda: session.publish(b"t", b"p", qos=1, packet_id=1),
        lambda: session.subscribe(1, [("t", 0)]),
        session.ping,
        session.disconnect,
    ]
    for ask in asks:
        with pytest.raises(MqttUsageError, match="while closed"):
            ask()
    if role is Role.SUBSCRIBER:  # a token of no open connection is stale, not a mistake
        assert session.acknowledge([make_token(0, 0, 1)]) == b""
    else:
        with pytest.raises(MqttUsageError, match="cannot send PUBACK"):
            session.acknowledge([make_token(0, 0, 1)])
    assert session.connect(client_id="c", clean_start=True, keepalive=5)[0] == 0x10


def test_the_roles_differ_only_in_the_acknowledged_stream() -> None:
    """A publisher sends QoS 1 and reads PUBACKs; a subscriber reads QoS 1 and sends PUBACKs; all else is shared."""
    publisher, subscriber = (set(TRANSITIONS[role].items()) for role in (Role.PUBLISHER, Role.SUBSCRIBER))
    open_ = State.OPEN
    assert publisher - subscriber == {
        ((open_, Step.SEND_PUBLISH_QOS1), open_),
        ((open_, Step.READ_PUBACK), open_),
    }
    assert subscriber - publisher == {
        ((open_, Step.READ_PUBLISH_QOS1), open_),
        ((open_, Step.SEND_PUBACK), open_),
    }
    for table in TRANSITIONS.values():
        assert all(table[state, Step.LOST] is State.CLOSED for state in State)
        assert set(table.values()) == set(State)
