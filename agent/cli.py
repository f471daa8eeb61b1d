"""``ldp-agent``: run the daemon, record values, manage consent, show the ledger and status.

Verbs other than ``run`` talk to the running daemon over its Unix socket; when no daemon
runs they open the state directly (under the same lock the daemon holds), so they work the
same either way.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, load_config
from agent.errors import (
    AgentBusyError,
    ConfigError,
    KeyUnavailableError,
    PolicyError,
    StateUnreadableError,
    UseCaseStoppedError,
    ValueRefusedError,
)

__all__ = ["EXIT_CODES", "call", "main"]

DEFAULT_CONFIG = Path("/etc/ldp-agent/agent.toml")
CONFIG_ENV = "LDP_AGENT_CONFIG"

EXIT_CODES = {
    "ok": 0,
    "error": 1,
    "config": 2,
    "value-refused": 3,
    "consent-required": 4,
    "use-case-stopped": 5,
    "state-unreadable": 6,
}

_DESCRIPTION = """\
The on-device agent of ldp-telemetry: it privatizes values with local differential privacy
on this device and publishes only privatized reports, every 6 hours, over MQTT.

Nothing is recorded or sent before you opt in (`ldp-agent consent grant`); `consent revoke`
deletes everything the agent keeps. `ledger` shows exactly what left the device.
"""

_EPILOG = """\
verbs:
  run                      run the daemon (under systemd: Type=notify, watchdog)
  record USE_CASE VALUE    record one value (counters take numbers, rr takes 0/1/true/false,
                           the others text); --key names the counter (e.g. the application)
  consent grant|revoke|show
  ledger                   the privatized reports that left the device, with the ε spent
  status                   consent, use cases, next cycle, outbox size, ε spent

exit status: 0 ok, 1 error, 2 bad config/registry/policy, 3 value refused, 4 no consent,
             5 use case stopped, 6 state unreadable
config: --config, else $LDP_AGENT_CONFIG, else /etc/ldp-agent/agent.toml
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ldp-agent",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="the agent's TOML config file")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    sub.add_parser("run", help="run the daemon", description="Run the agent daemon in the foreground.")
    rec = sub.add_parser(
        "record",
        help="record a value",
        description="Record one value for a use case. It is privatized on this device before anything is stored.",
    )
    rec.add_argument("use_case", metavar="USE_CASE")
    rec.add_argument("value", metavar="VALUE")
    rec.add_argument("--key", help="the counter key of a counter use case (e.g. an application name)")
    con = sub.add_parser("consent", help="grant, revoke or show consent", description="Manage the opt-in.")
    con.add_argument("action", choices=["grant", "revoke", "show"])
    con.add_argument("--json", action="store_true", help="print JSON")
    led = sub.add_parser(
        "ledger", help="show what left the device", description="The reports the broker acknowledged, as sent."
    )
    led.add_argument("--use-case", help="only this use case")
    led.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("status", help="show the agent's status", description="Consent, use cases, schedule, budget.")
    st.add_argument("--json", action="store_true", help="print JSON")
    return p


