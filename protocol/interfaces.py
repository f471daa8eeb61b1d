"""The shape every mechanism module shares, as ``typing.Protocol`` classes.

A mechanism is a frozen, validated parameter object (the "mechanism") with:

* ``epsilon_report`` - the ε of one report (the privacy cost the accountant charges);
* ``setup(rng)`` - the per-device permanent state (plain data, see ``to_plain``);
* ``privatize(value, state, rng)`` - one privatized record and the (possibly grown) state;
* ``batch(records)`` - records in columnar numpy form;
* ``new_aggregate()`` - an empty, mergeable aggregate.

An aggregate folds columnar batches with ``add`` (vectorised), combines with ``merge``
(exact: aggregates are sums), saves with ``to_plain`` / ``from_plain`` and produces an
estimate with its standard error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Self, TypeVar

from protocol.randomness import RandomSource

__all__ = ["Aggregate", "Mechanism"]

ValueT_contra = TypeVar("ValueT_contra", contravariant=True)
StateT = TypeVar("StateT")
RecordT = TypeVar("RecordT")
BatchT_co = TypeVar("BatchT_co", covariant=True)
BatchT_contra = TypeVar("BatchT_contra", contravariant=True)
AggT_co = TypeVar("AggT_co", covariant=True)


class Aggregate(Protocol[BatchT_contra]):
    """A mergeable server-side aggregate of one mechanism's records."""

    @property
    def n(self) -> int:
        """Number of records folded in."""
        ...

    def add(self, batch: BatchT_contra) -> None:
        """Fold a columnar batch of records in place."""
        ...

    def merge(self, other: Self) -> Self:
        """A new aggregate equal to folding both inputs' records."""
        ...

    def to_plain(self) -> dict[str, Any]:
        """Plain, msgpack-ready data."""
        ...


class Mechanism(Protocol[ValueT_contra, StateT, RecordT, BatchT_co, AggT_co]):
    """Frozen parameters plus both halves of a local randomizer."""

    @property
    def epsilon_report(self) -> float:
        """ε of a single report."""
        ...

    def setup(self, rng: RandomSource) -> StateT:
        """Draw the per-device permanent state."""
        ...

    def privatize(self, value: ValueT_contra, state: StateT, rng: RandomSource) -> tuple[RecordT, StateT]:
        """Privatize ``value``; returns the record and the state to persist before sending."""
        ...

    def batch(self, records: Sequence[RecordT]) -> BatchT_co:
        """Records in the columnar form ``add`` takes."""
        ...

    def new_aggregate(self) -> AggT_co:
        """An empty aggregate for this mechanism's records."""
        ...
