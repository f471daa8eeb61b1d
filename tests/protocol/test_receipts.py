"""Commit receipts: the codec round-trips, its decoder is total, and only topics under the
receipt prefix are ever answered."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.receipts import (
    MalformedReceiptError,
    Receipt,
    decode_receipts,
    encode_receipts,
    foreign_response_topic,
    receipt_topic,
    valid_response_topic,
)

receipts = st.builds(
    Receipt,
    correlation=st.binary(min_size=1, max_size=32),
    counted=st.booleans(),
    reason=st.text(max_size=64),
)


@given(st.lists(receipts, max_size=50))
def test_receipts_round_trip(items: list[Receipt]) -> None:
    """What the collector encodes, the agent decodes to the same receipts."""
    assert decode_receipts(encode_receipts(items)) == items


@given(st.binary(max_size=300))
def test_the_decoder_is_total(data: bytes) -> None:
    """Any bytes either decode or raise MalformedReceiptError."""
    with contextlib.suppress(MalformedReceiptError):
        decode_receipts(data)


@pytest.mark.parametrize(
    "doc",
    [
        [2, []],
        [1, [[b"x" * 33, 0, ""]]],
        [1, [[b"", 0, ""]]],
        [1, [[b"id", 2, ""]]],
        [1, [[b"id", True, ""]]],
        [1, [[b"id", 0]]],
        [1, [["id", 0, ""]]],
        {"1": []},
    ],
)
def test_malformed_receipts_are_refused(doc: object) -> None:
    """Wrong version, status, lengths or shapes raise the receipt error."""
    with pytest.raises(MalformedReceiptError):
        decode_receipts(msgpack.packb(doc, use_bin_type=True))


@pytest.mark.parametrize(
    ("topic", "ok"),
    [
        (b"ldp/v1/receipts/abc123", True),
        (b"ldp/v1/receipts/abc/def", True),
        (b"ldp/v1/receipts/", False),
        (b"ldp/v1/reports/emoji", False),
        (b"ldp/v1/receipts/+", False),
        (b"ldp/v1/receipts/#", False),
        (b"ldp/v1/receipts/a\x00b", False),
        (b"ldp/v1/receipts/\xff", False),
        (b"ldp/v1/receipts/" + b"a" * 300, False),
    ],
)
def test_only_topics_under_the_prefix_are_answered(topic: bytes, ok: bool) -> None:
    """A device cannot make the collector publish outside the receipt prefix."""
    assert valid_response_topic(topic, b"ldp/v1/receipts/") is ok


def test_the_sizes_docs_wire_format_gives() -> None:
    """docs/wire-format.md "Commit receipts": 24 bytes for one counted report, 21 per entry, 35 for period-expired."""
    rid = bytes(range(16))
    assert len(encode_receipts([Receipt(rid, counted=True)])) == 24
    assert len(encode_receipts([Receipt(rid, counted=True)] * 100)) == 2_105
    one_refusal = len(encode_receipts([Receipt(rid, counted=False, reason="period-expired")]))
    assert one_refusal - 3 == 35
    assert len(encode_receipts([Receipt(rid, counted=True)] * 2000)) <= 42_005


def test_a_receipt_topic_sits_under_the_identity_that_reads_it() -> None:
    """<prefix><identity>/<client id>; without an identity (no ACL) the layout of 0.1.0."""
    assert receipt_topic("ldp/v1/receipts/", "dev-a", "00ab") == "ldp/v1/receipts/dev-a/00ab"
    assert receipt_topic("ldp/v1/receipts/", None, "00ab") == "ldp/v1/receipts/00ab"


@pytest.mark.parametrize(
    ("topic", "sender", "refused"),
    [
        (b"ldp/v1/receipts/dev-a/c1", b"dev-a", None),
        (b"ldp/v1/receipts/fleet-sim/c1", b"fleet-sim/000042", None),
        (b"ldp/v1/receipts/c1", b"", None),
        (b"ldp/v1/receipts/dev-a/c1/x", b"", None),
        (b"ldp/v1/receipts/dev-b/c1", b"dev-a", "other-identity"),
        (b"ldp/v1/receipts/dev-a/c1/x", b"dev-a", "other-identity"),
        (b"ldp/v1/receipts/dev-a/", b"dev-a", "other-identity"),
        (b"ldp/v1/receipts/000042/c1", b"fleet-sim/000042", "other-identity"),
        (b"ldp/v1/receipts/dev-ab/c1", b"dev-a", "other-identity"),
        (b"ldp/v1/receipts/c1", b"dev-a", "previous-layout"),
        # The user level against the sender's first level, read in place: a prefix of either is not it.
        (b"ldp/v1/receipts/dev-a/c1", b"dev", "other-identity"),
        (b"ldp/v1/receipts/dev/c1", b"dev-a/7", "other-identity"),
        (b"ldp/v1/receipts/dev-a/c1", b"dev-a/", None),
        (b"ldp/v1/receipts//c1", b"/7", None),
        (b"ldp/v1/receipts//c1", b"dev-a", "other-identity"),
    ],
)
def test_only_the_senders_own_receipt_topic_is_answered(topic: bytes, sender: bytes, refused: str | None) -> None:
    """The first identity level of the report topic (the broker user) must be the topic's user level."""
    assert valid_response_topic(topic, b"ldp/v1/receipts/")
    assert foreign_response_topic(topic, b"ldp/v1/receipts/", sender) == refused