def _setup_logging(level: str) -> None:
    fmt = (
        "%(levelname)s %(name)s: %(message)s"
        if os.environ.get("JOURNAL_STREAM")
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def call(path: Path, request: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the running agent's socket and return its reply.

    Raises:
        FileNotFoundError, ConnectionRefusedError: no agent listens on ``path``.
        OSError: other socket errors.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = json.loads(b"".join(chunks))
    if not isinstance(reply, dict):
        raise ConnectionError("the agent sent a malformed reply")
    return reply


def _request(cfg: AgentConfig, request: dict[str, Any]) -> dict[str, Any]:
    try:
        return call(cfg.api.socket, request)
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    # No daemon: open the state ourselves, under the lock a daemon would hold. Imported here:
    # talking to a running daemon needs none of the mechanisms.
    from agent.api import handle_request  # noqa: PLC0415
    from agent.clock import clock_from_env  # noqa: PLC0415
    from agent.daemon import StateLock, load_registry, open_agent  # noqa: PLC0415
    from protocol.randomness import SystemRandom  # noqa: PLC0415

    registry = load_registry(cfg)
    try:
        with StateLock(cfg.state.directory):
            agent = open_agent(cfg, registry, clock=clock_from_env(), rng=SystemRandom())
            return handle_request(agent, request)
    except AgentBusyError:
        raise AgentBusyError(
            f"an agent process holds {cfg.state.directory} but does not answer on {cfg.api.socket}"
        ) from None


def _print_status(status: dict[str, Any]) -> None:
    print(f"consent:     {'granted ' + _when(status['consent_granted_at']) if status['consent'] else 'not granted'}")
    print(f"registry:    {status['registry']} ({status['registry_source']})")
    print(f"next cycle:  {_when(status['next_cycle'])}   last cycle: {_when(status['last_cycle'])}")
    print(f"outbox:      {status['outbox']} reports waiting; ledger {status['ledger']}")
    print("use cases:")
    for row in status["use_cases"]:
        line = f"  {row['use_case']:<28} {row['mechanism']:<13} {row['state']}"
        if "epsilon_total" in row:
            line += (
                f"; today {row['records_today']}/{row['daily_limit']} records, ε {row['epsilon_today']:.4g};"
                f" lifetime ε {row['epsilon_total']:.4g}/{row['epsilon_cap']:g}; outbox {row['outbox']}"
            )
        print(line)


def _print_ledger(entries: list[dict[str, Any]]) -> None:
    if not entries:
        print("nothing has left this device")
        return
    for e in entries:
        print(
            f"{_when(e['sent'])}  {e['use_case']}  period {e['period']}  {len(e['records'])} records"
            f"  ε {e['epsilon']:.4g} (day {e['epsilon_today']:.4g}, total {e['epsilon_total']:.4g})"
        )
        print(f"    {json.dumps(e['records'])}")


def _client(cfg: AgentConfig, args: argparse.Namespace) -> int:
    if args.verb == "record":
        request: dict[str, Any] = {"op": "record", "use_case": args.use_case, "text": args.value}
        if args.key is not None:
            request["key"] = args.key
    elif args.verb == "consent":
        request = {"op": "consent", "action": args.action}
    else:
        request = {"op": args.verb}
    reply = _request(cfg, request)
    if not reply.get("ok"):
        kind = str(reply.get("error", "error"))
        print(f"ldp-agent: {reply.get('message', kind)}", file=sys.stderr)
        return EXIT_CODES.get(kind, 1)
    as_json = getattr(args, "json", False)
    if args.verb == "record":
        if reply["outcome"] != "recorded":
            print(f"ldp-agent: value {reply['outcome']}", file=sys.stderr)
    elif args.verb == "consent":
        if as_json:
            print(json.dumps(reply))
        elif args.action == "revoke":
            print(f"consent revoked; {reply['files_removed']} state files deleted")
        else:
            print(f"consent: {'granted ' + _when(reply['granted_at']) if reply['consent'] else 'not granted'}")
    elif args.verb == "ledger":
        entries = [e for e in reply["ledger"] if args.use_case in (None, e["use_case"])]
        if as_json:
            print(json.dumps(entries, indent=1))
        else:
            _print_ledger(entries)
    elif args.verb == "status":
        if as_json:
            print(json.dumps(reply["status"], indent=1))
        else:
            _print_status(reply["status"])
    return 0


def _run(cfg: AgentConfig) -> int:
    from agent.clock import clock_from_env  # noqa: PLC0415
    from agent.daemon import run_daemon  # noqa: PLC0415

    asyncio.run(run_daemon(cfg, clock=clock_from_env()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``ldp-agent`` console script."""
    args = _parser().parse_args(argv)
    path = args.config or Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        cfg = load_config(path)
    except ConfigError as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["config"]
    _setup_logging(cfg.log.level if args.verb == "run" else "warning")
    try:
        return _dispatch(cfg, args)
    except Exception:
        # Unexpected: log the traceback and exit non-zero, so systemd restarts the service.
        logging.getLogger("ldp_agent").exception("the agent failed")
        return EXIT_CODES["error"]


def _dispatch(cfg: AgentConfig, args: argparse.Namespace) -> int:
    try:
        return _run(cfg) if args.verb == "run" else _client(cfg, args)
    except (ConfigError, PolicyError) as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["config"]
    except ValueRefusedError as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["value-refused"]
    except UseCaseStoppedError as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["use-case-stopped"]
    except (StateUnreadableError, KeyUnavailableError) as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["state-unreadable"]
    except AgentBusyError as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["error"]
