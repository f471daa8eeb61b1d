"""The report: one msgpack message per use case per send, and its strict, total decoder.

A report carries exactly what the collector needs to fold it and nothing that identifies
the device (``docs/design.md``, invariant 4): the format version, the use case's name, the
hash of the use case's definition (:attr:`protocol.registry.UseCase.definition`), the period
index (the 6-hour or daily slot since the Unix epoch, never a finer time), a 16-byte random
report id (drawn fresh from the CSPRNG for every message; it de-duplicates redeliveries and
links nothing), and the records in the mechanism's compact form. On the wire it is a msgpack map with one-letter keys::

    {"v": 2, "u": "emoji", "h": <bin 16>, "p": 81234, "i": <bin 16>, "r": [...]}

Format 1, which agents of the previous release send, has the same six keys; its ``h`` is the
canonical hash of the agent's whole registry. The decoder reads both against a
:class:`~protocol.catalog.Catalog` (the definitions of every registry file the collector was
given): a format-2 report is counted under the definition its hash names, a format-1 report
under its registry's definition of the use case.

Decoding is total (docs/design.md, convention 8): for any ``bytes``, :func:`decode_report` either returns
a :class:`DecodedReport` whose batch satisfies the mechanism's schema, or raises
:class:`~protocol.errors.MalformedReportError` with a machine-readable ``reason`` and the
``field`` at fault; no other exception escapes, and nothing is allocated beyond a small
multiple of the (capped) message size. The checks, in order: the size cap (before any
decoding); msgpack well-formedness with the unpacker's length limits set to the cap and
extension types refused; no trailing bytes; a map with no repeated key; the version, then
no unknown and no missing key; use case; definition hash (format 1: registry hash); period; report id; the records
(plain msgpack types only, no timestamp values, at most :data:`MAX_DEPTH` deep, then the
mechanism's own strict ``decode_records``); and the record count (at least one, at most
the use case's daily limit).

``docs/wire-format.md`` documents the schema, the reason codes, the schema-evolution rules
and the encoded sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from protocol.catalog import Catalog, catalog_of
from protocol.envelope import (
    FIELD_NAMES,
    FORMAT_VERSION,
    FORMATS_READ,
    HASH_SIZE,
    K_HASH,
    K_ID,
    K_PERIOD,
    K_RECORDS,
    K_USE_CASE,
    K_VERSION,
    MAX_REPORT_BYTES,
    REPORT_ID_SIZE,
    REQUIRED,
    Report,
    encode_report,
    largest_report_size,
)
from protocol.errors import MalformedReportError
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import Registry, UseCase

__all__ = [
    "DEFAULT_MAX_SIZE",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "REASONS",
    "REPORT_ID_SIZE",
    "DecodedReport",
    "Report",
    "decode_report",
    "encode_report",
    "encode_reports",
    "make_report",
    "max_report_size",
    "new_report_id",
]

DEFAULT_MAX_SIZE: Final = MAX_REPORT_BYTES
"""Default cap on an encoded report, checked before decoding: the registry's
:data:`~protocol.registry.MAX_REPORT_BYTES`, which no use case's largest report exceeds."""

MAX_DEPTH: Final = 16
"""Deepest nesting accepted (the envelope map is depth 1). The records of every mechanism
need at most 5; anything deeper is hostile."""

REASONS: Final = frozenset(
    {
        # the envelope (this module)
        "oversize",
        "truncated",
        "bad-encoding",
        "trailing-bytes",
        "too-deep",
        "bad-type",
        "missing-field",
        "unknown-field",
        "duplicate",
        "unknown-version",
        "unknown-use-case",
        "unknown-definition",
        "registry-mismatch",
        "out-of-range",
        "bad-length",
        "too-many-records",
        # the records (the mechanisms' decode_records, with field "records[...]")
        "bad-padding",
    }
)
"""Every ``MalformedReportError.reason`` the decoder can raise."""

_SCALAR_TYPES: Final = frozenset({int, float, str, bytes, bool, type(None)})
_BYTES: Final = (bytes, bytearray, memoryview)


