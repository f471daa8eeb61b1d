"""An exact multiset of 16-byte keys per (use case, period), held in memory compactly.

The SQLite store remembers the report ids it folded and the allowance tags it counted
(docs/device-identity.md) in append-only runs, one row per commit and key
(:mod:`collector.store.sqlite_ids`). Runs are cheap to write and have no index by id, so the
lookups a commit makes ("was this id folded before?", "how many reports has this tag?") are
answered here, from memory, for every id the runs hold.

Both kinds of key are uniformly random 16-byte strings (a report id drawn by the device's
CSPRNG, a keyed BLAKE2b tag), so each is kept as two 64-bit integers, 16 bytes of numpy per
key plus its count, in arrays sorted by the high word; a lookup is a vectorised binary
search on that word and a comparison of the low one (keys whose high words are equal, once
in about 2^64 / n pairs, are compared one by one). Keys added since the arrays were last
built wait in a dictionary and are merged in once they are an eighth of the arrays: adding
costs O(log n) amortised, and the memory is 20 bytes a key in the arrays (two words and a
32-bit count) and about 100 for each of the at most one in nine that wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["KEY_BYTES", "Key", "KeySet"]

KEY_BYTES = 16
"""Bytes of every key held: a report id, an allowance tag."""

Key = tuple[int, int]
"""What the keys are grouped by: the use case's row id and the period."""

_U64 = npt.NDArray[np.uint64]
_MERGE_AT = 4096
"""Keys waiting in a group's dictionary before they are merged into its arrays, at least."""


def _words(ids: Sequence[bytes]) -> tuple[_U64, _U64]:
    """The high and low 64-bit words of each 16-byte key.

    Raises:
        ValueError: a key is not 16 bytes long.
    """
    if set(map(len, ids)) - {KEY_BYTES}:
        raise ValueError(f"every key must be {KEY_BYTES} bytes")
    joined = b"".join(ids)
    both = np.frombuffer(joined, dtype=">u8").reshape(-1, 2)
    return both[:, 0].astype(np.uint64), both[:, 1].astype(np.uint64)


