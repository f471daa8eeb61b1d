"""The collector's inbox: what waits for ingest, and the QoS 0 messages it drops when full (collector/mqtt/inbox.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from collector.mqtt.inbox import Inbox
from protocol.mqtt.events import Delivery, make_token, packet_id_of

_deliveries = st.lists(
    st.builds(lambda payload, pid: Delivery(payload, make_token(1, 0, pid)), st.binary(max_size=20), st.integers(0, 3)),
    max_size=30,
)


@given(st.integers(1, 10), st.lists(st.one_of(_deliveries, st.integers(0, 12)), max_size=12))
def test_qos0_never_fills_the_inbox_past_its_capacity(capacity: int, steps: list[list[Delivery] | int]) -> None:
    """A QoS 0 delivery that finds ``capacity`` waiting is dropped and counted; QoS 1 ones are always kept, in order."""
    inbox = Inbox(capacity)
    model: list[Delivery] = []
    dropped = 0
    for step in steps:
        if isinstance(step, int):  # ingest takes some
            assert inbox.take(step) == model[:step]
            del model[:step]
        else:  # a read's deliveries arrive
            for d in step:
                if packet_id_of(d.token) or len(model) < capacity:
                    model.append(d)
                else:
                    dropped += 1
            inbox.add(step)
        assert len(inbox) == len(model)
        assert inbox.dropped == dropped
        assert inbox.buffered_bytes == sum(len(d.payload) for d in model)


def test_take_returns_the_oldest_first_and_no_more_than_asked() -> None:
    """Deliveries come out in the order they came in, as many as asked and no more than there are."""
    inbox = Inbox(100)
    inbox.add([Delivery(bytes([i]), make_token(1, 0, i + 1)) for i in range(5)])
    assert [d.payload for d in inbox.take(2)] == [b"\x00", b"\x01"]
    assert [d.payload for d in inbox.take(10)] == [b"\x02", b"\x03", b"\x04"]
    assert inbox.take(3) == []
    assert inbox.buffered_bytes == 0