@dataclass(frozen=True, kw_only=True, eq=False)
class DecodedReport:
    """A report that passed every check.

    Attributes:
        use_case: the definition the report was made under (its ``ref`` names it).
        period: the slot index.
        report_id: the 16-byte report id (for de-duplication).
        batch: the records in the mechanism's columnar form, ready for ``aggregate.add``.
        version: the format version.
    """

    use_case: UseCase
    period: int
    report_id: bytes
    batch: Any = field(repr=False)
    version: int = FORMAT_VERSION

    @property
    def count(self) -> int:
        """Number of records in the report."""
        return len(self.batch)


def new_report_id(rng: RandomSource) -> bytes:
    """16 fresh random bytes for a report id (devices pass ``SystemRandom()``)."""
    return random_bytes(rng, 16)


def make_report(
    use_case: UseCase,
    registry: Registry,
    *,
    period: int,
    records: Sequence[Any],
    rng: RandomSource,
) -> Report:
    """Build the report for a use case's privatized records, with a fresh report id.

    The report carries the use case's definition hash (format 2).

    Args:
        use_case: the use case (from ``registry``).
        registry: the registry it belongs to.
        period: the slot index the records belong to.
        records: privatized records of ``use_case.mechanism`` (at most ``daily_limit``).
        rng: the source of the report id (``SystemRandom()`` on devices).

    Raises:
        ValueError: on a caller mistake (foreign use case, empty or too many records, bad period).
    """
    if registry.use_cases.get(use_case.name) is not use_case:
        raise ValueError(f"use case {use_case.name!r} is not the registry's use case of that name")
    if not 1 <= len(records) <= use_case.daily_limit:
        raise ValueError(f"a report carries 1 to {use_case.daily_limit} records; got {len(records)}")
    if isinstance(period, bool) or not isinstance(period, int) or not 0 <= period <= use_case.period.max_index:
        raise ValueError(f"period must be a slot index in [0, {use_case.period.max_index}]; got {period!r}")
    return Report(
        use_case=use_case.name,
        definition=use_case.definition,
        period=period,
        report_id=new_report_id(rng),
        records=use_case.mechanism.encode_plain(records),
    )


def encode_reports(
    use_case: str, definition: bytes, period: int, report_ids: Sequence[bytes], records: Sequence[Sequence[Any]]
) -> list[bytes]:
    """The bytes of many reports of one use case and period: ``encode_report`` of each
    ``Report(use_case, definition, period, report_ids[i], records[i])``, byte for byte.

    The envelope up to the report id is the same for all of them, so it is packed once and
    only the report id and the records are packed per report (a fleet simulator sends every
    device's report of a period at once).

    Raises:
        ValueError: a field :class:`Report` refuses, or unequal numbers of ids and records.
    """
    if len(report_ids) != len(records):
        raise ValueError(f"{len(report_ids)} report ids for {len(records)} record lists")
    Report(use_case=use_case, definition=definition, period=period, report_id=bytes(REPORT_ID_SIZE), records=[])
    packer = msgpack.Packer(use_bin_type=True)
    # The map of encode_report: six keys in the order v, u, h, p, i, r.
    head = b"".join(
        [
            packer.pack_map_header(len(REQUIRED)),
            *(packer.pack(part) for part in (K_VERSION, FORMAT_VERSION, K_USE_CASE, use_case)),
            *(packer.pack(part) for part in (K_HASH, definition, K_PERIOD, period, K_ID)),
        ]
    )
    id_head = packer.pack(bytes(REPORT_ID_SIZE))[:-REPORT_ID_SIZE]
    records_key = packer.pack(K_RECORDS)
    out: list[bytes] = []
    for report_id, recs in zip(report_ids, records, strict=True):
        if type(report_id) is not bytes or len(report_id) != REPORT_ID_SIZE:
            raise ValueError(f"report_id must be {REPORT_ID_SIZE} bytes; got {report_id!r}")
        out.append(b"".join((head, id_head, report_id, records_key, packer.pack(recs))))
    return out


def max_report_size(use_case: UseCase) -> int:
    """Bytes of the largest report ``use_case`` allows (:func:`protocol.envelope.largest_report_size`)."""
    return largest_report_size(
        use_case=use_case.name,
        max_period=use_case.period.max_index,
        daily_limit=use_case.daily_limit,
        max_record_bytes=use_case.mechanism.max_record_bytes,
    )


