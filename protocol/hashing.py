"""Hash families shared by client and server, described by a public seed.

Client and server must evaluate the same hash functions (the "public coins" of 003
§4.1 and 004 §4). A :class:`HashFamily` is fully described by plain data: a public
per-use-case ``seed``, the number of functions ``count`` and the output ``range``. Nothing
secret is involved: anyone holding the registry can recompute every hash, which is what
the server needs to query dictionaries.

Construction, in two steps:

1. **Fingerprint.** A value (``str`` as UTF-8, or ``bytes``) is mapped to a 64-bit
   fingerprint ``x`` with BLAKE2b keyed by the seed. Two distinct values share a
   fingerprint with probability ``2**-64``; for a 250,000-entry dictionary the chance of
   any shared fingerprint is below ``2**-28``.
2. **Vector multiply-shift.** With ``x = x_hi * 2**32 + x_lo`` and per-function
   coefficients ``a_j, b_j, c_j`` uniform in ``[0, 2**64)`` (expanded from the seed with
   SHAKE-256), ``u_j(x) = ((a_j x_lo + b_j x_hi + c_j) mod 2**64) >> 32``.

**Independence property.** For a uniformly random choice of coefficients, ``u_j`` is
strongly universal (2-independent) from 64-bit fingerprints to 32-bit values: for any two
distinct fingerprints and any two outputs, the pair of hashes takes those outputs with
probability exactly ``2**-64`` (Thorup, "High Speed Hashing for Integers and Strings",
vector multiply-shift with 32-bit characters and 64-bit arithmetic, which needs
``64 >= 32 + 32 - 1``). The output range ``m`` is reached by taking the top ``log2 m`` bits
when ``m`` is a power of two (still 2-independent and exactly uniform) and by
``(u * m) >> 32`` otherwise (each output's probability is within ``2**-32`` of ``1/m``).
Functions with different indices ``j`` use independent coefficients.

The papers ask for three-wise independent families (003 Alg. 1); the mean and variance
computations behind 003 Thm 4.2 and 4.4 only use ``Pr[h(d) = h(d')] = 1/m`` for ``d != d'``,
which 2-independence gives. The collision rate is checked by a test.

The server evaluates one function for a whole dictionary at a time with a handful of
numpy passes (:meth:`HashFamily.evaluate_row`), which is what makes dictionary queries
over hundreds of thousands of candidates and tens of thousands of functions feasible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from protocol.errors import ParameterError

__all__ = ["Fingerprints", "HashFamily", "derive_seed", "fingerprint", "fingerprints"]

_U32 = np.uint64(32)
_MASK32 = np.uint64(0xFFFFFFFF)


def derive_seed(seed: bytes, label: str) -> bytes:
    """A seed for a sub-family (``label`` names its role), independent of the parent's."""
    return hashlib.blake2b(seed, digest_size=32, person=b"ldp-derive", salt=label.encode()[:16]).digest()


def _fingerprint_key(seed: bytes) -> bytes:
    return hashlib.blake2b(seed, digest_size=32, person=b"ldp-fingerprint").digest()


def _as_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"hashable values are str or bytes; got {type(value).__name__}")


def fingerprint(value: str | bytes, *, seed: bytes) -> int:
    """The 64-bit fingerprint of one value under ``seed``."""
    digest = hashlib.blake2b(_as_bytes(value), digest_size=8, key=_fingerprint_key(seed)).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Fingerprints:
    """Fingerprints of many values, split into the 32-bit halves the hash functions use."""

    lo: npt.NDArray[np.uint64]
    hi: npt.NDArray[np.uint64]

    def __len__(self) -> int:
        return int(self.lo.size)


def fingerprints(values: Iterable[str | bytes], *, seed: bytes) -> Fingerprints:
    """Fingerprints of ``values`` under ``seed``, ready for vectorised evaluation."""
    key = _fingerprint_key(seed)
    raw = b"".join(hashlib.blake2b(_as_bytes(v), digest_size=8, key=key).digest() for v in values)
    x = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
    return Fingerprints(lo=x & _MASK32, hi=x >> _U32)


