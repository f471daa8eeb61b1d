"""The report's envelope: its keys, sizes and bytes, beneath both the registry and the decoder.

:mod:`protocol.wire` builds reports for a registry's use cases and decodes them against it;
:mod:`protocol.registry` refuses a use case whose largest report the pipe cannot carry, so it
needs the envelope's size. Both rest on this module, which imports neither: the two never
import each other (``tests/test_import_graph.py``). ``protocol.wire`` re-exports what it
always offered (``Report``, ``encode_report``, the sizes); the layout is described in
``docs/wire-format.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

__all__ = [
    "FORMAT_VERSION",
    "HASH_SIZE",
    "MAX_REPORT_BYTES",
    "REPORT_ID_SIZE",
    "Report",
    "encode_report",
    "largest_report_size",
    "report_records",
]

FORMAT_VERSION: Final = 2
"""The report format :mod:`protocol.wire` writes: 2, whose ``h`` is the use case's definition
hash. The decoder also reads format 1 (``h``: the whole registry's hash), which agents of the
previous release send (``docs/wire-format.md``)."""

FORMATS_READ: Final = (1, 2)
"""The report formats the decoder reads."""

REPORT_ID_SIZE: Final = 16
"""Bytes of the random report id."""

HASH_SIZE: Final = 16
"""Bytes of the hash carried in every report: the use case's definition hash (format 2) or
the registry's canonical hash (format 1)."""

MAX_REPORT_BYTES: Final = 64 * 1024
"""Cap on one encoded report, shared end to end: the loader refuses a use case whose largest
report (:attr:`protocol.registry.UseCase.max_report_bytes`) exceeds it, the collector's default
``max_report_bytes`` and ``protocol.wire.DEFAULT_MAX_SIZE`` equal it, and the broker's
``max_packet_size`` (``deploy/mosquitto/mosquitto.conf``) leaves room for it plus the MQTT
framing. A report the pipe cannot carry is thus refused where it is configured, not lost
after the device has charged its ε."""

# Wire keys, in the order the encoder writes them; new fields go last (docs/design.md, convention 9).
K_VERSION: Final = "v"
K_USE_CASE: Final = "u"
K_HASH: Final = "h"
K_PERIOD: Final = "p"
K_ID: Final = "i"
K_RECORDS: Final = "r"
FIELD_NAMES: Final = {
    K_VERSION: "version",
    K_USE_CASE: "use_case",
    K_HASH: "definition",
    K_PERIOD: "period",
    K_ID: "report_id",
    K_RECORDS: "records",
}
REQUIRED: Final = (K_VERSION, K_USE_CASE, K_HASH, K_PERIOD, K_ID, K_RECORDS)
"""The keys of formats 1 and 2 (the same six; only the meaning of ``h`` differs)."""


@dataclass(frozen=True, kw_only=True)
class Report:
    """One report as it is sent: the envelope and the records in the mechanism's compact form.

    Attributes:
        use_case: the use case's name.
        definition: the 16-byte hash the records were made under: the use case's definition
            hash (:attr:`protocol.registry.UseCase.definition`, format 2), or in a format-1
            report the registry's canonical hash.
        period: the slot index (``UseCase.period.index_at(t)``), never a finer time.
        report_id: 16 random bytes, fresh for every message (:func:`protocol.wire.new_report_id`).
        records: the output of ``mechanism.encode_records(records)``.
        version: the format version.
    """

    use_case: str
    definition: bytes
    period: int
    report_id: bytes
    records: Sequence[Any]
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # A device must never send what the collector would refuse: catch the mistake here.
        if not isinstance(self.use_case, str) or not self.use_case:
            raise ValueError(f"use_case must be a non-empty string; got {self.use_case!r}")
        for name, value, size in (
            ("definition", self.definition, HASH_SIZE),
            ("report_id", self.report_id, REPORT_ID_SIZE),
        ):
            if type(value) is not bytes or len(value) != size:
                raise ValueError(f"{name} must be {size} bytes; got {value!r}")
        if type(self.period) is not int or self.period < 0:
            raise ValueError(f"period must be a slot index >= 0; got {self.period!r}")
        if type(self.version) is not int:
            raise ValueError(f"version must be an integer; got {self.version!r}")


def encode_report(report: Report) -> bytes:
    """The report's msgpack bytes (keys in the fixed order v, u, h, p, i, r)."""
    out: bytes = msgpack.packb(
        {
            K_VERSION: report.version,
            K_USE_CASE: report.use_case,
            K_HASH: report.definition,
            K_PERIOD: report.period,
            K_ID: report.report_id,
            K_RECORDS: report.records,
        },
        use_bin_type=True,
    )
    return out


def report_records(payload: bytes) -> list[Any]:
    """The records of a report :func:`encode_report` made, read back from its bytes.

    For bytes a device encoded itself and kept (its outbox, whose ledger lists what each
    report carried), not for bytes received: those are decoded strictly, against the use
    case, by :func:`protocol.wire.decode_report`.

    Raises:
        ValueError: ``payload`` is not a report's envelope.
    """
    body = msgpack.unpackb(payload, raw=False)
    if not isinstance(body, dict) or not isinstance(body.get(K_RECORDS), list):
        raise ValueError("not the bytes of an encoded report")
    return list(body[K_RECORDS])


def largest_report_size(*, use_case: str, max_period: int, daily_limit: int, max_record_bytes: int) -> int:
    """Bytes of the largest report a use case allows: ``daily_limit`` records of at most
    ``max_record_bytes`` each, under the period index ``max_period`` and the longest msgpack
    headers those imply. Computed from the parameters alone."""
    envelope = encode_report(
        Report(
            use_case=use_case,
            definition=bytes(HASH_SIZE),
            period=max_period,
            report_id=bytes(REPORT_ID_SIZE),
            records=[],
        )
    )
    array_header = 1 if daily_limit <= 15 else 3 if daily_limit <= 0xFFFF else 5  # fixarray / array 16 / array 32
    return len(envelope) - 1 + array_header + daily_limit * max_record_bytes