# --- decoding --------------------------------------------------------------------------------


class _PairsHook:
    """Builds each map from its key/value pairs, remembering maps whose keys repeat.

    msgpack would otherwise keep the last value silently; a repeated key is refused.
    One instance per decode call (the unpacker calls it for every map, innermost first).
    """

    __slots__ = ("duplicated",)

    def __init__(self) -> None:
        self.duplicated: list[tuple[dict[Any, Any], Any]] = []

    def __call__(self, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set[Any] = set()
            for key, _ in pairs:
                if key in seen:
                    self.duplicated.append((d, key))
                    break
                seen.add(key)
        return d


def _reject_ext(code: int, data: bytes) -> object:
    raise MalformedReportError("bad-type", "", f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, max_size: int) -> tuple[object, _PairsHook]:
    hook = _PairsHook()
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            object_pairs_hook=hook,
            ext_hook=_reject_ext,
            timestamp=0,
            # Lengths are bounded by the (already capped) message size; each element of an
            # array or map takes at least one byte, so nothing larger can be legitimate.
            max_bin_len=max_size,
            max_str_len=max_size,
            max_array_len=max_size,
            max_map_len=max_size // 2,
            max_ext_len=max_size,
        )
    except MalformedReportError:
        raise
    except msgpack.ExtraData:
        raise MalformedReportError("trailing-bytes", "", "bytes follow the end of the message") from None
    except msgpack.StackError:
        raise MalformedReportError("too-deep", "", "nesting exceeds the unpacker's stack") from None
    except UnicodeDecodeError:
        raise MalformedReportError("bad-encoding", "", "a string is not valid UTF-8") from None
    except ValueError as exc:
        text = str(exc)
        if "incomplete input" in text:
            raise MalformedReportError("truncated", "", "the message ends inside a value") from None
        if "exceeds max_" in text:
            raise MalformedReportError("oversize", "", text) from None
        if "is not allowed for map key" in text:
            raise MalformedReportError("bad-type", "", text) from None
        raise MalformedReportError("bad-encoding", "", text or type(exc).__name__) from None
    except msgpack.UnpackException as exc:  # the library's remaining failure modes
        raise MalformedReportError("bad-encoding", "", f"{type(exc).__name__}: {exc}") from None
    return obj, hook


_SIZE_SLACK: Final = 64
"""Bytes a message may exceed its use case's largest report by before the header check calls
it ``oversize``: enough that a malformed envelope of about the right size is named by its
actual fault (an unknown key, a float version) by the full decode, and few enough to add
only a few dozen msgpack objects to the work a hostile message can cause."""


_INT_WIDTH: Final = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


def _encoder_layout(data: bytes) -> tuple[str, int] | None:  # noqa: PLR0911, PLR0912  hand-read fast path, one test per byte
    """The use case and declared record count of a message laid out exactly as
    :func:`encode_report` writes it (``{v, u, h, p, i, r}`` in that order, 16-byte bins), read
    by hand: about a third of the cost of a general header scan, and every honest report
    takes this path. ``None`` for any other layout (the general scan then reads it)."""
    try:
        if data[0] != 0x86 or data[1:3] != b"\xa1v" or data[3] > 0x7F or data[4:6] != b"\xa1u":
            return None
        pos = 6
        head = data[pos]
        if 0xA0 <= head <= 0xBF:
            length, pos = head & 0x1F, pos + 1
        elif head == 0xD9:
            length, pos = data[pos + 1], pos + 2
        else:
            return None
        name = data[pos : pos + length].decode("utf-8")
        pos += length
        if data[pos : pos + 4] != b"\xa1h\xc4\x10":
            return None
        pos += 4 + HASH_SIZE
        if data[pos : pos + 2] != b"\xa1p":
            return None
        head = data[pos + 2]
        pos += 3 + (0 if head <= 0x7F else _INT_WIDTH[head])
        if data[pos : pos + 4] != b"\xa1i\xc4\x10":
            return None
        pos += 4 + REPORT_ID_SIZE
        if data[pos : pos + 2] != b"\xa1r":
            return None
        head = data[pos + 2]
        if 0x90 <= head <= 0x9F:
            count = head & 0x0F
        elif head == 0xDC:
            count = int.from_bytes(data[pos + 3 : pos + 5], "big")
        elif head == 0xDD:
            count = int.from_bytes(data[pos + 3 : pos + 7], "big")
        else:
            return None
    except (IndexError, KeyError, UnicodeDecodeError):
        return None
    return name, count


