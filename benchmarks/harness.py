"""Small helpers shared by the benchmarks: timing, workloads and JSON output.

Besides the timing primitives, this holds the measurement steps the sketch benchmarks
(CMS, HCMS, SFP) all take the same way: client privatize (single calls and the batch
path), wire decoding and aggregation into a cold and then a warm table. Each benchmark
keeps only what is particular to its mechanism (queries, transforms, reconstruction).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.randomness import RandomSource

__all__ = [
    "OUT",
    "AddSpeed",
    "ClientSpeed",
    "emit",
    "progress",
    "rate",
    "seconds",
    "time_add",
    "time_decode",
    "time_privatize",
    "zipf_ranks",
    "zipf_sites",
]

OUT = Path(__file__).resolve().parent / "out"
"""Where the benchmarks write their plots (git-ignored); :mod:`fleet.plots` draws them."""

RecordT = TypeVar("RecordT")
BatchT = TypeVar("BatchT")
BatchT_co = TypeVar("BatchT_co", covariant=True)
BatchT_contra = TypeVar("BatchT_contra", contravariant=True)


def seconds(fn: Callable[[], object], *, repeat: int = 1) -> float:
    """Best wall-clock time of ``repeat`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def rate(count: int, elapsed: float) -> float:
    """Items per second, rounded for reading."""
    return round(count / elapsed, 1) if elapsed > 0 else float("inf")


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries only JSON)."""
    print(message, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    """Print one JSON document on stdout."""
    print(json.dumps(result, indent=2, sort_keys=True))


def zipf_ranks(n: int, universe: int, gen: np.random.Generator) -> npt.NDArray[np.int64]:
    """``n`` ranks in ``[0, universe)`` drawn with weight ``rank**-1.2`` (1-based).

    A heavy head and a long tail, the shape of the emoji, web-domain and new-word
    populations of 003 §6. Draws from ``gen`` first, so a caller that goes on drawing
    from the same generator sees the same stream as before.
    """
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -1.2
    ranks: npt.NDArray[np.int64] = gen.choice(universe, size=n, p=weights / weights.sum())
    return ranks


def zipf_sites(n: int, universe: int, gen: np.random.Generator) -> list[str]:
    """``n`` domain names ``site-{rank}.example`` with Zipf ranks (:func:`zipf_ranks`)."""
    names = [f"site-{i}.example" for i in range(universe)]
    return [names[r] for r in zipf_ranks(n, universe, gen)]


class _Device(Protocol[RecordT]):
    """The device half of a string-valued, stateless mechanism (CMS, HCMS, SFP): its
    single-record path and the records' wire form."""

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[RecordT, None]:
        """One privatized record."""
        ...

    def encode_records(self, records: Sequence[RecordT]) -> list[Any]:
        """Records in wire form."""
        ...


class _Simulator(Protocol[BatchT_co]):
    """The server half's vectorised privatizer (the simulator's batch path)."""

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> BatchT_co:
        """The vectorised batch path."""
        ...


class _Decoder(Protocol):
    """The server half's wire decoder."""

    def decode_records(self, raw: object) -> object:
        """Wire form back to a batch, strictly."""
        ...


class _Adder(Protocol[BatchT_contra]):
    """A server aggregate, as far as timing its ``add`` goes."""

    def add(self, batch: BatchT_contra) -> None:
        """Fold a batch in place."""
        ...


@dataclass(frozen=True, kw_only=True)
class ClientSpeed(Generic[BatchT]):
    """Times of the client path (:func:`time_privatize`) and the batch it produced.

    Attributes:
        singles: how many single ``privatize`` calls were timed.
        n: how many values the batch path privatized.
        single_s: best wall-clock time of the single calls.
        single_cpu_s: process CPU time of one more pass of single calls, or ``None`` when
            not measured.
        batch_s: wall-clock time of ``privatize_many`` over all ``n`` values.
        batch: what ``privatize_many`` returned, for timing aggregation on real records.
    """

    singles: int
    n: int
    single_s: float
    single_cpu_s: float | None
    batch_s: float
    batch: BatchT

    def row(self) -> dict[str, float]:
        """The client result keys.

        ``privatize_per_s``, ``privatize_batch_per_s`` and, when measured,
        ``privatize_cpu_per_s``.
        """
        out = {
            "privatize_per_s": rate(self.singles, self.single_s),
            "privatize_batch_per_s": rate(self.n, self.batch_s),
        }
        if self.single_cpu_s is not None:
            out["privatize_cpu_per_s"] = rate(self.singles, self.single_cpu_s)
        return out


def time_privatize(
    mech: _Device[Any],
    server: _Simulator[BatchT],
    values: Sequence[str],
    rng: RandomSource,
    *,
    singles: int,
    warm_up: str,
    cpu: bool,
) -> ClientSpeed[BatchT]:
    """Time single ``privatize`` calls on the first ``singles`` values, then the batch path.

    Args:
        mech: the mechanism (its device half).
        server: its server half (``privatize_many``).
        values: the workload; the batch path privatizes all of it.
        rng: the coin source (the OS CSPRNG, as on a device).
        singles: at most this many single calls (they are slow; the batch path is not).
        warm_up: a value privatized once, untimed, so lazy set-up is not charged to
            the first timed call.
        cpu: also measure the process CPU time of one pass of single calls (it tells
            a busy machine's wall-clock time apart from the work itself).
    """
    count = min(len(values), singles)
    head = values[:count]
    mech.privatize(warm_up, None, rng)
    single_s = seconds(lambda: [mech.privatize(v, None, rng) for v in head], repeat=2)
    single_cpu_s: float | None = None
    if cpu:
        cpu0 = time.process_time()
        for v in head:
            mech.privatize(v, None, rng)
        single_cpu_s = time.process_time() - cpu0
    holder: list[BatchT] = []
    batch_s = seconds(lambda: holder.append(server.privatize_many(values, rng)))
    return ClientSpeed(
        singles=count, n=len(values), single_s=single_s, single_cpu_s=single_cpu_s, batch_s=batch_s, batch=holder[0]
    )


def time_decode(mech: _Device[RecordT], server: _Decoder, values: Sequence[str], rng: RandomSource) -> dict[str, float]:
    """``decode_per_s``: the wire decoder's speed on the records of ``values``.

    The records come from the single-call path and go through ``encode_records``, so
    the decoder sees exactly what devices send.
    """
    records = [mech.privatize(v, None, rng)[0] for v in values]
    wire = mech.encode_records(records)
    return {"decode_per_s": rate(len(wire), seconds(lambda: server.decode_records(wire), repeat=2))}


@dataclass(frozen=True, kw_only=True)
class AddSpeed:
    """Times of two ``add`` calls of the same batch (:func:`time_add`).

    Attributes:
        n: records in the batch.
        cold_s: the first add, which also faults in the table's pages.
        warm_s: the second, as in a running collector whose table is already mapped.
    """

    n: int
    cold_s: float
    warm_s: float

    def row(self) -> dict[str, float]:
        """The result keys ``aggregate_per_s`` and ``aggregate_cold_per_s``."""
        return {"aggregate_per_s": rate(self.n, self.warm_s), "aggregate_cold_per_s": rate(self.n, self.cold_s)}


def time_add(agg: _Adder[BatchT], batch: BatchT, n: int) -> AddSpeed:
    """Add ``batch`` (of ``n`` records) to ``agg`` twice, timing each; ``agg`` keeps both."""
    cold_s = seconds(lambda: agg.add(batch))
    warm_s = seconds(lambda: agg.add(batch))
    return AddSpeed(n=n, cold_s=cold_s, warm_s=warm_s)
