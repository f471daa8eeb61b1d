"""Bucketing many counter values at once (numpy): the vectorised twin of
:meth:`protocol.buckets.LinearBuckets.bucket_of` and its siblings.

The simulator, the benchmarks and the tests bucket arrays of counters; a device buckets one
value at a time in pure Python (:mod:`protocol.buckets`). :func:`buckets_of` gives the same
answers as ``bucket_of``: float arrays are compared with the float64 edges, integer arrays
with ``ceil(edge)`` (for an integer ``x``, ``x >= e`` exactly when ``x >= ceil(e)``), so no
integer is ever rounded through float64. Edges are at most ``2**53``, so the integer edges fit
``int64``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from protocol.buckets import MAX_EDGE, Buckets
from protocol.errors import InputError

__all__ = ["buckets_of"]


@functools.lru_cache(maxsize=64)
def _interior_arrays(buckets: Buckets) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The interior edges as float64 (for float values) and as their ceilings in int64 (for integers)."""
    interior = buckets.interior
    floats = np.array(interior, dtype=np.float64)
    ints = np.array([math.ceil(e) for e in interior], dtype=np.int64)
    return floats, ints


def buckets_of(buckets: Buckets, values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The buckets of many counter values (integer or float array); the same answers as
    ``buckets.bucket_of`` gives each.

    Raises:
        InputError: if any value is negative, NaN or infinite, or the array is not numeric.
    """
    interior_float, interior_int = _interior_arrays(buckets)
    a = np.asarray(values)
    kind = a.dtype.kind
    if kind in "iu":
        if kind == "i":
            if a.size and int(a.min()) < 0:
                raise InputError("a counter value is a finite non-negative number; got a negative value")
            ints = a.astype(np.int64, copy=False)
        else:
            # Values above every edge all land in the last bucket; capping keeps int64 exact.
            ints = np.minimum(a, np.uint64(MAX_EDGE)).astype(np.int64)
        return np.searchsorted(interior_int, ints, side="right").astype(np.int64, copy=False)
    if kind == "f":
        floats = a.astype(np.float64, copy=False)
        if not bool(np.isfinite(floats).all()):
            raise InputError("a counter value is a finite non-negative number; got NaN or an infinity")
        if floats.size and float(floats.min()) < 0:
            raise InputError("a counter value is a finite non-negative number; got a negative value")
        return np.searchsorted(interior_float, floats, side="right").astype(np.int64, copy=False)
    raise InputError(f"counter values must be an integer or float array; got dtype {a.dtype}")
