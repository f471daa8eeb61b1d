"""The Sylvester-ordered Hadamard matrix of 003 eq. (3) and the row-wise transform of 003 Alg. 7
step 6, in float64 with numpy (the HCMS server half's expensive step; :mod:`protocol.server.hcms`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from protocol.server.parallel import Threads, run_parts

__all__ = ["hadamard_rows", "sylvester"]

_INNER_BITS = 10
"""The lowest ``2**10`` coordinates of each row are transformed by two small matrix products."""
_BLOCK_ELEMENTS = 1 << 16
"""Rows are transformed in blocks of about 512 KiB, so every butterfly stage runs in cache."""
_THREADED_ELEMENTS = 1 << 20
"""Smaller tables are transformed in the calling thread: handing out the parts would cost more."""


def sylvester(m: int) -> npt.NDArray[np.float64]:
    """The ``m x m`` Sylvester-ordered Hadamard matrix of 003 eq. (3).

    ``H[a, b] = (-1)**popcount(a AND b)``, which is the recursion
    ``H_2m = [[H_m, H_m], [H_m, -H_m]]`` unrolled. Symmetric, and ``H H = m I``.
    """
    if m < 1 or m & (m - 1):
        raise ValueError(f"a Sylvester matrix needs a power of two; got {m}")
    i = np.arange(m, dtype=np.uint64)
    odd = np.bitwise_count(i[:, None] & i[None, :]) & np.uint8(1)
    return np.where(odd.astype(bool), -1.0, 1.0)


def _transform_block(
    block: npt.NDArray[np.float64],
    buf: npt.NDArray[np.float64],
    h_last: npt.NDArray[np.float64],
    h_mid: npt.NDArray[np.float64] | None,
) -> None:
    """``block <- block @ H_m`` for each row of ``block``, in place (``buf`` is scratch).

    ``H_m`` is a Kronecker product of smaller Sylvester matrices (``H_m[ℓ, c]`` factors over
    the bits of ``ℓ`` and ``c``), so the low bits are done as two small matrix products over
    reshaped views and the remaining bits as radix-2 butterflies on contiguous halves.
    """
    r, m = block.shape
    a_last = h_last.shape[0]
    if h_mid is None:
        x2 = block.reshape(-1, a_last)
        y2 = buf[: block.size].reshape(x2.shape)
        np.matmul(x2, h_last, out=y2)
        np.copyto(x2, y2)
        h = a_last
    else:
        a_mid = h_mid.shape[0]
        x3 = block.reshape(-1, a_mid, a_last)
        y3 = buf[: block.size].reshape(x3.shape)
        np.matmul(x3, h_last, out=y3)
        np.matmul(h_mid, y3, out=x3)
        h = a_mid * a_last
    while h < m:
        v = block.reshape(r, m // (2 * h), 2, h)
        lo = v[:, :, 0, :]
        hi = v[:, :, 1, :]
        t = buf[: lo.size].reshape(lo.shape)
        np.subtract(lo, hi, out=t)
        np.add(lo, hi, out=lo)
        np.copyto(hi, t)
        h *= 2


def hadamard_rows(
    table: npt.NDArray[np.integer[Any]] | npt.NDArray[np.floating[Any]],
    *,
    threads: Threads | None = None,
) -> tuple[npt.NDArray[np.float64], float]:
    """Every row of ``table`` times ``H_m`` (003 Alg. 7 step 6), in float64.

    Args:
        table: a ``k x m`` array, ``m`` a power of two.
        threads: the caller's threads, the rows split between them (numpy releases the GIL);
            None, or a table too small to be worth it: this thread alone.

    Returns:
        ``(table @ H_m, Σ table**2)``; the sum of squares is taken on the way because the
        second-moment estimate needs it and the rows are in cache at that point.
    """
    k, m = table.shape
    if m < 1 or m & (m - 1):
        raise ValueError(f"row length must be a power of two; got {m}")
    out = np.empty((k, m), dtype=np.float64)
    if k == 0:
        return out, 0.0
    bits = m.bit_length() - 1
    inner = min(bits, _INNER_BITS)
    h_last = sylvester(1 << ((inner + 1) // 2))
    h_mid = sylvester(1 << (inner // 2)) if inner >= 2 else None
    rows_per_block = max(1, _BLOCK_ELEMENTS // m)

    def work(rows: range) -> float:
        buf = np.empty(rows_per_block * m, dtype=np.float64)
        total = 0.0
        for r0 in range(rows.start, rows.stop, rows_per_block):
            r1 = min(r0 + rows_per_block, rows.stop)
            block = out[r0:r1]
            np.copyto(block, table[r0:r1])
            flat = block.reshape(-1)
            # einsum, not np.dot/np.vecdot: those call BLAS ddot, which OpenBLAS spreads over
            # threads that spin against the transform's own workers on a busy machine.
            total += float(np.einsum("i,i->", flat, flat))
            _transform_block(block, buf, h_last, h_mid)
        return total

    return out, sum(run_parts(threads if k * m >= _THREADED_ELEMENTS else None, work, k))
