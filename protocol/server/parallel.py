"""Threads for one numpy computation, owned by the caller (docs/design.md, convention 1).

``protocol/`` starts no thread. A server half whose work splits into independent parts (the
sketches' dictionary gather, the Hadamard transform of HCMS, the fold of a large CMS batch)
takes :class:`Threads` from its caller - the collector's pool, a benchmark's - and hands the
parts to it; numpy releases the GIL in those passes, so the parts run side by side. Without
threads (``None``) every part runs in the calling thread, one after the other, with the same
result.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Threads", "run_parts", "spans"]

T = TypeVar("T")


@dataclass(frozen=True)
class Threads:
    """A pool the caller owns and how many parts one computation may be cut into.

    Attributes:
        executor: runs the parts (a ``ThreadPoolExecutor`` of at least ``count`` threads).
        count: the most parts a computation is cut into (at least 1).
    """

    executor: Executor
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be a positive integer; got {self.count!r}")


def spans(total: int, parts: int) -> list[range]:
    """``range(total)`` cut into at most ``parts`` contiguous, non-empty, near-equal ranges."""
    parts = max(1, min(parts, total))
    bounds = [total * i // parts for i in range(parts + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def run_parts(threads: Threads | None, work: Callable[[range], T], total: int) -> list[T]:
    """``work`` over the parts of ``range(total)`` (:func:`spans`), in order: on ``threads``, or
    in the calling thread when there are none or only one part.

    The parts must be independent (each writes only its own rows).
    """
    if threads is None or threads.count == 1 or total <= 1:
        return [work(part) for part in spans(total, 1)]
    futures = [threads.executor.submit(work, part) for part in spans(total, threads.count)]
    return [future.result() for future in futures]
