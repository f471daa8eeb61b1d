"""Commit receipts: the collector's word that a report was counted, or will never be.

A broker's PUBACK covers one hop; the report can still be lost between the broker and the
collector's store (docs/design.md §6.2). So an agent publishes each report with the MQTT 5
request/response properties, a **Response Topic** that only its own connection may read,
``<prefix><identity>/<client id>`` (:func:`receipt_topic`; the broker ACL's ``%u/%c``
pattern), and **Correlation Data** equal to the report's 16-byte id, and keeps the report
until a receipt names that id. The collector answers only after the transaction that folded
the report (or recorded its rejection) has committed, one message per response topic per
commit::

    [1, [[correlation, status, reason], ...]]      msgpack; status 0 = counted, 1 = refused

* **counted**: the report's contribution is in the store (now or by an earlier delivery of
  the same bytes: de-duplication makes a resend harmless);
* **refused**: the collector rejected it for good (malformed, expired, another registry,
  over the device's allowance); ``reason`` is the counted rejection reason. Resending the
  same bytes cannot change that, so the agent stops trying.

What a receipt reveals: that the collector committed a message the connection sent, and
the rejection reason. Nothing about the value (the collector never sees it) or about other
devices. The response topic names a connection, so the collector keeps it in memory only
until the receipt is sent: it is never stored, logged or served.

Receipts only to their sender: the collector answers a report only on a topic under the
receipt prefix of the identity that sent it, the first identity level of its report topic,
which the broker's ACL binds to the authenticated user name (:func:`foreign_response_topic`).
Otherwise a device that knew another connection's client id could have the collector send
that connection receipts (refusals that make it drop its reports).

Pure, like the rest of ``protocol``: codecs and checks only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgpack

from protocol.errors import LdpError

__all__ = [
    "MAX_CORRELATION_BYTES",
    "MAX_RECEIPT_BYTES",
    "MAX_RESPONSE_TOPIC_BYTES",
    "RECEIPT_FORMAT",
    "MalformedReceiptError",
    "Receipt",
    "decode_receipts",
    "encode_receipts",
    "foreign_response_topic",
    "receipt_topic",
    "valid_response_topic",
]

RECEIPT_FORMAT: Final = 1
MAX_CORRELATION_BYTES: Final = 32
"""Longest Correlation Data answered; an agent sends the 16-byte report id."""
MAX_RESPONSE_TOPIC_BYTES: Final = 256
MAX_RECEIPT_BYTES: Final = 256 * 1024
_MAX_REASON: Final = 64
COUNTED: Final = 0
REFUSED: Final = 1
_SLASH: Final = ord("/")


class MalformedReceiptError(LdpError):
    """Bytes on a receipt topic are not a valid receipt message; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"malformed receipt: {reason}")


@dataclass(frozen=True, slots=True)
class Receipt:
    """One report's outcome.

    Attributes:
        correlation: the Correlation Data the report was published with (its report id).
        counted: True when the report's contribution is committed; False when it was refused.
        reason: the rejection reason when refused, else ``""``.
    """

    correlation: bytes
    counted: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if not 0 < len(self.correlation) <= MAX_CORRELATION_BYTES:
            raise ValueError(f"correlation must be 1..{MAX_CORRELATION_BYTES} bytes; got {len(self.correlation)}")
        if len(self.reason) > _MAX_REASON:
            raise ValueError(f"reason longer than {_MAX_REASON} characters")


def valid_response_topic(topic: bytes, prefix: bytes) -> bool:
    """Whether the collector may publish a receipt to ``topic``.

    Only topics strictly under ``prefix``, without wildcards or NUL, at most 256 bytes of
    valid UTF-8: a device must not be able to make the collector publish anywhere else
    (into the report topics, say).
    """
    if not prefix or not topic.startswith(prefix) or len(topic) <= len(prefix):
        return False
    if len(topic) > MAX_RESPONSE_TOPIC_BYTES or b"+" in topic or b"#" in topic or b"\x00" in topic:
        return False
    if topic.isascii():  # the usual topic, valid UTF-8 without decoding it
        return True
    try:
        topic.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def receipt_topic(prefix: str, identity: str | None, client_id: str) -> str:
    """The response topic of one connection: ``<prefix><identity>/<client id>``.

    ``identity`` is the broker's user name for the device (the certificate's common name on
    the mTLS listener); None for an anonymous broker without an ACL, where the topic is
    ``<prefix><client id>`` as in release 0.1.0.
    """
    return prefix + client_id if identity is None else f"{prefix}{identity}/{client_id}"


def foreign_response_topic(topic: bytes, prefix: bytes, sender: bytes) -> str | None:
    """Why the collector must not answer on ``topic`` a report from ``sender``; None when it may.

    ``topic`` already passed :func:`valid_response_topic`. ``sender`` is the identity levels
    of the report topic; its first level is the broker user the ACL checked (the fleet
    simulator's ``fleet-sim/000042`` is user ``fleet-sim``). An empty sender (a broker
    without identities, hence without an ACL to bind a topic to anyone) is answered on any
    valid topic.

    Returns:
        ``"other-identity"`` when the topic is not ``<prefix><user>/<one level>``,
        ``"previous-layout"`` when it is ``<prefix><one level>`` (release 0.1.0's layout,
        which names no user, so its owner cannot be checked), else None.
    """
    if not sender:
        return None
    # Read in place: the user level is topic[start:slash], the client level what follows.
    start = len(prefix)
    slash = topic.find(b"/", start)
    if slash < 0:
        return "previous-layout"
    user = topic[start:slash]
    owner = sender.startswith(user) and (len(sender) == len(user) or sender[len(user)] == _SLASH)
    if not owner or slash == len(topic) - 1 or topic.find(b"/", slash + 1) >= 0:
        return "other-identity"
    return None


def encode_receipts(receipts: Sequence[Receipt]) -> bytes:
    """One receipt message."""
    body = [[r.correlation, COUNTED if r.counted else REFUSED, r.reason] for r in receipts]
    data: bytes = msgpack.packb([RECEIPT_FORMAT, body], use_bin_type=True)
    return data


def _no_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def decode_receipts(data: bytes) -> list[Receipt]:
    """Strictly decode a receipt message.

    Raises:
        MalformedReceiptError: any other bytes.
    """
    if len(data) > MAX_RECEIPT_BYTES:
        raise MalformedReceiptError(f"{len(data)} bytes exceed {MAX_RECEIPT_BYTES}")
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext, timestamp=0)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise MalformedReceiptError(f"not msgpack: {exc}") from exc
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == RECEIPT_FORMAT and isinstance(doc[1], list)):
        raise MalformedReceiptError(f"expected [{RECEIPT_FORMAT}, [...]]")
    out: list[Receipt] = []
    for entry in doc[1]:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise MalformedReceiptError("an entry is not [correlation, status, reason]")
        correlation, status, reason = entry
        if not isinstance(correlation, bytes) or not 0 < len(correlation) <= MAX_CORRELATION_BYTES:
            raise MalformedReceiptError("bad correlation data")
        if type(status) is not int or status not in (COUNTED, REFUSED):
            raise MalformedReceiptError("bad status")
        if not isinstance(reason, str) or len(reason) > _MAX_REASON:
            raise MalformedReceiptError("bad reason")
        out.append(Receipt(correlation, status == COUNTED, reason))
    return out
