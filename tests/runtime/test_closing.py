"""A blocking close run by runtime.closing.close_in_thread survives the cancellation of its caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.closing import close_in_thread


def test_a_cancelled_close_runs_to_its_end_before_the_cancellation_goes_on() -> None:
    """Cancelled mid-close, the caller waits for the close to finish, then is cancelled."""
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []
    seen_at_end: list[bool] = []

    def close() -> None:
        started.set()
        release.wait(30)
        finished.append(True)

    async def main() -> None:
        task = asyncio.create_task(close_in_thread(close))
        task.add_done_callback(lambda _: seen_at_end.append(bool(finished)))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)  # let the cancellation reach the task (a yield, not a wait)
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen_at_end == [True]


def test_what_the_close_raises_reaches_the_caller() -> None:
    """An error of the close itself is raised to the caller."""

    def close() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        asyncio.run(close_in_thread(close))
