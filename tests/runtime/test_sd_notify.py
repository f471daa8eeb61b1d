"""sd_notify: never blocks, counts what it drops, and pings the watchdog only when systemd asks."""

from __future__ import annotations

import asyncio
import os
import socket
import time

from runtime.sd_notify import Notifier
from tests.support.notify import NotifyListener


def _unread_socket() -> tuple[socket.socket, str]:
    """A bound datagram socket nobody reads, and its NOTIFY_SOCKET spelling."""
    name = f"ldp-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    return sock, "@" + name


def test_notifications_to_a_full_socket_are_dropped_and_counted_not_blocked() -> None:
    """Against a socket nobody drains, every notify call returns at once; the ones that cannot go are counted."""
    sock, address = _unread_socket()
    try:
        notifier = Notifier({"NOTIFY_SOCKET": address})
        results = [notifier.notify("WATCHDOG=1") for _ in range(5_000)]
        assert notifier.sent == results.count(True) > 0
        assert notifier.dropped == results.count(False) > 0  # the queue filled; nothing blocked
        notifier.close()
    finally:
        sock.close()


def test_no_listener_and_no_socket() -> None:
    """A socket path nobody listens on drops and counts; without NOTIFY_SOCKET notify is a no-op."""
    notifier = Notifier({"NOTIFY_SOCKET": "@ldp-test-nobody-listens-here"})
    assert notifier.notify("READY=1") is False
    assert notifier.dropped == 1
    notifier.close()
    quiet = Notifier({})
    assert not quiet.enabled
    assert quiet.notify("READY=1") is False
    assert quiet.dropped == 0


def test_watchdog_interval_is_half_watchdog_usec_for_this_process() -> None:
    """WATCHDOG_USEC sets the ping interval (half of it); unset, 0, or WATCHDOG_PID of another process: none."""
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "3000000"}
    assert Notifier(env).watchdog_interval == 1.5
    assert Notifier(env | {"WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 1.5
    assert Notifier(env | {"WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_interval is None
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "0"}).watchdog_interval is None
    assert Notifier({"NOTIFY_SOCKET": "@x"}).watchdog_interval is None


def test_several_fields_go_in_one_datagram() -> None:
    """notify("READY=1", "STATUS=...") sends both lines together, as sd_notify(3) does."""
    listener = NotifyListener()
    try:
        notifier = Notifier({"NOTIFY_SOCKET": listener.address})
        assert notifier.notify("READY=1", "STATUS=serving")
        listener.wait_for("STATUS=serving", timeout=30, alive=lambda: True, what="the notifier")
        notifier.close()
    finally:
        listener.close()


def test_the_watchdog_pings_at_its_interval_and_not_without_one() -> None:
    """run_watchdog sends WATCHDOG=1 repeatedly when asked for, and returns at once when systemd asked for none."""
    listener = NotifyListener()
    pings: list[int] = []

    async def main() -> None:
        notifier = Notifier({"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "2000"})
        task = asyncio.create_task(notifier.run_watchdog(lambda: pings.append(notifier.sent)))
        while len(pings) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        notifier.close()
        # No WATCHDOG_USEC: no pings at all (systemd ignores pings it did not ask for).
        await asyncio.wait_for(Notifier({"NOTIFY_SOCKET": listener.address}).run_watchdog(), timeout=60)

    try:
        asyncio.run(main())
        assert pings[:3] == [1, 2, 3]
        listener.wait_for("WATCHDOG=1", timeout=30, alive=lambda: True, what="the watchdog")
    finally:
        listener.close()
