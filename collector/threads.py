"""The collector's threads for numpy work split in parts (:mod:`protocol.server.parallel`).

``protocol/`` starts no thread (docs/design.md, convention 1): the sketches' dictionary gather,
the Hadamard transform of HCMS and the SFP queries take their threads from here. numpy releases
the GIL in those passes, so one thread per CPU gives close to that many times the speed of one.
The running service keeps one pool for its life (``collector.live``); a command that estimates
once (``ldp-collector estimate``) opens one for that estimate.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from protocol.server.parallel import Threads

__all__ = ["numpy_threads", "thread_count"]


def thread_count() -> int:
    """One part per CPU of this machine."""
    return os.cpu_count() or 1


@contextlib.contextmanager
def numpy_threads(count: int | None = None) -> Iterator[Threads]:
    """A pool of ``count`` threads (default :func:`thread_count`) for the duration of the block."""
    count = thread_count() if count is None else count
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="numpy") as pool:
        yield Threads(pool, count)