def _check_bounds(data: bytes, name: str, bounds: tuple[int, int], count: int) -> None:
    """``oversize`` or ``too-many-records`` for a message over its use case's bounds (the
    largest report and record count of any of its definitions)."""
    largest, limit = bounds
    if len(data) > largest + _SIZE_SLACK:
        raise MalformedReportError(
            "oversize",
            "",
            f"{len(data)} bytes exceed the {largest} bytes of the largest report of use case {name!r}",
        )
    if count > limit:
        raise MalformedReportError("too-many-records", "records", f"{count} records declared; the limit is {limit}")


def _check_headers(data: bytes, catalog: Catalog) -> None:
    """Refuse, from the msgpack headers alone, a report bigger than its use case allows.

    Reads the envelope's keys in order, skipping values, up to the records' array header,
    which declares their count: a report larger than its use case's
    :attr:`~protocol.registry.UseCase.max_report_bytes` (plus :data:`_SIZE_SLACK`), or declaring more records than its
    ``daily_limit``, is refused before a single record is unpacked, so a hostile message
    costs no more than a header read (unpacking 16,000 declared records and checking them
    one by one cost about 700 times a valid report). If the records come before the use
    case (a non-canonical order), the bound is the registry's largest. Anything this scan
    does not understand is left to the full decode, which names the fault; a report that
    passes the full decode always passes here.
    """
    fast = _encoder_layout(data)
    if fast is not None:
        known = catalog.largest_report(fast[0])
        if known is not None:
            _check_bounds(data, fast[0], known, fast[1])
        return
    unpacker = msgpack.Unpacker(
        raw=False,
        max_buffer_size=len(data),
        max_bin_len=len(data),
        max_str_len=len(data),
        max_array_len=len(data),
        max_map_len=len(data) // 2,
        max_ext_len=len(data),
    )
    bounds: tuple[int, int] | None = None
    try:
        unpacker.feed(data)
        keys = unpacker.read_map_header()
        for _ in range(min(keys, len(FIELD_NAMES))):
            key = unpacker.unpack()
            if key == K_USE_CASE:
                name = unpacker.unpack()
                bounds = catalog.largest_report(name) if type(name) is str else None
                if bounds is not None:
                    _check_bounds(data, name, bounds, 0)
            elif key == K_RECORDS:
                count = unpacker.read_array_header()
                limit = bounds[1] if bounds is not None else catalog.max_daily_limit
                if count > limit:
                    raise MalformedReportError(
                        "too-many-records", "records", f"{count} records declared; the limit is {limit}"
                    )
                return
            else:
                unpacker.skip()
    except MalformedReportError:
        raise
    except Exception:  # the full decode names every other fault
        return


def _check_plain(value: object, depth: int, path: str) -> None:
    """Only msgpack's plain types, at most MAX_DEPTH deep (the envelope is depth 1).

    The unpacker can also produce ``Timestamp`` objects (ext type -1 bypasses ``ext_hook``);
    mechanisms are promised plain data only. Every report's records pass a fast pass that
    only answers yes or no; a no is walked again by :func:`_plain_fault`, which names the
    fault (field and reason).
    """
    t = type(value)
    if (t is list or t is dict) and _plain_within(value, depth):
        return
    _plain_fault(value, depth, path)


_PLAIN_TYPES: Final = _SCALAR_TYPES | {list, dict}


def _plain_within(container: Any, depth: int) -> bool:
    """Whether a list or dict at ``depth`` holds only plain types, at most MAX_DEPTH deep."""
    if depth > MAX_DEPTH:
        return False
    values = container.values() if type(container) is dict else container
    types = set(map(type, values))
    if types <= _SCALAR_TYPES:
        return True
    if not types <= _PLAIN_TYPES:
        return False
    for item in values:
        t = type(item)
        if (t is list or t is dict) and not _plain_within(item, depth + 1):
            return False
    return True


