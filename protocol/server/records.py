"""Decoding records in the shapes several mechanisms share, into numpy columns."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from protocol.checks import check_indexed_bits
from protocol.errors import MalformedReportError

__all__ = ["decode_bits", "decode_indexed_bits"]


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
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", f"expected a list of {form}")
    n = len(raw)
    indices = np.empty(n, dtype=np.int64)
    parts: list[bytes] = []
    for i, rec in enumerate(raw):
        if not isinstance(rec, list):
            raise MalformedReportError("bad-type", f"records[{i}]", f"expected a list {form}")
        if len(rec) != 2:
            raise MalformedReportError("bad-length", f"records[{i}]", f"expected 2 entries, got {len(rec)}")
        indices[i], bits = check_indexed_bits(
            rec[0], rec[1], bound=bound, width=width, field=f"records[{i}]", index_name=index_name
        )
        parts.append(bits)
    packed = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, (width + 7) // 8).copy()
    return indices, packed
