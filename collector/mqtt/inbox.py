"""The deliveries one broker's session has read and ingest has not taken yet: the subscriber's flow control.

The MQTT core (:class:`protocol.mqtt.session.Session`) hands over every PUBLISH it parses
and keeps none; what waits for ingest waits here, and the transport decides from it when to
read (it stops reading while ``mqtt.buffer_bytes`` of payload wait, and the core says when
Receive Maximum QoS 1 messages await acknowledgement). QoS 1 messages are bounded by the
Receive Maximum the broker honours; QoS 0 ones are not, so a QoS 0 message that finds
``capacity`` deliveries waiting is dropped and counted (docs/mqtt-client.md).
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable

from protocol.mqtt.events import Delivery, packet_id_of

__all__ = ["Inbox"]

_PAYLOAD: Callable[[Delivery], bytes] = operator.itemgetter(0)


class Inbox:
    """Deliveries waiting for ingest, oldest first, with their payload bytes counted.

    Args:
        capacity: the most deliveries a QoS 0 message may find waiting and still be kept
            (the Receive Maximum the collector announces).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: collections.deque[Delivery] = collections.deque()
        self._bytes = 0
        self.dropped = 0
        """QoS 0 messages dropped because ``capacity`` deliveries were waiting."""

    def add(self, deliveries: list[Delivery]) -> None:
        """Keep ``deliveries`` (in order), except the QoS 0 ones that find the inbox full."""
        queue = self._queue
        if len(queue) + len(deliveries) > self.capacity:
            deliveries = self._admit(deliveries)
        queue.extend(deliveries)
        self._bytes += sum(map(len, map(_PAYLOAD, deliveries)))

    def _admit(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries kept when the inbox would pass its capacity: every QoS 1 one, and
        each QoS 0 one that finds fewer than ``capacity`` waiting."""
        waiting, cap = len(self._queue), self.capacity
        kept: list[Delivery] = []
        for d in deliveries:
            if not packet_id_of(d.token) and waiting >= cap:
                self.dropped += 1
                continue
            kept.append(d)
            waiting += 1
        return kept

    def take(self, max_count: int) -> list[Delivery]:
        """Remove and return up to ``max_count`` deliveries, oldest first."""
        queue = self._queue
        if max_count >= len(queue):
            out = list(queue)
            queue.clear()
        else:
            out = [queue.popleft() for _ in range(max_count)]
        self._bytes -= sum(map(len, map(_PAYLOAD, out)))
        return out

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes of the deliveries waiting."""
        return self._bytes