def _plain_fault(value: object, depth: int, path: str) -> None:
    """The walk that names a fault: raise for the first one it meets, visiting containers one
    by one (each container's element types are checked as one set, in C); return for plain
    data. The reason and field it names do not depend on the fast pass."""
    stack: list[tuple[object, int, str]] = [(value, depth, path)]
    while stack:
        obj, d, p = stack.pop()
        if d > MAX_DEPTH:
            raise MalformedReportError("too-deep", p, f"nesting deeper than {MAX_DEPTH}")
        if isinstance(obj, list):
            values: Any = obj
        elif isinstance(obj, dict):
            values = obj.values()
        else:
            if type(obj) not in _SCALAR_TYPES:
                raise MalformedReportError("bad-type", p, f"{type(obj).__name__} is not allowed")
            continue
        if set(map(type, values)) <= _SCALAR_TYPES:
            continue
        pairs: Any = enumerate(obj) if isinstance(obj, list) else obj.items()
        for key, item in pairs:
            t = type(item)
            if t is list or t is dict:
                stack.append((item, d + 1, _child_path(p, d, key, isinstance(obj, list))))
            elif t not in _SCALAR_TYPES:
                sub = _child_path(p, d, key, isinstance(obj, list))
                raise MalformedReportError("bad-type", sub, f"{t.__name__} is not allowed")


def _child_path(parent: str, depth: int, key: object, indexed: bool) -> str:
    """The documented name of a child: envelope keys by name ("records", not "r"), then paths."""
    if indexed:
        return f"{parent}[{key}]"
    if depth == 1:
        return FIELD_NAMES.get(str(key), str(key))
    return f"{parent}.{key}"


def _fixed_bytes(env: dict[Any, Any], key: str, size: int) -> bytes:
    value = env[key]
    name = FIELD_NAMES[key]
    if type(value) is not bytes:
        raise MalformedReportError("bad-type", name, f"expected {size} bytes (msgpack bin)")
    if len(value) != size:
        raise MalformedReportError("bad-length", name, f"expected {size} bytes; got {len(value)}")
    return value


def _definition(catalog: Catalog, version: int, name: str, digest: bytes) -> UseCase:
    """The definition a report was made under: named by its hash (format 2) or by the
    registry it came from (format 1)."""
    if version >= 2:
        use_case = catalog.by_definition(digest)
        if use_case is None or use_case.name != name:
            raise MalformedReportError(
                "unknown-definition",
                "definition",
                f"use case {name[:80]!r} has no definition {digest.hex()} here (the collector's registry "
                "files do not include the one the device runs)",
            )
        return use_case
    registry = catalog.by_registry(digest)
    if registry is None:
        raise MalformedReportError(
            "registry-mismatch", "definition", f"made under registry {digest.hex()}, which the collector was not given"
        )
    found = registry.use_cases.get(name)
    if found is None:
        raise MalformedReportError(
            "unknown-use-case", "use_case", f"registry {digest.hex()} has no use case {name[:80]!r}"
        )
    return found


