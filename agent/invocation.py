"""What an ``ldp-agent`` invocation's command line (:mod:`agent.cli`) and its verbs
(:mod:`agent.verbs`) share: where the config is looked for, and the exit status of each of the
API's error kinds (runtime/exit_status.py)."""

from __future__ import annotations

from pathlib import Path

from runtime.exit_status import ExitStatus

__all__ = ["CONFIG_ENV", "DEFAULT_CONFIG", "EXIT_CODES"]

DEFAULT_CONFIG = Path("/etc/ldp-agent/agent.toml")
CONFIG_ENV = "LDP_AGENT_CONFIG"

# The API's error kinds -> the exit statuses shared by the three tools (runtime/exit_status.py).
EXIT_CODES: dict[str, int] = {
    "ok": ExitStatus.OK,
    "error": ExitStatus.ERROR,
    "config": ExitStatus.CONFIG,
    "value-refused": ExitStatus.REFUSED,
    "consent-required": ExitStatus.NO_CONSENT,
    "use-case-stopped": ExitStatus.STOPPED,
    # Past its end date: a stop too, which a registry with a later date lifts (agent/expiry.py).
    "use-case-expired": ExitStatus.STOPPED,
    "state-unreadable": ExitStatus.STATE_UNREADABLE,
    # A use case the registry does not have: a wrong command line, as for ldp-collector estimate.
    "unknown-use-case": ExitStatus.CONFIG,
    # A full disk: the value was refused and not kept; the agent keeps running and resumes by
    # itself (docs/state-integrity.md, "A full disk").
    "state-unwritable": ExitStatus.ERROR,
}
