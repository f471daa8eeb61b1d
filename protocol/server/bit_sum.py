"""The aggregate of one-bit mechanisms: a count of ones and of reports.

Binary randomized response and 1BitMean both send one bit per report, so their server
state is the same pair of exact integers; only the estimator that inverts the randomizer
differs, and each mechanism module subclasses :class:`BitSumAggregate` to add it.
"""

from __future__ import annotations

from typing import Generic, Protocol, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.errors import StateError
from protocol.plain import PlainDoc
from protocol.server.plain import require

__all__ = ["BitBatch", "BitSumAggregate"]


class BitBatch(Protocol):
    """A columnar batch of single-bit records."""

    @property
    def bits(self) -> npt.NDArray[np.uint8]:
        """The bits, 0 or 1."""
        ...

    def __len__(self) -> int: ...


MechanismT = TypeVar("MechanismT")


class BitSumAggregate(Generic[MechanismT]):
    """Σb and n for one period (exact integers); merges by addition.

    Subclasses set ``label`` (used in error messages) and add ``estimate``.
    """

    label = "bit-sum aggregate"

    def __init__(self, mechanism: MechanismT, *, ones: int = 0, n: int = 0) -> None:
        self.mechanism = mechanism
        self.ones = ones
        self._n = n

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return self._n

    def add(self, batch: BitBatch) -> None:
        """Fold a batch of bits."""
        self.ones += int(np.count_nonzero(batch.bits))
        self._n += len(batch)

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(self.mechanism, ones=self.ones + other.ones, n=self._n + other._n)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"ones": self.ones, "n": self._n}

    @classmethod
    def from_plain(cls, mechanism: MechanismT, data: object) -> Self:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: if ``data`` is malformed.
        """
        ones = require(data, "ones", int, where=cls.label)
        n = require(data, "n", int, where=cls.label)
        if not 0 <= ones <= n:
            raise StateError(f"{cls.label}: need 0 <= ones <= n; got ones={ones}, n={n}")
        return cls(mechanism, ones=ones, n=n)
