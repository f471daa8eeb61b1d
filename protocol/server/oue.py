"""Optimized unary encoding, the server half: decode, count, estimate, plan, privatize in bulk.

See :mod:`protocol.oue` for the randomizer, its coins and its privacy. ``C_v`` is the number of
reports with bit ``v`` set; the estimate is the support estimator of
:mod:`protocol.server.support` with ``p* = 1/2`` and ``q* = q``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt

from protocol.checks import check_packed_bits
from protocol.errors import MalformedReportError
from protocol.oue import OptimizedUnaryEncoding
from protocol.randomness import PushbackSource, RandomSource, byte_coin_overflow, byte_coin_rows
from protocol.server.contract import PlanFigures
from protocol.server.support import SupportAggregate, SupportServer

__all__ = ["OUEAggregate", "OUEBatch", "OUEServer", "count_set_bits", "decode_packed"]

_CHUNK_CELLS: Final = 1 << 22
"""Unpacked bits handled per step when counting a batch, so the temporaries stay a few MiB."""


def decode_packed(raw: object, width: int) -> npt.NDArray[np.uint8]:
    """A list of packed ``width``-bit vectors, strictly, as an ``(n, ceil(width / 8))`` array."""
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", "expected a list of packed bit vectors")
    for i, bits in enumerate(raw):
        check_packed_bits(bits, width=width, field=f"records[{i}]")
    nbytes = (width + 7) // 8
    return np.frombuffer(b"".join(raw), dtype=np.uint8).reshape(len(raw), nbytes).copy()


def count_set_bits(packed: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.int64]:
    """How many rows of ``packed`` set each of the ``width`` bits."""
    counts = np.zeros(width, dtype=np.int64)
    step = max(1, _CHUNK_CELLS // max(width, 1))
    for start in range(0, packed.shape[0], step):
        bits = np.unpackbits(packed[start : start + step], axis=1, count=width)
        counts += bits.sum(axis=0, dtype=np.int64)
    return counts


@dataclass(frozen=True, eq=False)
class OUEBatch:
    """Packed vectors, one row per record (``uint8``, ``n x ceil(k / 8)``)."""

    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.shape[0])


class OUEAggregate(SupportAggregate):
    """Reports with each bit set (``C_v``) and ``n``."""

    def add(self, batch: OUEBatch) -> None:
        """Count the set bits."""
        self.add_counts(count_set_bits(batch.bits, self.counts.size), len(batch))


class OUEServer(SupportServer[OptimizedUnaryEncoding, OUEBatch, OUEAggregate]):
    """Optimized unary encoding's server half."""

    batch_type: ClassVar[type[OUEBatch]] = OUEBatch
    aggregate_type: ClassVar[type[OUEAggregate]] = OUEAggregate

    def decode_records(self, raw: object) -> OUEBatch:
        """A list of packed ``k``-bit vectors, strictly."""
        return OUEBatch(decode_packed(raw, self.mechanism.k))

    def batch(self, records: Sequence[bytes]) -> OUEBatch:
        """Typed records in columnar form."""
        width = self.mechanism.record_bytes
        return OUEBatch(np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), width).copy())

    def encode_batch(self, batch: OUEBatch) -> list[object]:
        """The batch's records in wire form."""
        return [row.tobytes() for row in batch.bits]

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> OUEBatch:
        """Privatize many values with the device's coins in the device's layout (:mod:`protocol.oue`),
        a few MiB of coins at a time.

        Each report's words are drawn in one block for all of them; a report with more ties than
        spare words (about one in 1,700 at 843 categories) is privatized by the device's own code
        reading the stream, the words drawn for the reports after it given back first
        (:class:`protocol.randomness.PushbackSource`), so the records are the device's, report for report.
        """
        mech = self.mechanism
        n, dw = len(values), mech.draw_words
        own = np.fromiter((mech.index_of(v) for v in values), dtype=np.int64, count=n)
        out = np.empty((n, mech.record_bytes), dtype=np.uint8)
        stream = PushbackSource(rng)
        step = max(1, _CHUNK_CELLS // (8 * dw))
        start = 0
        while start < n:
            rows = min(n - start, step)
            words = stream.words(rows * dw).reshape(rows, dw)
            coin_bytes = np.ascontiguousarray(words[:, : mech.coin_words]).view(np.uint8)[:, : mech.k]
            over = byte_coin_overflow(mech.other_coin, coin_bytes, dw - mech.coin_words - 1)
            done = rows if over is None else over
            out[start : start + done] = self._vectors(own[start : start + done], words[:done], coin_bytes[:done])
            if over is not None:
                stream.unread(words[over:].ravel())
                record, _ = mech.privatize(values[start + over], None, stream)
                out[start + over] = np.frombuffer(record, dtype=np.uint8)
                done += 1
            start += done
        return OUEBatch(out)

    def _vectors(
        self, own: npt.NDArray[np.int64], words: npt.NDArray[np.uint64], coin_bytes: npt.NDArray[np.uint8]
    ) -> npt.NDArray[np.uint8]:
        """Rows whose ties all fit their spare words: the coins, then the own category's fair bit."""
        mech = self.mechanism
        cw = mech.coin_words
        heads = byte_coin_rows(mech.other_coin, coin_bytes, words[:, cw + 1 :])
        heads[np.arange(own.size), own] = (words[:, cw] >> np.uint64(63)) == 1
        packed: npt.NDArray[np.uint8] = np.packbits(heads, axis=1)
        return packed

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds: ``sqrt(n q (1 - q)) / (1/2 - q)``."""
        return self.support_plan(
            n,
            bandwidth_bits=float(self.mechanism.k),
            formula="Wang et al. 2017 §4.3: Var = n q(1-q)/(1/2-q)^2 = n 4e^eps/(e^eps-1)^2, q = 1/(e^eps+1)",
        )
