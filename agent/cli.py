"""``ldp-agent``: its command line, and the entry point that parses it.

What each verb does is :mod:`agent.verbs`, imported once the arguments are parsed: ``--help``,
``--version`` and a wrong command line need none of the agent, and a device should not pay for
loading it to print a usage text (docs/deploy.md, "The device's footprint").
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from agent.invocation import DEFAULT_CONFIG, EXIT_CODES
from runtime.clock import Clock, SystemClock
from runtime.console import VersionAction, quiet_on_closed_pipe
from runtime.exit_status import HELP as EXIT_HELP

__all__ = ["DEFAULT_CONFIG", "EXIT_CODES", "main"]

_DESCRIPTION = """\
The on-device agent of ldp-telemetry: it privatizes values with local differential privacy
on this device and publishes only privatized reports, every 6 hours, over MQTT.

Nothing is recorded or sent before you opt in (`ldp-agent consent grant`); `consent revoke`
deletes everything the agent keeps. `ledger` shows exactly what left the device.
"""

_EPILOG = """\
verbs:
  run                      run the daemon (under systemd: Type=notify, watchdog)
  check-config             decode the config, the registry and every file they name, then exit
  record USE_CASE VALUE    record one value (counters take numbers, rr takes 0/1/true/false,
                           the others text); --key names the counter (e.g. the application).
                           A counter takes increments in [0, 2**53]; a period total beyond the
                           mechanism's range is clamped (1BitMean to m, dBitFlip into its last
                           bucket), and record says so
  consent grant|revoke|show
  ledger                   the privatized reports that left the device, with the ε spent
  status                   consent, use cases, next cycle, outbox size, ε spent, recording paused
  re-enrol                 after state files were deleted or replaced: start the stopped use cases
                           anew (new permanent randomness), carrying ε spent forward; see its --help
  generate --language python|c REGISTRY
                           print typed code with one function per use case of REGISTRY, for
                           applications that record through the agent (needs no config)

config: --config, else $LDP_AGENT_CONFIG, else /etc/ldp-agent/agent.toml

{exit_help}
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ldp-agent",
        description=_DESCRIPTION,
        epilog=_EPILOG.format(exit_help=EXIT_HELP),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=VersionAction)
    p.add_argument("--config", type=Path, help="the agent's TOML config file")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    sub.add_parser("run", help="run the daemon", description="Run the agent daemon in the foreground.")
    sub.add_parser(
        "check-config",
        help="check the config and every file it names",
        description="Decode the config and the registry (held against the local policy) and check every file "
        "they name: TLS CA, client certificate and key, password file, state key, probe files. Each must exist, "
        "be readable and parse; a problem names the file and the field.",
    )
    rec = sub.add_parser(
        "record",
        help="record a value",
        description="Record one value for a use case. It is privatized on this device before anything is stored. "
        "A value the use case can never release is refused with status 3, storing nothing and spending no ε: "
        "an sfp word with characters outside the use case's alphabet (named in the message), empty, or with "
        "a space inside.",
    )
    rec.add_argument("use_case", metavar="USE_CASE")
    rec.add_argument("value", metavar="VALUE")
    rec.add_argument("--key", help="the counter key of a counter use case (e.g. an application name)")
    con = sub.add_parser("consent", help="grant, revoke or show consent", description="Manage the opt-in.")
    con.add_argument("action", choices=["grant", "revoke", "show"])
    con.add_argument("--json", action="store_true", help="print JSON")
    led = sub.add_parser(
        "ledger",
        help="show what left the device",
        description=(
            "The reports the broker acknowledged, as sent, each with its state: sent (no commit"
            " receipt yet), counted, or refused: <reason>."
        ),
    )
    led.add_argument("--use-case", help="only this use case")
    led.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("status", help="show the agent's status", description="Consent, use cases, schedule, budget.")
    st.add_argument("--json", action="store_true", help="print JSON")
    gen = sub.add_parser(
        "generate",
        help="print typed code per use case for applications",
        description="Print a Python module or a C header with one typed function per use case of REGISTRY, "
        "recording through the agent's socket (agent.client, clients/c/), documented with the use case's "
        'description, ε, daily limit, owner and end date (docs/agent-api.md, "Clients"). Needs no config.',
    )
    # The languages of agent.generate.LANGUAGES, named here so that --help needs no import of it.
    gen.add_argument("--language", required=True, choices=("python", "c"))
    gen.add_argument("registry", type=Path, metavar="REGISTRY", help="the use-case registry (TOML)")
    sub.add_parser(
        "re-enrol",
        help="start stopped use cases anew after state files were deleted or replaced",
        description=_RE_ENROL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


_RE_ENROL_HELP = """Start anew the use cases that stopped because state files were deleted, rolled back or copied
in (the manifest, a use-case file, or consent, the ledger or the schedule of another state),
which `ldp-agent status` names. Run it with the daemon stopped; it opens the state directory
itself, then start the daemon again.

What it costs in privacy: each of these use cases draws new permanent randomness (a new
RAPPOR B', 1BitMean memo, dBitFlip buckets). The ε it had spent is never reset: it is carried
forward as the most that any file of the state directory records (the manifest, the use-case
file, the ledger's reports), and a new memo is charged at once against the same lifetime cap,
as for a registry change that starts a new memo (docs/privacy-accounting.md). A use case whose
cap cannot pay for the new memo stays stopped. When the manifest itself is gone, every use case
starts anew and the device gets a new state identity. The ledger lists what was done.

When no use case is stopped it changes nothing, says so and exits 0.
"""


def main(argv: Sequence[str] | None = None, *, clock: Clock | None = None) -> int:
    """The ``ldp-agent`` console script, and its library entry point.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        clock: the clock the daemon and the verbs run on (default: the host's
            :class:`runtime.clock.SystemClock`). Only a caller in Python can pass another
            one (the tests' launcher does); no option or environment variable can.
    """
    return quiet_on_closed_pipe(lambda: _main(argv, clock or SystemClock()))


def _main(argv: Sequence[str] | None, clock: Clock) -> int:
    args = _parser().parse_args(argv)
    from agent.verbs import run_verb  # noqa: PLC0415 - parsed first: --help needs none of the agent

    return run_verb(args, clock)
