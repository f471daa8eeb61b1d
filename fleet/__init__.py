"""The fleet simulator (``ldp-fleet``): many real agents against a real broker and collector.

It imports the agent as a library: every simulated device is a complete :class:`agent.core.Agent`
driven by :class:`agent.daemon.Daemon` on a simulated clock. Nothing in the agent or the
collector imports this package, and a device's base install does not need its extra
(``pip install 'ldp-telemetry[fleet]'``).

Modules: ``values`` (value generators and population files), ``sim`` (the simulated devices,
pooled connections, the exact truth), ``report`` (comparison with the collector's estimates,
text, JSON and plots), ``cli`` (the ``ldp-fleet`` command).
"""

__all__ = ["cli", "report", "sim", "values"]
