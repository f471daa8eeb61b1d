"""Plain-data (msgpack-ready) forms of numpy arrays, for state and aggregate serialisation.

Saved states and aggregates are dicts of ``int``, ``float``, ``str``, ``bytes``, lists and
dicts only, so they serialise to msgpack (and back) without custom hooks. Arrays travel
as ``{"dtype": str, "shape": [...], "data": bytes}`` in little-endian order. Fields are read
with :func:`protocol.checks.require` (pure Python: device state is checked with it too).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from protocol.checks import require
from protocol.errors import StateError
from protocol.plain import PlainDoc

__all__ = ["array_from_plain", "array_to_plain", "require"]

_ALLOWED_DTYPES = frozenset({"<i8", "<u8", "<i4", "<u4", "<u2", "|u1", "|i1", "<f8", "|b1"})


def array_to_plain(a: npt.NDArray[Any]) -> PlainDoc:
    """A plain dict holding ``a``'s dtype, shape and little-endian bytes."""
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return {"dtype": le.dtype.str, "shape": list(a.shape), "data": np.ascontiguousarray(le).tobytes()}


def array_from_plain(data: object, *, dtype: str, shape: tuple[int, ...], field: str) -> npt.NDArray[Any]:
    """Rebuild an array saved by :func:`array_to_plain`, checking dtype and shape.

    Raises:
        StateError: naming ``field`` if anything does not match.
    """
    if not isinstance(data, dict):
        raise StateError(f"{field}: expected an array record, got {type(data).__name__}")
    want = np.dtype(dtype).newbyteorder("<").str
    if want not in _ALLOWED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}")
    if data.get("dtype") != want:
        raise StateError(f"{field}: expected dtype {want}, got {data.get('dtype')!r}")
    got_shape = data.get("shape")
    if not isinstance(got_shape, list) or tuple(got_shape) != shape:
        raise StateError(f"{field}: expected shape {list(shape)}, got {got_shape!r}")
    raw = data.get("data")
    itemsize = np.dtype(want).itemsize
    count = int(np.prod(shape, dtype=np.int64))
    if not isinstance(raw, bytes) or len(raw) != itemsize * count:
        raise StateError(f"{field}: expected {itemsize * count} bytes of array data")
    return np.frombuffer(raw, dtype=want).reshape(shape).astype(np.dtype(dtype), copy=True)
