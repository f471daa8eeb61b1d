"""Cleanup that survives cancellation, for resources whose close blocks (docs/design.md, convention 14).

A resource whose ``close`` waits for a thread or a database (the collector's store thread, its
materialised aggregates) is closed in a worker thread so the event loop keeps running; if the
task that awaits the close is cancelled meanwhile, the close still runs to its end before the
cancellation goes on, so the next resource of an ``AsyncExitStack`` is never closed under a
half-closed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["close_in_thread"]


async def close_in_thread(close: Callable[[], None]) -> None:
    """Run the blocking ``close`` in a worker thread to its end, whatever happens to the caller.

    Raises:
        asyncio.CancelledError: the caller was cancelled while ``close`` ran (raised once it
            has finished).
        Exception: what ``close`` raised.
    """
    done = asyncio.get_running_loop().run_in_executor(None, close)
    cancelled = False
    while not done.done():
        try:
            # shield: a cancellation stops this wait, not the close (a thread cannot be stopped).
            await asyncio.shield(done)
        except asyncio.CancelledError:
            if done.done() and done.cancelled():
                raise
            cancelled = True
    done.result()
    if cancelled:
        raise asyncio.CancelledError
