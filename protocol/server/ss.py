"""Subset selection, the server half: decode, count, estimate, plan, privatize in bulk.

See :mod:`protocol.ss` for the randomizer, its coins, its privacy and its two wire forms.
``C_v`` is the number of reports whose subset contains ``v``; the estimate is the support
estimator of :mod:`protocol.server.support` with ``p* = α``, ``q* = β``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt

from protocol.errors import MalformedReportError
from protocol.randomness import RandomSource, uniform_from_words
from protocol.server.contract import PlanFigures
from protocol.server.oue import decode_packed
from protocol.server.support import SupportAggregate, SupportServer
from protocol.ss import SubsetSelection

__all__ = ["SSAggregate", "SSBatch", "SSServer"]

_CHUNK_CELLS: Final = 1 << 25
"""Membership cells (reports x categories) handled per step of the bulk privatizer (32 MiB of
booleans: Floyd's d steps run once per chunk, so fewer, larger chunks cost fewer numpy calls)."""


@dataclass(frozen=True, eq=False)
class SSBatch:
    """Each record's members in increasing order (``int64``, ``n x d``)."""

    members: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.members.shape[0])


class SSAggregate(SupportAggregate):
    """Reports whose subset contains each category (``C_v``) and ``n``."""

    @classmethod
    def records_per_report(cls, mechanism: SubsetSelection) -> int:
        """Every report names ``d`` categories."""
        return mechanism.d

    def add(self, batch: SSBatch) -> None:
        """Count each record's members."""
        self.add_indices(batch.members, len(batch))


def _decode_indices(raw: object, *, k: int, d: int) -> npt.NDArray[np.int64]:
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", "expected a list of subsets")
    for i, rec in enumerate(raw):
        if not isinstance(rec, list):
            raise MalformedReportError("bad-type", f"records[{i}]", f"expected a list of {d} category indices")
        if len(rec) != d:
            raise MalformedReportError("bad-length", f"records[{i}]", f"expected {d} indices, got {len(rec)}")
        last = -1
        for j, c in enumerate(rec):
            if type(c) is not int:
                raise MalformedReportError("bad-type", f"records[{i}][{j}]", "expected an integer category index")
            if not last < c < k:
                raise MalformedReportError(
                    "out-of-range", f"records[{i}][{j}]", f"increasing category indices in [0, {k})"
                )
            last = c
    return np.array(raw, dtype=np.int64).reshape(len(raw), d)


def _decode_bits(raw: object, *, k: int, d: int) -> npt.NDArray[np.int64]:
    packed = decode_packed(raw, k)
    bits = np.unpackbits(packed, axis=1, count=k)
    sizes = bits.sum(axis=1, dtype=np.int64)
    wrong = np.flatnonzero(sizes != d)
    if wrong.size:
        i = int(wrong[0])
        raise MalformedReportError("bad-length", f"records[{i}]", f"expected {d} members, got {int(sizes[i])}")
    return np.nonzero(bits)[1].astype(np.int64).reshape(len(packed), d)


class SSServer(SupportServer[SubsetSelection, SSBatch, SSAggregate]):
    """Subset selection's server half."""

    batch_type: ClassVar[type[SSBatch]] = SSBatch
    aggregate_type: ClassVar[type[SSAggregate]] = SSAggregate

    def decode_records(self, raw: object) -> SSBatch:
        """A list of subsets in the mechanism's wire form, strictly: ``d`` distinct members in ``[0, k)``."""
        mech = self.mechanism
        decode = _decode_indices if mech.wire_form == "indices" else _decode_bits
        return SSBatch(decode(raw, k=mech.k, d=mech.d))

    def batch(self, records: Sequence[tuple[int, ...]]) -> SSBatch:
        """Typed records in columnar form."""
        return SSBatch(np.array(records, dtype=np.int64).reshape(len(records), self.mechanism.d))

    def encode_batch(self, batch: SSBatch) -> list[object]:
        """The batch's records in wire form."""
        return self.mechanism.encode_records([tuple(row) for row in batch.members.tolist()])

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> SSBatch:
        """Privatize many values, each report's words in the device's layout (:mod:`protocol.ss`)."""
        mech = self.mechanism
        n, k, d = len(values), mech.k, mech.d
        own = np.fromiter((mech.index_of(v) for v in values), dtype=np.int64, count=n)
        members = np.empty((n, d), dtype=np.int64)
        step = max(1, _CHUNK_CELLS // k)
        for start in range(0, n, step):
            stop = min(n, start + step)
            words = rng.words((stop - start) * mech.draw_words).reshape(stop - start, mech.draw_words)
            members[start:stop] = self._subsets(rng, own[start:stop], words)
        return SSBatch(members)

    def _subsets(
        self, rng: RandomSource, own: npt.NDArray[np.int64], words: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.int64]:
        """Floyd's algorithm row-parallel: the included rows draw ``d - 1`` others, the rest ``d``."""
        mech = self.mechanism
        rows, k, d = own.size, mech.k, mech.d
        included = words[:, 0] < np.uint64(mech.include_coin.numerator)
        taken = np.zeros((rows, k - 1), dtype=np.bool_)
        for group, size in ((np.flatnonzero(included), d - 1), (np.flatnonzero(~included), d)):
            if group.size == 0:
                continue
            for i, j in enumerate(range(k - 1 - size, k - 1)):
                t = uniform_from_words(rng, words[group, 1 + i], j + 1)
                pick = np.where(taken[group, t], j, t)
                taken[group, pick] = True
        taken_rows, others = np.nonzero(taken)
        full = np.zeros((rows, k), dtype=np.bool_)
        full[taken_rows, others + (others >= own[taken_rows])] = True
        full[np.flatnonzero(included), own[included]] = True
        return np.nonzero(full)[1].astype(np.int64).reshape(rows, d)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds: ``sqrt(n β (1 - β)) / (α - β)``."""
        mech = self.mechanism
        return self.support_plan(
            n,
            bandwidth_bits=float(8 * (mech.max_record_bytes - 1)),
            formula=(
                "Ye-Barg 2018: Var = n b(1-b)/(a-b)^2, a = d e^eps/(d e^eps+k-d), "
                "b = a(d-1)/(k-1) + (1-a)d/(k-1), d ~ k/(e^eps+1)"
            ),
            more={"d": float(mech.d)},
        )