def decode_report(
    data: bytes | bytearray | memoryview,
    registry: Catalog | Registry,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
    periods: range | None = None,
) -> DecodedReport:
    """Strictly decode one report received from the network.

    Args:
        data: the message bytes, untrusted.
        registry: the definitions the collector accepts (a :class:`~protocol.catalog.Catalog`;
            a single registry stands for the catalog of its own definitions). A report made
            under any other definition (format 2) or registry (format 1) is refused.
        max_size: the size cap in bytes, checked before anything is decoded.
        periods: if given, the period indices accepted (e.g. the last few slots); otherwise
            any index from 0 to the period's :attr:`~protocol.registry.Period.max_index`.

    Returns:
        The decoded report; its batch satisfies the mechanism's record schema.

    Raises:
        MalformedReportError: for any malformed, hostile or foreign message; ``reason`` is one of
            :data:`REASONS` and ``field`` names the offending field (``""`` for the whole message).
        TypeError: if ``data`` is not bytes (a caller mistake, not hostile input).
    """
    if not isinstance(data, _BYTES):
        raise TypeError(f"decode_report takes bytes; got {type(data).__name__}")
    if len(data) > max_size:
        raise MalformedReportError("oversize", "", f"{len(data)} bytes exceed the cap of {max_size}")
    if len(data) == 0:
        raise MalformedReportError("truncated", "", "empty message")
    data = bytes(data)
    catalog = catalog_of(registry)
    _check_headers(data, catalog)
    env = _envelope(data, max_size)
    version = _version_and_keys(env)
    name = env[K_USE_CASE]
    if type(name) is not str:
        raise MalformedReportError("bad-type", "use_case", "expected a string")
    if not catalog.definitions_of(name):
        raise MalformedReportError("unknown-use-case", "use_case", f"{name[:80]!r} is not in the registry")
    use_case = _definition(catalog, version, name, _fixed_bytes(env, K_HASH, HASH_SIZE))
    period = _period(env, use_case, periods)
    report_id = _fixed_bytes(env, K_ID, REPORT_ID_SIZE)
    return DecodedReport(
        use_case=use_case,
        period=period,
        report_id=report_id,
        batch=_records(env, use_case),
        version=version,
    )


def _envelope(data: bytes, max_size: int) -> dict[Any, Any]:
    """The message unpacked: a map with no repeated key (in it or in the records)."""
    obj, hook = _unpack(data, max_size)
    if not isinstance(obj, dict):
        _check_plain(obj, 1, "")  # a hostile deep structure says "too-deep" rather than "bad-type"
        raise MalformedReportError("bad-type", "", f"expected a map; got {type(obj).__name__}")
    for dup_map, dup_key in hook.duplicated:
        if dup_map is obj:
            raise MalformedReportError("duplicate", FIELD_NAMES.get(dup_key, str(dup_key)), "envelope key repeats")
        raise MalformedReportError("duplicate", "records", f"a map key {dup_key!r} repeats inside the records")
    return obj


def _version_and_keys(env: dict[Any, Any]) -> int:
    """The format version (read first: it decides which keys exist), and exactly its keys."""
    if K_VERSION not in env:
        raise MalformedReportError("missing-field", "version", "no format version")
    version = env[K_VERSION]
    if type(version) is not int:
        raise MalformedReportError("bad-type", "version", "expected an integer")
    if version not in FORMATS_READ:
        raise MalformedReportError(
            "unknown-version", "version", f"this decoder reads versions {', '.join(map(str, FORMATS_READ))}"
        )
    if env.keys() != FIELD_NAMES.keys():
        for key in env:
            if key not in FIELD_NAMES:
                raise MalformedReportError("unknown-field", str(key), f"version {version} has no such key")
        for key in REQUIRED:
            if key not in env:
                raise MalformedReportError("missing-field", FIELD_NAMES[key], "required field is missing")
    return version


def _period(env: dict[Any, Any], use_case: UseCase, periods: range | None) -> int:
    period = env[K_PERIOD]
    if type(period) is not int:
        raise MalformedReportError("bad-type", "period", "expected an integer slot index")
    if not 0 <= period <= use_case.period.max_index:
        raise MalformedReportError(
            "out-of-range", "period", f"slot index must be in [0, {use_case.period.max_index}]; got {period}"
        )
    if periods is not None and period not in periods:
        raise MalformedReportError("out-of-range", "period", f"slot {period} is outside the accepted {periods}")
    return period


def _records(env: dict[Any, Any], use_case: UseCase) -> object:
    """The records, checked for plain types and depth before the mechanism's strict decoder
    sees them (every other envelope field was checked for its exact type already)."""
    raw_records = env[K_RECORDS]
    _check_plain(raw_records, 2, "records")
    batch = use_case.server.decode_records(raw_records)
    count = len(batch)
    if count == 0:
        raise MalformedReportError("bad-length", "records", "a report carries at least one record")
    if count > use_case.daily_limit:
        raise MalformedReportError(
            "too-many-records", "records", f"{count} records exceed the daily limit of {use_case.daily_limit}"
        )
    return batch