@dataclass(frozen=True)
class HashFamily:
    """``count`` functions ``h_0 .. h_{count-1}`` from values to ``{0, ..., range - 1}``.

    Args:
        seed: the public seed (at least 16 bytes), usually derived from the use case's
            registry entry.
        count: number of functions (``k`` in 003, ``h * cohorts`` for RAPPOR).
        range: size of the output range (``m`` in 003, the Bloom filter size for RAPPOR),
            between 1 and ``2**32``.
    """

    seed: bytes
    count: int
    range: int

    def __post_init__(self) -> None:
        if not isinstance(self.seed, bytes) or len(self.seed) < 16:
            raise ParameterError("seed", "at least 16 bytes", self.seed)
        if self.count < 1:
            raise ParameterError("count", ">= 1", self.count)
        if not 1 <= self.range <= 1 << 32:
            raise ParameterError("range", "in [1, 2**32]", self.range)

    @cached_property
    def _coefficients(self) -> npt.NDArray[np.uint64]:
        stream = hashlib.shake_256(b"ldp-telemetry/hash-family/v1\x00" + self.seed).digest(24 * self.count)
        return np.frombuffer(stream, dtype="<u8").astype(np.uint64).reshape(self.count, 3)

    @cached_property
    def _power_of_two_shift(self) -> np.uint64 | None:
        if self.range & (self.range - 1):
            return None
        return np.uint64(64 - (self.range.bit_length() - 1))

    def fingerprints(self, values: Iterable[str | bytes]) -> Fingerprints:
        """Fingerprints of ``values`` under this family's seed."""
        return fingerprints(values, seed=self.seed)

    def _reduce(self, mixed: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        shift = self._power_of_two_shift
        if shift is not None:
            if shift == 64:  # range 1
                return np.zeros_like(mixed)
            return mixed >> shift
        return ((mixed >> _U32) * np.uint64(self.range)) >> _U32

    def evaluate(self, fp: Fingerprints, index: npt.NDArray[np.integer] | int) -> npt.NDArray[np.int64]:
        """``h_index[i](fp[i])`` elementwise (``index`` broadcasts against ``fp``)."""
        idx = np.asarray(index, dtype=np.int64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.count):
            raise IndexError(f"hash index out of range [0, {self.count})")
        coef = self._coefficients
        mixed = coef[idx, 0] * fp.lo + coef[idx, 1] * fp.hi + coef[idx, 2]
        return self._reduce(mixed).astype(np.int64)

    @cached_property
    def _coefficient_rows(self) -> list[tuple[int, int, int]]:
        return [(int(a), int(b), int(c)) for a, b, c in self._coefficients.tolist()]

    def evaluate_fingerprint(self, fp: int, index: int) -> int:
        """``h_index`` of one 64-bit fingerprint, in pure Python (a client's fast path).

        Same result as :meth:`evaluate`; avoids numpy's per-call overhead, which dominates
        when a device hashes one value.
        """
        if not 0 <= index < self.count:
            raise IndexError(f"hash index out of range [0, {self.count})")
        a, b, c = self._coefficient_rows[index]
        mixed = (a * (fp & 0xFFFFFFFF) + b * (fp >> 32) + c) & 0xFFFFFFFFFFFFFFFF
        shift = self._power_of_two_shift
        if shift is not None:
            return 0 if shift == 64 else mixed >> int(shift)
        return ((mixed >> 32) * self.range) >> 32

    def evaluate_value(self, value: str | bytes, index: int) -> int:
        """``h_index(value)`` for a single value (what a client computes)."""
        return self.evaluate_fingerprint(fingerprint(value, seed=self.seed), index)

    def evaluate_row(
        self,
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
        a, b, c = self._coefficients[index]
        np.multiply(fp.lo, a, out=out)
        np.multiply(fp.hi, b, out=scratch)
        np.add(out, scratch, out=out)
        np.add(out, c, out=out)
        shift = self._power_of_two_shift
        if shift is not None:
            if shift == 64:
                out[...] = 0
            else:
                np.right_shift(out, shift, out=out)
        else:
            np.right_shift(out, _U32, out=out)
            np.multiply(out, np.uint64(self.range), out=out)
            np.right_shift(out, _U32, out=out)
        return out
