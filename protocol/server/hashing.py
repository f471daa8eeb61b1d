"""The hash families of :mod:`protocol.hashing`, vectorised over many values (the server's path).

A dictionary query evaluates one function for hundreds of thousands of candidates at a time;
done value by value in Python that is the whole cost of a query, so here the fingerprints
are held as two arrays of 32-bit halves and every function is a handful of numpy passes,
bit-identical to :meth:`protocol.hashing.HashFamily.evaluate_fingerprint` (a test compares
them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from protocol.cms import as_value_bytes
from protocol.hashing import HashFamily, as_bytes, fingerprint_key

__all__ = ["Fingerprints", "evaluate", "evaluate_row", "family_fingerprints", "fingerprints", "value_fingerprints"]

_U32 = np.uint64(32)
_MASK32 = np.uint64(0xFFFFFFFF)


@dataclass(frozen=True)
class Fingerprints:
    """Fingerprints of many values, split into the 32-bit halves the hash functions use."""

    lo: npt.NDArray[np.uint64]
    hi: npt.NDArray[np.uint64]

    def __len__(self) -> int:
        return int(self.lo.size)

    def take(self, rows: npt.NDArray[np.integer]) -> Fingerprints:
        """The fingerprints at ``rows`` (repeats allowed)."""
        return Fingerprints(lo=self.lo[rows], hi=self.hi[rows])


def fingerprints(values: Iterable[str | bytes], *, seed: bytes) -> Fingerprints:
    """Fingerprints of ``values`` under ``seed``, ready for vectorised evaluation."""
    key = fingerprint_key(seed)
    raw = b"".join(hashlib.blake2b(as_bytes(v), digest_size=8, key=key).digest() for v in values)
    x = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
    return Fingerprints(lo=x & _MASK32, hi=x >> _U32)


def family_fingerprints(family: HashFamily, values: Iterable[str | bytes]) -> Fingerprints:
    """Fingerprints of ``values`` under ``family``'s seed."""
    return fingerprints(values, seed=family.seed)


def value_fingerprints(family: HashFamily, values: Sequence[object]) -> Fingerprints:
    """Fingerprints of ``values`` under ``family``, one per value in order, each as the bytes
    :func:`protocol.cms.as_value_bytes` makes of it; a repeated value is fingerprinted once.

    Raises:
        InputError: a value is neither ``str`` nor ``bytes``.
    """
    position: dict[bytes, int] = {}
    codes = np.fromiter(
        (position.setdefault(as_value_bytes(v), len(position)) for v in values), dtype=np.int64, count=len(values)
    )
    return family_fingerprints(family, list(position)).take(codes)


@lru_cache(maxsize=256)
def _coefficients(family: HashFamily) -> npt.NDArray[np.uint64]:
    # Families are few (one or two per use case) and their tables small (24 bytes a function).
    return np.frombuffer(family.coefficient_bytes, dtype="<u8").astype(np.uint64).reshape(family.count, 3)


def _reduce(family: HashFamily, mixed: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    shift = family.power_of_two_shift
    if shift is not None:
        if shift == 64:  # range 1
            return np.zeros_like(mixed)
        return mixed >> np.uint64(shift)
    return ((mixed >> _U32) * np.uint64(family.range)) >> _U32


def evaluate(family: HashFamily, fp: Fingerprints, index: npt.NDArray[np.integer] | int) -> npt.NDArray[np.int64]:
    """``h_index[i](fp[i])`` elementwise (``index`` broadcasts against ``fp``)."""
    idx = np.asarray(index, dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= family.count):
        raise IndexError(f"hash index out of range [0, {family.count})")
    coef = _coefficients(family)
    mixed = coef[idx, 0] * fp.lo + coef[idx, 1] * fp.hi + coef[idx, 2]
    return _reduce(family, mixed).astype(np.int64)


def evaluate_row(
    family: HashFamily,
    fp: Fingerprints,
    index: int,
    *,
    out: npt.NDArray[np.uint64],
    scratch: npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint64]:
    """``h_index`` of every fingerprint, written into ``out`` without allocating.

    The server's inner loop: ``out`` and ``scratch`` are preallocated ``uint64`` arrays
    of ``len(fp)`` entries. Returns ``out`` (values in ``[0, range)``).
    """
    a, b, c = _coefficients(family)[index]
    np.multiply(fp.lo, a, out=out)
    np.multiply(fp.hi, b, out=scratch)
    np.add(out, scratch, out=out)
    np.add(out, c, out=out)
    shift = family.power_of_two_shift
    if shift is not None:
        if shift == 64:
            out[...] = 0
        else:
            np.right_shift(out, np.uint64(shift), out=out)
    else:
        np.right_shift(out, _U32, out=out)
        np.multiply(out, np.uint64(family.range), out=out)
        np.right_shift(out, _U32, out=out)
    return out