class _Group:
    """The keys of one (use case, period): sorted arrays and the keys added since."""

    __slots__ = ("counts", "hi", "lo", "waiting")

    def __init__(self) -> None:
        self.hi: _U64 = np.empty(0, dtype=np.uint64)
        self.lo: _U64 = np.empty(0, dtype=np.uint64)
        self.counts: npt.NDArray[np.uint32] = np.empty(0, dtype=np.uint32)
        self.waiting: Counter[bytes] = Counter()

    def __len__(self) -> int:
        return len(self.hi) + len(self.waiting)

    def positions(self, ids: Sequence[bytes]) -> npt.NDArray[np.int64]:
        """Where each of ``ids`` is in the arrays, or -1."""
        found = np.full(len(ids), -1, dtype=np.int64)
        if not len(self.hi) or not ids:
            return found
        qh, ql = _words(ids)
        left = np.searchsorted(self.hi, qh, "left")
        right = np.searchsorted(self.hi, qh, "right")
        width = right - left
        single = np.flatnonzero(width == 1)
        hit = single[self.lo[left[single]] == ql[single]]
        found[hit] = left[hit]
        for i in np.flatnonzero(width > 1).tolist():  # equal high words: compare the low ones
            lo_i = int(left[i])
            matches = np.flatnonzero(self.lo[lo_i : int(right[i])] == ql[i])
            if len(matches):
                found[i] = lo_i + int(matches[0])
        return found

    def count(self, ids: Sequence[bytes]) -> list[int]:
        """How many times each of ``ids`` was added."""
        at = self.positions(ids)
        counts = np.zeros(len(ids), dtype=np.int64)
        hit = at >= 0
        counts[hit] = self.counts[at[hit]]
        held: list[int] = counts.tolist()
        waiting = self.waiting
        if waiting:
            return [n + waiting.get(i, 0) for n, i in zip(held, ids, strict=True)]
        return held

    def add(self, ids: Sequence[bytes], *, new: bool) -> int:
        """Add one occurrence of each of ``ids``; the number of keys that were new.

        ``new``: the caller knows that none of ``ids`` is held and no two are equal (a commit's
        fresh report ids, judged under the write lock), so they are not looked up.

        Raises:
            ValueError: a key is not 16 bytes long (checked before anything is added).
        """
        if set(map(len, ids)) - {KEY_BYTES}:
            raise ValueError(f"every key must be {KEY_BYTES} bytes")
        if not new:
            at = self.positions(ids)
            held = at >= 0
            if held.any():
                np.add.at(self.counts, at[held], 1)
                ids = [i for i, h in zip(ids, held.tolist(), strict=True) if not h]
        waiting = self.waiting
        before = len(waiting)
        waiting.update(ids)
        added = len(waiting) - before
        if len(waiting) >= max(_MERGE_AT, len(self.hi) // 8):
            self._merge()
        return added

    def _merge(self) -> None:
        """Move the waiting keys into the arrays, keeping them sorted by the high word."""
        keys = list(self.waiting)
        hi, lo = _words(keys)
        counts = np.fromiter(self.waiting.values(), dtype=np.uint32, count=len(keys))
        order = np.argsort(hi, kind="stable")
        hi, lo, counts = hi[order], lo[order], counts[order]
        at = np.searchsorted(self.hi, hi)
        self.hi = np.insert(self.hi, at, hi)
        self.lo = np.insert(self.lo, at, lo)
        self.counts = np.insert(self.counts, at, counts)
        self.waiting = Counter()

    def items(self) -> Iterator[tuple[bytes, int]]:
        """Every key with its count."""
        both = np.empty((len(self.hi), 2), dtype=">u8")
        both[:, 0] = self.hi
        both[:, 1] = self.lo
        raw = both.tobytes()
        for i, n in enumerate(self.counts.tolist()):
            yield raw[KEY_BYTES * i : KEY_BYTES * (i + 1)], int(n)
        yield from self.waiting.items()


class KeySet:
    """Counts of 16-byte keys, grouped by (use case, period); the count of a key never added is 0.

    Attributes:
        size: keys held, over every group.
    """

    def __init__(self) -> None:
        self._groups: dict[Key, _Group] = {}
        self.size = 0

    def count(self, key: Key, ids: Sequence[bytes]) -> list[int]:
        """How many times each of ``ids`` was added under ``key``."""
        group = self._groups.get(key)
        if group is None:
            return [0] * len(ids)
        return group.count(ids)

    def add(self, key: Key, ids: Sequence[bytes], *, new: bool = False) -> None:
        """Add one occurrence of each of ``ids`` under ``key`` (a key given twice counts twice).

        ``new``: none of ``ids`` is held under ``key`` and no two are equal, so they need no
        lookup; the caller must know it (a wrong promise would count a key twice in two places).

        Raises:
            ValueError: a key is not 16 bytes long.
        """
        if not ids:
            return
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        self.size += group.add(ids, new=new)

    def drop(self, key: Key) -> None:
        """Forget every key of ``key``."""
        group = self._groups.pop(key, None)
        if group is not None:
            self.size -= len(group)

    def groups(self) -> list[Key]:
        """The (use case, period) pairs that hold keys."""
        return list(self._groups)

    def held(self, key: Key) -> int:
        """Keys held under ``key``."""
        group = self._groups.get(key)
        return 0 if group is None else len(group)

    def items(self, key: Key) -> Iterable[tuple[bytes, int]]:
        """Every key held under ``key`` with its count (unordered)."""
        group = self._groups.get(key)
        return () if group is None else group.items()

    def clear(self) -> None:
        """Forget everything."""
        self._groups.clear()
        self.size = 0
