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

This module is what a device needs, in pure Python: one value's fingerprint and one
function of the family at a time. The server evaluates one function for a whole dictionary
at a time with a handful of numpy passes (:mod:`protocol.server.hashing`), which is what
makes dictionary queries over hundreds of thousands of candidates and tens of thousands of
functions feasible; both compute the same numbers (a test compares them).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import cached_property

from protocol.errors import ParameterError

__all__ = ["HashFamily", "as_bytes", "derive_seed", "fingerprint", "fingerprint_key"]

_MASK64 = (1 << 64) - 1


def derive_seed(seed: bytes, label: str) -> bytes:
    """A seed for a sub-family (``label`` names its role), independent of the parent's."""
    return hashlib.blake2b(seed, digest_size=32, person=b"ldp-derive", salt=label.encode()[:16]).digest()


def fingerprint_key(seed: bytes) -> bytes:
    """The BLAKE2b key fingerprints under ``seed`` are computed with."""
    return hashlib.blake2b(seed, digest_size=32, person=b"ldp-fingerprint").digest()


def as_bytes(value: str | bytes) -> bytes:
    """A hashable value as bytes (``str`` as UTF-8); ``TypeError`` for anything else."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"hashable values are str or bytes; got {type(value).__name__}")


def fingerprint(value: str | bytes, *, seed: bytes) -> int:
    """The 64-bit fingerprint of one value under ``seed``."""
    digest = hashlib.blake2b(as_bytes(value), digest_size=8, key=fingerprint_key(seed)).digest()
    return int.from_bytes(digest, "little")


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
    def coefficient_bytes(self) -> bytes:
        """``a_j, b_j, c_j`` of every function, as ``3 * count`` little-endian 64-bit words."""
        return hashlib.shake_256(b"ldp-telemetry/hash-family/v1\x00" + self.seed).digest(24 * self.count)

    def coefficients(self, index: int) -> tuple[int, int, int]:
        """``(a, b, c)`` of ``h_index``: one row read from :attr:`coefficient_bytes`, so a device
        that hashes with a few of a large family's functions never expands the rest."""
        if not 0 <= index < self.count:
            raise IndexError(f"hash index out of range [0, {self.count})")
        a, b, c = struct.unpack_from("<3Q", self.coefficient_bytes, 24 * index)
        return a, b, c

    @cached_property
    def power_of_two_shift(self) -> int | None:
        """``64 - log2(range)`` when the range is a power of two (the top bits are kept), else None."""
        if self.range & (self.range - 1):
            return None
        return 64 - (self.range.bit_length() - 1)

    def evaluate_fingerprint(self, fp: int, index: int) -> int:
        """``h_index`` of one 64-bit fingerprint (a device hashes one value at a time; the
        vectorised form over many is :func:`protocol.server.hashing.evaluate`)."""
        a, b, c = self.coefficients(index)
        mixed = (a * (fp & 0xFFFFFFFF) + b * (fp >> 32) + c) & _MASK64
        shift = self.power_of_two_shift
        if shift is not None:
            return 0 if shift == 64 else mixed >> shift
        return ((mixed >> 32) * self.range) >> 32

    def evaluate_value(self, value: str | bytes, index: int) -> int:
        """``h_index(value)`` for a single value (what a client computes)."""
        return self.evaluate_fingerprint(fingerprint(value, seed=self.seed), index)
