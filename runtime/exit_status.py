"""The exit statuses of the three command-line tools (``ldp-agent``, ``ldp-collector``, ``ldp-fleet``).

One table, so a status means the same thing whichever tool returns it and scripts can test
for it. Not every tool returns every status; no tool gives a status another meaning. Each
tool's ``--help`` prints :data:`HELP`; the README's "Exit status" table says the same.

The table is a contract with the shell that runs a tool, not with the other side of the
wire, so it sits in :mod:`runtime` beside the rest of what the tools need of their host
(:mod:`runtime.console`), not in the pure core that agent and collector share.
"""

from __future__ import annotations

import enum
from types import MappingProxyType

__all__ = ["HELP", "MEANING", "ExitStatus"]


class ExitStatus(enum.IntEnum):
    """What a tool's exit status says (:data:`MEANING` has the sentence for each)."""

    OK = 0
    ERROR = 1
    CONFIG = 2
    REFUSED = 3
    NO_CONSENT = 4
    STOPPED = 5
    STATE_UNREADABLE = 6
    NOT_RELEASED = 7
    UNAVAILABLE = 8
    BEYOND_TOLERANCE = 9
    STORE_DAMAGED = 10


MEANING = MappingProxyType(
    {
        ExitStatus.OK: "done (the value taken, the estimate released, every fleet error within tolerance)",
        ExitStatus.ERROR: "a failure at run time (an unexpected error, an unusable store, a busy state directory)",
        ExitStatus.CONFIG: (
            "a wrong command line (an unknown use case among them), config file, file a config names, "
            "registry or local policy"
        ),
        ExitStatus.REFUSED: "values refused (ldp-agent record; an ldp-fleet run that sent nothing because of it)",
        ExitStatus.NO_CONSENT: "the device's user has not opted in (ldp-agent)",
        ExitStatus.STOPPED: (
            "the use case has stopped: lifetime ε spent, parameters changed or past its end date (ldp-agent)"
        ),
        ExitStatus.STATE_UNREADABLE: "the sealed state or its key cannot be read, or the key does not open it "
        "(ldp-agent)",
        ExitStatus.NOT_RELEASED: (
            "nothing to show yet: no data, or below the release threshold (ldp-collector; ldp-fleet "
            "when no estimate was released to compare)"
        ),
        ExitStatus.UNAVAILABLE: (
            "the broker or the collector unreachable, refusing us, or not committing; some of the fleet's own "
            "reports not counted (ldp-fleet)"
        ),
        ExitStatus.BEYOND_TOLERANCE: "some estimate further from the truth than the tolerance (ldp-fleet)",
        ExitStatus.STORE_DAMAGED: (
            "the checkpoint store is damaged or missing; restarting cannot help (ldp-collector run, status, estimate)"
        ),
    }
)
"""One sentence per status."""

HELP = "exit status (shared by ldp-agent, ldp-collector, ldp-fleet):\n" + "\n".join(
    f"  {status.value}  {MEANING[status]}" for status in ExitStatus
)
"""The table as ``--help`` prints it."""
