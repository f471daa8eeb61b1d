"""The in-memory multiset of 16-byte keys behind the SQLite store's report ids and allowance tags."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from collector.store.keyset import KEY_BYTES, KeySet


def _keys(gen: np.random.Generator, n: int) -> list[bytes]:
    raw = gen.bytes(KEY_BYTES * n)
    return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]


def test_counts_match_a_reference_through_many_merges() -> None:
    """Random keys added in batches, some again, under two groups: every count equals a Counter's, absent keys 0."""
    gen = np.random.default_rng(36)
    keys = KeySet()
    reference: dict[tuple[int, int], Counter[bytes]] = {(1, 10): Counter(), (2, 10): Counter()}
    pool: list[bytes] = []
    for step in range(60):
        group = (1, 10) if step % 3 else (2, 10)
        fresh = _keys(gen, int(gen.integers(1, 900)))
        again = [pool[int(i)] for i in gen.integers(0, len(pool), size=40)] if pool else []
        batch = fresh + again
        keys.add(group, batch)
        reference[group].update(batch)
        pool += fresh
    absent = _keys(gen, 500)
    for group, counts in reference.items():
        asked = list(counts) + absent
        assert keys.count(group, asked) == [counts[k] for k in asked]
        assert keys.held(group) == len(counts)
        assert dict(keys.items(group)) == dict(counts)
    assert keys.size == sum(len(c) for c in reference.values())


def test_keys_that_share_their_first_eight_bytes_are_told_apart() -> None:
    """Keys whose high words are equal (rare among random ids) are compared on their low words."""
    keys = KeySet()
    head = b"\x42" * 8
    same = [head + bytes([i]) * 8 for i in range(6)]
    filler = _keys(np.random.default_rng(1), 20_000)  # enough to merge the waiting keys into the arrays
    keys.add((1, 1), same[:4] + filler)
    assert keys.count((1, 1), same) == [1, 1, 1, 1, 0, 0]
    keys.add((1, 1), [same[2], same[5]])
    assert keys.count((1, 1), same) == [1, 1, 2, 1, 0, 1]


def test_dropping_a_group_forgets_only_it() -> None:
    """drop() forgets one (use case, period) and its keys leave the size; clear() forgets all."""
    gen = np.random.default_rng(2)
    keys = KeySet()
    a, b = _keys(gen, 5000), _keys(gen, 300)
    keys.add((1, 7), a)
    keys.add((1, 8), b)
    keys.drop((1, 7))
    assert keys.count((1, 7), a[:3]) == [0, 0, 0]
    assert keys.count((1, 8), b[:3]) == [1, 1, 1]
    assert (keys.size, keys.groups()) == (300, [(1, 8)])
    keys.clear()
    assert (keys.size, keys.groups()) == (0, [])


def test_keys_known_to_be_new_are_added_without_a_lookup_and_count_alike() -> None:
    """Keys promised new (a commit's fresh ids) count exactly as keys looked up first."""
    gen = np.random.default_rng(4)
    looked, trusted = KeySet(), KeySet()
    for _ in range(20):
        batch = _keys(gen, int(gen.integers(100, 3000)))
        looked.add((1, 1), batch)
        trusted.add((1, 1), batch, new=True)
    assert dict(looked.items((1, 1))) == dict(trusted.items((1, 1)))
    assert looked.size == trusted.size


def test_a_key_of_the_wrong_length_is_refused() -> None:
    """Every key is 16 bytes; anything else is a ValueError, not a silently different key."""
    keys = KeySet()
    with pytest.raises(ValueError, match="16 bytes"):
        keys.add((1, 1), [b"\x01" * 15, b"\x02" * 17])
