"""systemd's notification protocol for the agent: :class:`runtime.sd_notify.Notifier`.

The agent sends ``READY=1`` once it serves, ``WATCHDOG=1`` at half ``$WATCHDOG_USEC`` while
its event loop is alive, ``STATUS=...`` lines, and ``STOPPING=1`` on shutdown; one
implementation serves the agent and the collector.
"""

from __future__ import annotations

from runtime.sd_notify import Notifier

__all__ = ["Notifier"]
