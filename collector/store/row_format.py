"""What both store backends write alike: blob encoding, row checksums, segments, allowance tags.

* A blob is msgpack (``b"m"``), or zlib-compressed msgpack (``b"z"``) past 4 KiB unless a sample
  of it does not compress (the random bits of sketch records: compressing them costs more CPU
  than the rest of their commit and saves a few per cent of their size).
* A **sealed** blob (the ``data`` of an aggregates or segments row) is ``b"s"`` + a 16-byte
  keyed BLAKE2b checksum over the row's key, totals and payload + the payload (schema 2).
* A remembered **report id** is the 16-byte id + a 4-byte BLAKE2b tag over the id, its use
  case and its period.
* A **segment** is one commit's contribution to one (use case, period): a small partial
  aggregate (kind ``a``), or for mechanisms whose aggregate is large the commit's records in
  columnar form, already shuffled (kind ``r``; ``l`` for a list of batches that cannot be
  concatenated column-wise).
* An **allowance tag** is the keyed BLAKE2b of a device identity under the (use case,
  period)'s random key (docs/device-identity.md).

Both backends call these, so a row's meaning is the same in SQLite and in PostgreSQL.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from collector.errors import StoreError
from collector.folding import batch_from_plain, batch_to_plain, concat_batches
from collector.store.interface import FoldedReport
from protocol.errors import StateError
from protocol.registry import UseCase
from protocol.server.contract import Aggregate, Batch

__all__ = [
    "AGGREGATE",
    "BIG_SEGMENTS",
    "LIST",
    "RECORDS",
    "RID_BYTES",
    "SMALL_AGGREGATE",
    "TAG_BYTES",
    "Segment",
    "UseCaseRow",
    "allowance_tag",
    "allowance_tagger",
    "digest",
    "fold_segment",
    "footprint",
    "group_by_key",
    "make_segment",
    "pack",
    "rid_tag",
    "seal",
    "segment_rows",
    "total_counters",
    "unpack",
    "unseal",
]

# A segment of kind "a" is an aggregate's plain form; "r" a columnar batch; "l" a list of
# batches (for a batch class that cannot be concatenated column-wise).
AGGREGATE, RECORDS, LIST = "a", "r", "l"
SMALL_AGGREGATE = 64 * 1024
"""Use the partial-aggregate form when the empty aggregate's arrays are at most this big."""
BIG_SEGMENTS = 256 << 20
"""Segments of one key this large are compacted whatever their number."""
_SEALED = b"s"
DIGEST_BYTES = 16
TAG_BYTES = 4
RID_BYTES = 16
_TAG_PERSON = b"ldp-allowance"


