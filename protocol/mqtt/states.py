"""The MQTT client's states and what moves it between them: one table for both roles.

A client of the broker plays one of two roles (:class:`Role`), as an HTTP connection's end
is the client or the server: the **publisher** sends QoS 1 PUBLISHes and reads their
PUBACKs (the fleet's scale publisher, the tests' publisher), the **subscriber** reads QoS 1
PUBLISHes and sends their PUBACKs (the collector). Either may also send and read QoS 0
PUBLISHes (commit receipts go from the collector to the publishers at QoS 0,
docs/wire-format.md "Commit receipts"), subscribe, ping and disconnect.

:data:`TRANSITIONS` says, for each role, which :class:`Step` may happen in which
:class:`State` and which state follows. Whatever is not in it is refused:
:class:`~protocol.mqtt.session.Session` raises :class:`~protocol.mqtt.packets.MqttProtocolError`
(protocol error, 0x82) for a packet the broker must not send then, and
:class:`MqttUsageError` for a packet its caller must not send then. Losing the connection or
a protocol error closes it from any state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from protocol.errors import LdpError

__all__ = ["TRANSITIONS", "MqttUsageError", "Role", "State", "Step", "next_state"]


class Role(enum.Enum):
    """Which end of the acknowledged (QoS 1) stream a client is."""

    PUBLISHER = "publisher"
    """Sends QoS 1 PUBLISHes and reads their PUBACKs."""
    SUBSCRIBER = "subscriber"
    """Reads QoS 1 PUBLISHes and sends their PUBACKs."""


class State(enum.Enum):
    """Where one connection of a client stands."""

    CLOSED = "closed"
    """No connection, or one that has ended (lost, refused, disconnected, broken)."""
    CONNECTING = "connecting"
    """CONNECT sent; the broker's first packet must be CONNACK (§3.2)."""
    OPEN = "open"
    """The broker accepted the connection."""


class Step(enum.Enum):
    """What can happen to a connection: a packet sent or read (by type and QoS), or its loss."""

    SEND_CONNECT = "send CONNECT"
    READ_CONNACK = "read CONNACK accepting"
    READ_REFUSAL = "read CONNACK refusing"
    SEND_SUBSCRIBE = "send SUBSCRIBE"
    READ_SUBACK = "read SUBACK"
    SEND_PUBLISH_QOS0 = "send PUBLISH at QoS 0"
    SEND_PUBLISH_QOS1 = "send PUBLISH at QoS 1"
    READ_PUBACK = "read PUBACK"
    READ_PUBLISH_QOS0 = "read PUBLISH at QoS 0"
    READ_PUBLISH_QOS1 = "read PUBLISH at QoS 1"
    SEND_PUBACK = "send PUBACK"
    SEND_PINGREQ = "send PINGREQ"
    READ_PINGRESP = "read PINGRESP"
    SEND_DISCONNECT = "send DISCONNECT"
    READ_DISCONNECT = "read DISCONNECT"
    LOST = "lose the connection or break the protocol"


_CLOSED, _CONNECTING, _OPEN = State.CLOSED, State.CONNECTING, State.OPEN

_EITHER: dict[tuple[State, Step], State] = {
    (_CLOSED, Step.SEND_CONNECT): _CONNECTING,
    (_CONNECTING, Step.READ_CONNACK): _OPEN,
    (_CONNECTING, Step.READ_REFUSAL): _CLOSED,
    (_CONNECTING, Step.SEND_DISCONNECT): _CLOSED,
    (_OPEN, Step.SEND_SUBSCRIBE): _OPEN,
    (_OPEN, Step.READ_SUBACK): _OPEN,
    (_OPEN, Step.SEND_PUBLISH_QOS0): _OPEN,
    (_OPEN, Step.READ_PUBLISH_QOS0): _OPEN,
    (_OPEN, Step.SEND_PINGREQ): _OPEN,
    (_OPEN, Step.READ_PINGRESP): _OPEN,
    (_OPEN, Step.SEND_DISCONNECT): _CLOSED,
    (_OPEN, Step.READ_DISCONNECT): _CLOSED,
    **{(state, Step.LOST): _CLOSED for state in State},
}

TRANSITIONS: Mapping[Role, Mapping[tuple[State, Step], State]] = MappingProxyType(
    {
        Role.PUBLISHER: MappingProxyType(
            {**_EITHER, (_OPEN, Step.SEND_PUBLISH_QOS1): _OPEN, (_OPEN, Step.READ_PUBACK): _OPEN}
        ),
        Role.SUBSCRIBER: MappingProxyType(
            {**_EITHER, (_OPEN, Step.READ_PUBLISH_QOS1): _OPEN, (_OPEN, Step.SEND_PUBACK): _OPEN}
        ),
    }
)
"""Per role, the state that follows each step allowed in each state; a step not listed is refused."""


class MqttUsageError(LdpError, ValueError):
    """The caller asked a session for a packet its role or its state does not allow (a caller's mistake).

    Attributes:
        role: the session's role.
        state: its state then.
        step: what was asked.
    """

    def __init__(self, role: Role, state: State, step: Step, detail: str = "") -> None:
        self.role = role
        self.state = state
        self.step = step
        extra = f": {detail}" if detail else ""
        super().__init__(f"a {role.value} cannot {step.value} while {state.value}{extra}")


def next_state(role: Role, state: State, step: Step) -> State | None:
    """The state :data:`TRANSITIONS` gives after ``step`` in ``state``; None when the step is not allowed."""
    return TRANSITIONS[role].get((state, step))
