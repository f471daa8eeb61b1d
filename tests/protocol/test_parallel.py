"""The caller's threads for a server half's parts (protocol.server.parallel): the same answer with or without them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from protocol.cms import CountMeanSketch
from protocol.randomness import SeededRandom
from protocol.server.cms import CMSServer
from protocol.server.parallel import Threads, run_parts, spans


def test_spans_cut_a_range_into_contiguous_near_equal_parts() -> None:
    """Every index lands in exactly one part, in order; never more parts than indices."""
    for total, parts in ((10, 3), (3, 8), (0, 2), (65_536, 2), (7, 1)):
        cut = spans(total, parts)
        assert [i for r in cut for i in r] == list(range(total))
        assert len(cut) == min(max(parts, 1), total)
        assert all(len(r) > 0 for r in cut)
        assert max((len(r) for r in cut), default=0) - min((len(r) for r in cut), default=0) <= 1


def test_run_parts_answers_in_order_with_or_without_threads() -> None:
    """The parts' results come back in the order of the ranges, on the caller's pool or in this thread."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        for threads in (None, Threads(pool, 1), Threads(pool, 3)):
            got: list[list[int]] = run_parts(threads, list, 10)
            assert [i for part in got for i in part] == list(range(10))
            assert len(got) == (1 if threads is None else threads.count)
        with pytest.raises(ValueError, match="count must be a positive integer"):
            Threads(pool, 0)


def test_a_large_cms_fold_and_query_are_the_same_split_or_not() -> None:
    """A CMS batch folded and queried in parts over two threads gives exactly the counts of one thread."""
    mech = CountMeanSketch(epsilon=4.0, k=64, m=1024, seed=bytes(16))
    server = CMSServer(mech)
    values = [f"v{i % 50}" for i in range(4_096)]  # 4,096 x 1,024 cells: past the threaded size
    batch = server.privatize_many(values, SeededRandom(9))
    alone, split = server.new_aggregate(), server.new_aggregate()
    alone.add(batch)
    with ThreadPoolExecutor(max_workers=2) as pool:
        threads = Threads(pool, 2)
        split.add(batch, threads=threads)
        assert np.array_equal(alone.ones, split.ones)
        names = [f"v{i}" for i in range(60)]
        a, b = alone.estimate(names), split.estimate(names, threads=threads)
    assert np.array_equal(a.values, b.values)
    assert np.array_equal(a.standard_errors, b.standard_errors)
