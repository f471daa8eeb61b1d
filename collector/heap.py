"""The service process's use of the cyclic garbage collector (``ldp-collector run`` only).

Per message the collector makes a handful of short-lived objects (the delivery, the decoded
report, its records, the receipt request) and keeps up to ``ingest.commit_max_reports`` of
them buffered until their commit; none of them is in a reference cycle, so reference counting
frees them all. With the interpreter's default thresholds the collector's young pass ran
every 700 allocations and walked the buffered reports again and again, and its full passes
walked everything made at start (registry, catalog, modules) as well, freeing nothing: about
a tenth of the ingest thread's time, which freezing the start-up heap and young passes every
20,000 allocations give back (docs/benchmarks.md, "The collector's garbage collector";
docs/deploy.md, "The store's cost per report" has the whole path). Cycles are still
collected, only later.

Process-wide settings: the console command sets them, not :func:`collector.service.run_service`,
which tests and embedding applications run inside processes of their own.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_COLLECTION", "fewer_young_collections", "freeze_start_up"]

YOUNG_COLLECTION = 20_000
"""Allocations between two young passes of the cyclic garbage collector (the default is 700)."""


def fewer_young_collections() -> None:
    """Run the young pass every :data:`YOUNG_COLLECTION` allocations, the older ones as before."""
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])


def freeze_start_up(_service: object = None) -> None:
    """Collect once, then leave everything made so far out of every later pass (``gc.freeze``):
    called when the service is ready, so registry, catalog, store and modules are made."""
    gc.collect()
    gc.freeze()
