"""Decoding records in the shapes several mechanisms share, into numpy columns, and the checks
of a record list's structure that every strict decoder starts with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from protocol.checks import check_indexed_bits
from protocol.errors import MalformedReportError

__all__ = ["decode_bits", "decode_indexed_bits", "int_record", "record_entries", "record_list"]


def record_list(raw: object, form: str) -> list[object]:
    """``raw`` as the list of records (``form`` shows one, as ``[j, ell, bit]``).

    Raises:
        MalformedReportError: ``bad-type`` naming ``records``.
    """
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", f"expected a list of {form}")
    return raw


def record_entries(rec: object, field: str, form: str, entries: int) -> list[object]:
    """Record ``rec`` (named ``field``, as ``records[i]``) as its list of ``entries`` entries.

    Raises:
        MalformedReportError: ``bad-type`` or ``bad-length`` naming ``field``.
    """
    if not isinstance(rec, list):
        raise MalformedReportError("bad-type", field, f"expected a list {form}")
    if len(rec) != entries:
        raise MalformedReportError("bad-length", field, f"expected {entries} entries, got {len(rec)}")
    return rec


def int_record(rec: object, field: str, form: str, limits: Sequence[tuple[str, int]]) -> list[int]:
    """A record of integers, each named and bounded by ``limits`` (``(name, bound)``: in ``[0, bound)``).

    Raises:
        MalformedReportError: as :func:`record_entries`, or ``bad-type`` or ``out-of-range``
            naming ``{field}.{name}``.
    """
    checked: list[int] = []
    for (name, bound), x in zip(limits, record_entries(rec, field, form, len(limits)), strict=True):
        if type(x) is not int:
            raise MalformedReportError("bad-type", f"{field}.{name}", "expected an integer")
        if not 0 <= x < bound:
            raise MalformedReportError("out-of-range", f"{field}.{name}", f"must lie in [0, {bound})")
        checked.append(x)
    return checked


def decode_bits(raw: object, *, expected: str = "expected a list of bits") -> npt.NDArray[np.uint8]:
    """Strictly decode a list of single-bit records (0 or 1) into a ``uint8`` column.

    Raises:
        MalformedReportError: ``bad-type`` naming ``records`` (``expected`` says what it is
            not) or ``records[i]``, or ``out-of-range`` naming ``records[i]``.
    """
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", expected)
    # Fast path in C (type() also rejects bool, a subclass of int); the loop below only
    # runs to name the first bad record.
    if set(map(type, raw)) <= {int} and set(raw) <= {0, 1}:
        return np.array(raw, dtype=np.uint8)
    for i, bit in enumerate(raw):
        if type(bit) is not int:
            raise MalformedReportError("bad-type", f"records[{i}]", "expected an integer bit")
        if bit not in (0, 1):
            raise MalformedReportError("out-of-range", f"records[{i}]", "a bit is 0 or 1")
    return np.array(raw, dtype=np.uint8)


def decode_indexed_bits(
    raw: object, *, bound: int, width: int, index_name: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Strictly decode a list of ``[index, packed bits]`` records into columns.

    Total (``docs/design.md``: the decoder is total): any object either gives the columns or raises
    :class:`~protocol.errors.MalformedReportError`; each record is checked by
    :func:`check_indexed_bits`.

    Returns:
        The indices (``int64``, shape ``(n,)``) and the packed vectors (``uint8``, shape
        ``(n, ceil(width / 8))``), both freshly allocated and writable.

    Raises:
        MalformedReportError: ``bad-type`` or ``bad-length``, naming ``records`` or
            ``records[i]``, or any reason of :func:`check_indexed_bits`.
    """
    form = f"[{index_name}, bits]"
    records = record_list(raw, form)
    n = len(records)
    indices = np.empty(n, dtype=np.int64)
    parts: list[bytes] = []
    for i, item in enumerate(records):
        rec = record_entries(item, f"records[{i}]", form, 2)
        indices[i], bits = check_indexed_bits(
            rec[0], rec[1], bound=bound, width=width, field=f"records[{i}]", index_name=index_name
        )
        parts.append(bits)
    packed = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, (width + 7) // 8).copy()
    return indices, packed
