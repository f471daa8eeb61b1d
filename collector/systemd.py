"""systemd's notification protocol for the collector: :class:`runtime.sd_notify.Notifier`.

The collector sends ``READY=1`` once subscribed, ``WATCHDOG=1`` at half ``$WATCHDOG_USEC``
while its event loop runs, and ``STOPPING=1`` on shutdown; a notification that cannot be
sent without blocking is dropped and counted (``ldp_collector_sd_notify_dropped_total``).
One implementation serves the agent and the collector.
"""

from __future__ import annotations

from runtime.sd_notify import Notifier

__all__ = ["Notifier"]