def footprint(obj: object, depth: int = 0) -> int:
    """Bytes of the numpy arrays an aggregate holds (nested aggregates and lists included).

    Cheap where ``to_plain`` is not: an empty Count Mean Sketch of the deployed size is a
    lazily zeroed 2**26-counter table that serialising would have to touch entirely.
    """
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if depth > 4:
        return 0
    if isinstance(obj, list | tuple):
        return sum(footprint(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return sum(footprint(x, depth + 1) for x in obj.values())
    attrs = getattr(obj, "__dict__", None)
    if attrs is None:
        return 0
    return sum(footprint(v, depth + 1) for k, v in attrs.items() if k != "mechanism")


_SAMPLE_BYTES = 1024
"""The size of each of the three slices :func:`pack` compresses to judge a blob."""
_INCOMPRESSIBLE = 0.9
"""A blob whose sample compresses to more than this share of its size is stored as it is."""


def pack(obj: object) -> bytes:
    """msgpack, compressed past 4 KiB unless it does not compress (module docstring).

    Three slices at a quarter, half and three quarters of the blob are compressed first: a
    segment of sketch records is mostly their random bits (docs/benchmarks.md, "The store's
    blobs: compressing random bits").
    """
    raw: bytes = msgpack.packb(obj, use_bin_type=True)
    if len(raw) <= 4096:
        return b"m" + raw
    size = len(raw)
    sample = b"".join(raw[at : at + _SAMPLE_BYTES] for at in (size // 4, size // 2, 3 * size // 4))
    if len(zlib.compress(sample, 1)) > _INCOMPRESSIBLE * len(sample):
        return b"m" + raw
    return b"z" + zlib.compress(raw, 1)


def unpack(blob: bytes) -> Any:
    """The object :func:`pack` made.

    Raises:
        StoreError: the blob cannot be read (the store is damaged).
    """
    try:
        raw = zlib.decompress(blob[1:]) if blob[:1] == b"z" else blob[1:]
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (zlib.error, ValueError, msgpack.UnpackException) as exc:
        raise StoreError(f"a checkpoint blob cannot be read ({exc}); the database is damaged") from exc


def digest(*parts: object) -> bytes:
    """The checksum of a stored row: keyed BLAKE2b-128 over the msgpack of its fields."""
    encoded: bytes = msgpack.packb(parts, use_bin_type=True)
    return hashlib.blake2b(encoded, digest_size=DIGEST_BYTES, person=b"ldp-checkpoint").digest()


def seal(table: str, key: tuple[object, ...], payload: bytes) -> bytes:
    """``data`` for an aggregates or segments row: the payload behind its row checksum.

    ``key`` is the row's other columns: ``(uc, period, kind, reports, records)`` (kind ``""``
    for aggregates).
    """
    return _SEALED + digest(table, *key, payload) + payload


def unseal(table: str, key: tuple[object, ...], data: object, damaged: Callable[[str], StoreError]) -> Any:
    """The unpacked payload of a sealed row (see :func:`seal`), after checking its checksum.

    Raises:
        StoreError: made by ``damaged`` from what is wrong with the row.
    """
    what = f"table {table}, use case id {key[0]!r}, period {key[1]!r}"
    if isinstance(data, memoryview | bytearray):
        data = bytes(data)
    if not isinstance(data, bytes) or len(data) < 1 + DIGEST_BYTES or data[:1] != _SEALED:
        raise damaged(f"{what}: the data is not a sealed checkpoint blob")
    payload = data[1 + DIGEST_BYTES :]
    if digest(table, *key, payload) != data[1 : 1 + DIGEST_BYTES]:
        raise damaged(f"{what}: the checksum does not match the row")
    return unpack(payload)


def rid_tag(rid: bytes, uc: int, period: int) -> bytes:
    """A remembered report id: the id and a 4-byte tag over it, its use case and its period.

    Fixed-width fields straight into BLAKE2b (no msgpack): start-up checks every remembered
    id, a million of them or more.
    """
    fields = rid + uc.to_bytes(8, "big", signed=True) + period.to_bytes(8, "big", signed=True)
    return rid + hashlib.blake2b(fields, digest_size=TAG_BYTES, person=b"ldp-seen").digest()


def allowance_tag(sender: bytes, key: bytes) -> bytes:
    """The keyed hash that stands for a device identity within one (use case, period)."""
    return hashlib.blake2b(sender, key=key, digest_size=16, person=_TAG_PERSON).digest()


def allowance_tagger(key: bytes) -> Callable[[bytes], bytes]:
    """:func:`allowance_tag` under ``key`` for many senders: the keyed state is computed once and
    copied for each sender (the same digests, without hashing the key block every time)."""
    keyed = hashlib.blake2b(key=key, digest_size=16, person=_TAG_PERSON)

    def tag(sender: bytes) -> bytes:
        h = keyed.copy()
        h.update(sender)
        return h.digest()

    return tag


@dataclass
class UseCaseRow:
    """A registered use case: its row id, its definition and how its segments are stored."""

    id: int
    use_case: UseCase
    kind: str
    template: Batch  # an empty batch of the mechanism, for rebuilding stored batches

    @classmethod
    def of(cls, row_id: int, use_case: UseCase) -> UseCaseRow:
        """The row of ``use_case`` stored under ``row_id``."""
        kind = AGGREGATE if footprint(use_case.server.new_aggregate()) <= SMALL_AGGREGATE else RECORDS
        return cls(row_id, use_case, kind, use_case.server.empty_batch())


def make_segment(row: UseCaseRow, members: Sequence[FoldedReport]) -> tuple[str, bytes, int]:
    """The segment of ``members`` (one key's reports of one commit): kind, packed payload, records."""
    batches = [r.batch for r in members]
    count = sum(len(b) for b in batches)
    joined = concat_batches(batches)
    if row.kind == AGGREGATE:
        mech = row.use_case.server
        agg = mech.new_aggregate()
        if joined is not None:
            mech.fold(agg, joined)
        else:
            for b in batches:
                mech.fold(agg, b)
        return AGGREGATE, pack(agg.to_plain()), count
    if joined is not None:
        return RECORDS, pack(batch_to_plain(joined)), count
    return LIST, pack([batch_to_plain(b) for b in batches]), count


Segment = tuple[int, int, str, int, int, bytes]
"""A segment row to insert: use case id, period, kind, reports, records, sealed data."""


def segment_rows(
    use_cases: Mapping[str, UseCaseRow], groups: Mapping[tuple[str, int], Sequence[FoldedReport]]
) -> tuple[list[Segment], int]:
    """The sealed segment rows of a commit's groups (by definition ref and period), and the records they hold."""
    segments: list[Segment] = []
    records = 0
    for (name, period), members in groups.items():
        row = use_cases[name]
        kind, blob, count = make_segment(row, members)
        records += count
        sealed = seal("segments", (row.id, period, kind, len(members), count), blob)
        segments.append((row.id, period, kind, len(members), count, sealed))
    return segments, records


def fold_segment(row: UseCaseRow, agg: Aggregate, kind: str, data: Any, where: str) -> Aggregate:
    """Fold an unsealed segment payload into ``agg`` (which may be changed in place).

    Raises:
        StoreError: the segment cannot be folded (``where`` names the store).
    """
    mech = row.use_case.server
    try:
        if kind == AGGREGATE:
            return agg.merge(mech.restore_aggregate(data))
        if kind == RECORDS:
            mech.fold(agg, batch_from_plain(row.template, data))
            return agg
        if kind == LIST:
            for item in data:
                mech.fold(agg, batch_from_plain(row.template, item))
            return agg
    except (StateError, KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{where}: a {row.use_case.name} segment cannot be folded ({exc})") from exc
    raise StoreError(f"{where}: unknown segment kind {kind!r}")


def group_by_key(reports: Sequence[FoldedReport]) -> dict[tuple[str, int], list[FoldedReport]]:
    """Reports by (use case, period), in their order."""
    groups: dict[tuple[str, int], list[FoldedReport]] = defaultdict(list)
    for r in reports:
        groups[(r.use_case.ref, r.period)].append(r)
    return groups


def total_counters(
    counters: Mapping[str, int], *, fresh: int, records: int, expired: int, duplicates: int, over: int
) -> dict[str, int]:
    """Ingest's counters with what the commit itself decided added."""
    out = dict(counters)
    for name, value in (
        ("rejected:period-expired", expired),
        ("duplicates", duplicates),
        ("rejected:over-allowance", over),
        ("reports", fresh),
        ("records", records),
    ):
        if value or name in ("reports", "records"):
            out[name] = out.get(name, 0) + value
    return out
