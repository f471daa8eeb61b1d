"""The ``ldp-collector`` command's entry point: names the missing extra before anything imports it.

The base install is a device's (protocol, runtime, agent); the collector's server libraries
come with the ``[collector]`` extra. Without this check, ``ldp-collector`` on a base install
ends in a ``ModuleNotFoundError`` traceback from deep inside an import; with it, the operator
reads which extra to install.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

from runtime.exit_status import ExitStatus

__all__ = ["SERVER_MODULES", "main", "missing_server_modules"]

SERVER_MODULES = {"aiohttp": "aiohttp", "prometheus_client": "prometheus-client"}
"""The modules ``ldp-collector`` cannot start without, and the distributions that provide them.
(psycopg is needed only for a PostgreSQL store; the store names it when it is missing.)"""


def missing_server_modules() -> list[str]:
    """The distributions of :data:`SERVER_MODULES` that are not installed."""
    return [dist for module, dist in SERVER_MODULES.items() if importlib.util.find_spec(module) is None]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ldp-collector`` if its extra is installed; otherwise say how to install it."""
    missing = missing_server_modules()
    if missing:
        print(
            f"ldp-collector: the collector's libraries are not installed (missing: {', '.join(missing)}).\n"
            "This is a device's install; a collector machine needs the collector extra:\n"
            "    pip install 'ldp-telemetry[collector]'\n"
            "(deploy/install.sh collector does this).",
            file=sys.stderr,
        )
        return int(ExitStatus.CONFIG)
    from collector.cli import main as run  # noqa: PLC0415 - only once the libraries are known present

    return run(argv)
