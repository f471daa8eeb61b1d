"""What each ``ldp-agent`` verb does once :mod:`agent.cli` has parsed its arguments: run the
daemon, record values, manage consent, show the ledger and status.

Verbs other than ``run`` talk to the running daemon over its Unix socket; when no daemon
runs they open the state directly (under the same lock the daemon holds), so they work the
same either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.config import ActiveSecondsProbe, AgentConfig, load_config, read_password, tls_context
from agent.errors import (
    AgentBusyError,
    ConfigError,
    KeyUnavailableError,
    PolicyError,
    StateUnreadableError,
    StateWriteError,
    UseCaseStoppedError,
    ValueRefusedError,
)
from agent.invocation import CONFIG_ENV, DEFAULT_CONFIG, EXIT_CODES
from agent.status import AgentStatus, UseCaseStatus
from protocol.metadata import metadata_warnings
from protocol.plain import Json, JsonObject
from runtime.clock import Clock
from runtime.errors import expected_leaves
from runtime.exit_status import ExitStatus

__all__ = ["call", "check_config", "check_state", "run_verb"]


def _setup_logging(level: str) -> None:
    fmt = (
        "%(levelname)s %(name)s: %(message)s"
        if os.environ.get("JOURNAL_STREAM")
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)


def _when(t: object) -> str:
    if not t or not isinstance(t, int | float):
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def call(path: Path, request: JsonObject, *, timeout: float = 30.0) -> JsonObject:
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


def _request(cfg: AgentConfig, request: JsonObject, clock: Clock) -> JsonObject:
    try:
        return call(cfg.api.socket, request)
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    # No daemon: open the state ourselves, under the lock a daemon would hold. Imported here:
    # talking to a running daemon needs none of the mechanisms.
    from agent.api import handle_request  # noqa: PLC0415
    from agent.brokers import broker_order  # noqa: PLC0415
    from agent.identity import device_identity  # noqa: PLC0415
    from agent.opening import StateLock, load_registry, open_agent  # noqa: PLC0415
    from protocol.randomness import SystemRandom  # noqa: PLC0415

    registry = load_registry(cfg)
    try:
        with StateLock(cfg.state.directory):
            agent = open_agent(cfg, registry, clock=clock, rng=SystemRandom())
            identity = device_identity(cfg.broker, source=str(cfg.source or "<config>"))
            order = tuple(str(a) for a in broker_order(identity, cfg.broker.endpoints))
            return handle_request(agent, request, brokers=lambda: (order, None))
    except AgentBusyError:
        raise AgentBusyError(
            f"an agent process holds {cfg.state.directory} but does not answer on {cfg.api.socket}"
        ) from None


def _brokers(status: AgentStatus) -> str:
    """The brokers in the device's order, the one in use marked (or none open)."""
    names = [f"{b} (in use)" if b == status.broker_in_use else b for b in status.brokers]
    if len(names) > 1:
        names[0] += " (primary)"
    in_use = "" if status.broker_in_use is not None else "; no connection open"
    return ", ".join(names) + in_use


def _print_status(status: AgentStatus) -> None:
    print(f"consent:     {'granted ' + _when(status.consent_granted_at) if status.consent else 'not granted'}")
    print(f"registry:    {status.registry} ({status.registry_source})")
    print(f"next cycle:  {_when(status.next_cycle)}   last cycle: {_when(status.last_cycle)}")
    print(f"outbox:      {status.outbox} reports waiting; ledger {status.ledger}")
    print(f"recording:   {status.recording}")
    if status.brokers:
        print(f"brokers:     {_brokers(status)}")
    print("use cases:")
    for row in status.use_cases:
        line = f"  {row.definition:<38} {row.mechanism:<13} {row.state}"
        if row.records_today is not None and row.epsilon_today is not None:
            line += f"; today {row.records_today}/{row.daily_limit} records, ε {row.epsilon_today:.4g}"
        if row.epsilon_total is not None:
            # A stopped use case shows the ε spent its manifest recorded, and nothing else.
            line += f"; lifetime ε {row.epsilon_total:.4g}/{row.epsilon_cap:g}"
        if row.outbox is not None:
            line += f"; outbox {row.outbox}"
        line += _waiting(row)
        print(line)


def _waiting(row: UseCaseStatus) -> str:
    """What was recorded and is not sent yet: "today" counts only records charged when sent,
    so without this a value just recorded would not show at all."""
    parts = []
    if row.pending_records:
        parts.append(f"{row.pending_records} {'record' if row.pending_records == 1 else 'records'}")
    if row.open_counters:
        parts.append(f"{row.open_counters} running {'total' if row.open_counters == 1 else 'totals'}")
    return f"; recorded, not sent yet: {', '.join(parts)} (sent when the period ends)" if parts else ""


def _integer(value: Json) -> int:
    """A count in a reply (0 if it is not a number)."""
    return int(value) if isinstance(value, int | float) else 0


def _length(value: object) -> int:
    """How many records a ledger entry of a reply lists."""
    return len(value) if isinstance(value, list) else 0


def _objects(value: Json) -> list[Mapping[str, Json]]:
    """The JSON objects of a list in a reply.

    Raises:
        ConnectionError: the agent sent something else.
    """
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConnectionError("the agent sent a malformed reply")
    return [v for v in value if isinstance(v, Mapping)]


_END_DATE_NOTICES = ("expired on ", "renewed: ")
"""How the ledger's notices of an end date begin (agent.expiry.EXPIRED and RENEWED; named here so
that printing the ledger a daemon sent loads none of the state's modules)."""


def _print_ledger(entries: Sequence[Mapping[str, object]], notices: Sequence[Mapping[str, object]]) -> None:
    for n in notices:
        text = str(n["text"])
        what = "end date" if text.startswith(_END_DATE_NOTICES) else "registry change"
        print(f"{_when(n['at'])}  {n['use_case']}  {what}: {text}")
    if not entries:
        print("nothing has left this device")
        return
    for e in entries:
        print(
            f"{_when(e['sent'])}  {e['use_case']}  period {e['period']}  {_length(e['records'])} records"
            f"  ε {e['epsilon']:.4g} (day {e['epsilon_today']:.4g}, total {e['epsilon_total']:.4g})"
            f"  {e.get('status', 'sent')}{f' via {broker}' if (broker := e.get('broker')) else ''}"
        )
        print(f"    {json.dumps(e['records'])}")


def _print_record(use_case: str, reply: JsonObject) -> None:
    """Say what happened to a recorded value: kept for the period, sampled by the limit, or not added."""
    outcome = reply.get("outcome")
    if outcome == "duplicate":
        print(f"{use_case}: not added: this string is already recorded this period (one record per string)")
    elif outcome == "dropped":
        print(f"{use_case}: dropped: too many distinct strings this period", file=sys.stderr)
    elif reply.get("counter"):
        print(f"{use_case}: recorded: added to this period's total, privatized and sent once when the period ends")
    else:
        offered, limit, over = (_integer(reply.get(k, 0)) for k in ("offered", "limit", "over_limit"))
        if over:
            print(
                f"{use_case}: recorded, over the daily limit: {offered} values this period, at most {limit} "
                f"will be sent (a uniformly random sample of them), {over} dropped"
            )
        else:
            print(f"{use_case}: recorded: {offered} of at most {limit} values this period (the daily limit)")
    if reply.get("note"):
        print(f"{use_case}: {reply['note']}")


def _client_request(args: argparse.Namespace) -> JsonObject:
    if args.verb == "record":
        request: JsonObject = {"op": "record", "use_case": args.use_case, "text": args.value}
        if args.key is not None:
            request["key"] = args.key
        return request
    if args.verb == "consent":
        return {"op": "consent", "action": args.action}
    return {"op": args.verb}


def _print_consent(args: argparse.Namespace, reply: JsonObject, as_json: bool) -> None:
    if as_json:
        print(json.dumps(reply))
    elif args.action == "revoke":
        print(f"consent revoked; {reply['files_removed']} state files deleted")
    else:
        print(f"consent: {'granted ' + _when(reply['granted_at']) if reply['consent'] else 'not granted'}")


def _print_reply(args: argparse.Namespace, reply: JsonObject) -> None:
    as_json = getattr(args, "json", False)
    if args.verb == "record":
        _print_record(args.use_case, reply)
    elif args.verb == "consent":
        _print_consent(args, reply, as_json)
    elif args.verb == "ledger":
        entries = [e for e in _objects(reply["ledger"]) if args.use_case in (None, e["use_case"])]
        notices = [n for n in _objects(reply.get("notices", [])) if args.use_case in (None, n["use_case"])]
        if as_json:
            print(json.dumps(entries, indent=1))
        else:
            _print_ledger(entries, notices)
    elif args.verb == "status":
        if as_json:
            print(json.dumps(reply["status"], indent=1))
        else:
            _print_status(AgentStatus.from_json(reply["status"]))


def _client(cfg: AgentConfig, args: argparse.Namespace, clock: Clock) -> int:
    reply = _request(cfg, _client_request(args), clock)
    if not reply.get("ok"):
        kind = str(reply.get("error", "error"))
        print(f"ldp-agent: {reply.get('message', kind)}", file=sys.stderr)
        return EXIT_CODES.get(kind, 1)
    _print_reply(args, reply)
    return 0


def check_config(cfg: AgentConfig, environ: dict[str, str] | None = None, *, now: float | None = None) -> list[str]:
    """Check the registry and every file the config names; one line per file, then a warning per
    use case without an owner or an end date, or past its end date (at ``now``, default the time).

    Raises:
        ConfigError: naming the file and the field (the registry's own errors name the registry).
        PolicyError: the registry asks for more than the local policy allows.
    """
    from agent.opening import check_probes, load_registry  # noqa: PLC0415

    env = dict(os.environ) if environ is None else environ
    source = str(cfg.source or "<config>")
    registry = load_registry(cfg)
    check_probes(cfg, registry)
    lines = [f"registry.path: {cfg.registry.path}: {len(registry.use_cases)} use cases ({registry.hash_hex})"]
    lines += _check_broker(cfg)
    lines.append(_check_key(cfg, source, env))
    for field, path in (("state.directory", cfg.state.directory), ("api.socket", cfg.api.socket.parent)):
        existing = next((d for d in (path, *path.parents) if d.exists()), None)
        if existing is None or not existing.is_dir():
            raise ConfigError(source, field, f"{existing} is not a directory; {path} cannot be made")
    lines += _check_probes(cfg, source)
    # The same warnings as the collector's check-config (protocol/metadata.py); strict = true
    # in the registry turns the missing metadata into a refusal before this.
    moment = time.time() if now is None else now
    metadata = ((name, uc.metadata) for name, uc in registry.use_cases.items())
    lines += [f"warning: {line}" for line in metadata_warnings(metadata, now=moment)]
    return lines


def _check_broker(cfg: AgentConfig) -> list[str]:
    lines = []
    b = cfg.broker
    if tls_context(b) is not None:
        lines.append(f"broker.ca_file: {b.ca_file or 'the system trust store'}: CA certificates load")
        if b.cert_file is not None:
            lines.append(f"broker.cert_file: {b.cert_file}: the client certificate loads")
            lines.append(f"broker.key_file: {b.key_file}: its private key loads")
    if read_password(b) is not None:
        lines.append(f"broker.password_file: {b.password_file}: a password")
    return lines


def _check_key(cfg: AgentConfig, source: str, env: dict[str, str]) -> str:
    from agent.sealed import load_key  # noqa: PLC0415

    st = cfg.state
    if st.key_credential is not None and not env.get("CREDENTIALS_DIRECTORY"):
        return f"state.key_credential: {st.key_credential}: given by systemd at start (not checked here)"
    if st.key_file is not None and st.create_key and not st.key_file.exists():
        return f"state.key_file: {st.key_file}: missing; created at start (create_key = true)"
    field = "state.key_credential" if st.key_credential is not None else "state.key_file"
    try:
        load_key(key_file=st.key_file, key_credential=st.key_credential, environ=env)
    except KeyUnavailableError as e:
        raise ConfigError(source, field, str(e)) from None
    return f"{field}: {st.key_credential or st.key_file}: a 32-byte key, readable by this user only"


def check_state(cfg: AgentConfig, environ: dict[str, str] | None = None) -> str | None:
    """``check-config``'s last check: the state key opens the state already there (its consent
    record). None when there is nothing to open (no state yet, or a key only systemd gives).

    The daemon does not run it at start: there it keeps running and says why nothing is
    recorded (docs/agent-api.md, "A wrong state key"), while this command must not say "ok".

    Raises:
        StateUnreadableError: the consent record does not open with this key (exit status 6:
            the agent would record nothing and tell the user "not opted in").
    """
    from agent.sealed import Sealer, load_key  # noqa: PLC0415
    from agent.state import CONSENT_VERSION  # noqa: PLC0415
    from agent.statefiles import SUFFIX  # noqa: PLC0415

    env = dict(os.environ) if environ is None else environ
    st = cfg.state
    path = st.directory / ("consent" + SUFFIX)
    if not path.exists() or (st.key_credential is not None and not env.get("CREDENTIALS_DIRECTORY")):
        return None
    field = "state.key_credential" if st.key_credential is not None else "state.key_file"
    key = load_key(key_file=st.key_file, key_credential=st.key_credential, environ=env)
    try:
        Sealer(key).read(path, "consent", CONSENT_VERSION)
    except StateUnreadableError as e:
        raise StateUnreadableError(
            e.path,
            f"{e.reason}; {field} does not open the state in {st.directory}: use the key it was "
            "written with, or revoke consent to delete the state and start over",
        ) from None
    return f"state.directory: {st.directory}: the state key opens its consent record"


def _check_probes(cfg: AgentConfig, source: str) -> list[str]:
    lines = []
    for i, probe in enumerate(cfg.probes):
        if isinstance(probe, ActiveSecondsProbe) and probe.path is not None:
            if probe.path.exists():
                import tomllib  # noqa: PLC0415

                try:
                    tomllib.loads(_readable_text(source, f"probes[{i}].path", probe.path))
                except tomllib.TOMLDecodeError as e:
                    raise ConfigError(source, f"probes[{i}].path", f"{probe.path} is not TOML: {e}") from None
                lines.append(f"probes[{i}].path: {probe.path}: a TOML table of counters")
            else:
                lines.append(f"probes[{i}].path: {probe.path}: not there yet (its usage tracker writes it)")
    return lines


def _readable_text(source: str, field: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, field, f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _re_enrol(cfg: AgentConfig, clock: Clock) -> int:
    """``ldp-agent re-enrol``: only with the daemon stopped, so that no running agent keeps the old state."""
    from agent.daemon import StateLock, load_registry, open_agent  # noqa: PLC0415
    from agent.re_enrolment import NothingToReEnrolError  # noqa: PLC0415
    from protocol.randomness import SystemRandom  # noqa: PLC0415

    registry = load_registry(cfg)
    try:
        with StateLock(cfg.state.directory):
            agent = open_agent(cfg, registry, clock=clock, rng=SystemRandom())
            try:
                carried = agent.re_enrol()
            except NothingToReEnrolError as e:
                print(e)
                return ExitStatus.OK
            rows = {row.use_case: row for row in agent.use_case_status()}
    except AgentBusyError:
        raise AgentBusyError(
            f"an agent process holds {cfg.state.directory}: stop it first (systemctl stop ldp-agent), then re-enrol"
        ) from None
    for item in carried:
        row = rows.get(item.use_case)
        now = "not in the registry" if row is None else row.state
        print(f"{item.use_case}: re-enrolled, ε spent {item.epsilon_total:.4g} carried forward; now {now}")
    return ExitStatus.OK


def _run(cfg: AgentConfig, clock: Clock) -> int:
    import asyncio  # noqa: PLC0415 - the daemon's alone: the other verbs start faster without it

    from agent.daemon import run_daemon  # noqa: PLC0415

    check_config(cfg)  # fail fast at start-up, naming the file and the field
    try:
        asyncio.run(run_daemon(cfg, clock=clock))
    except BaseExceptionGroup as group:
        # A file the config names went away at run time (the CA at a reconnect): the task that
        # met it ended the daemon with the ConfigError naming it; say that, not a traceback.
        config_errors = expected_leaves(group, ConfigError)
        if config_errors is None:
            raise
        for leaf in config_errors:
            print(f"ldp-agent: {leaf}", file=sys.stderr)
        return ExitStatus.CONFIG
    return ExitStatus.OK


def _generate(args: argparse.Namespace) -> int:
    """``ldp-agent generate``: the code on stdout; a registry that cannot be read or written, status 2."""
    from agent.codegen import GenerateError  # noqa: PLC0415 - only this verb writes code
    from agent.generate import generate  # noqa: PLC0415
    from protocol.registry import RegistryError  # noqa: PLC0415
    from runtime.errors import SettingFileError  # noqa: PLC0415
    from runtime.registry_file import read_registry  # noqa: PLC0415

    try:
        code = generate(read_registry(args.registry), args.language)
    except (SettingFileError, RegistryError, GenerateError) as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return ExitStatus.CONFIG
    sys.stdout.write(code)
    return ExitStatus.OK


def run_verb(args: argparse.Namespace, clock: Clock) -> int:
    """Carry out the verb ``args`` names (parsed by :mod:`agent.cli`); its exit status."""
    if args.verb == "generate":
        return _generate(args)  # a developer's verb: no agent config on that machine
    path = args.config or Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        cfg = load_config(path)
    except ConfigError as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES["config"]
    _setup_logging(cfg.log.level if args.verb == "run" else "warning")
    try:
        return _dispatch(cfg, args, clock)
    except BrokenPipeError:
        raise  # the reader of stdout went away: quiet_on_closed_pipe ends it
    except Exception as exc:
        leaves = expected_leaves(exc, StateWriteError)
        if leaves is not None:
            # The daemon's tasks could not write state (a full disk): say which file and why,
            # without a traceback; the exit status lets systemd retry later.
            for leaf in leaves:
                logging.getLogger("ldp_agent").error("the agent stopped: %s", leaf)
            return EXIT_CODES["error"]
        # Unexpected: log the traceback and exit non-zero, so systemd restarts the service.
        logging.getLogger("ldp_agent").exception("the agent failed")
        return EXIT_CODES["error"]


# The errors a verb ends with, without a traceback, each with the kind its exit status is.
_VERB_ERROR_KINDS: tuple[tuple[type[Exception], str], ...] = (
    (ConfigError, "config"),
    (PolicyError, "config"),
    (ValueRefusedError, "value-refused"),
    (UseCaseStoppedError, "use-case-stopped"),
    (StateUnreadableError, "state-unreadable"),
    (KeyUnavailableError, "state-unreadable"),
    (StateWriteError, "error"),
    (AgentBusyError, "error"),
)
_VERB_ERRORS = tuple(t for t, _ in _VERB_ERROR_KINDS)


def _dispatch(cfg: AgentConfig, args: argparse.Namespace, clock: Clock) -> int:
    try:
        if args.verb == "check-config":
            for line in check_config(cfg, now=clock.time()):
                print(f"  {line}")
            opened = check_state(cfg)
            if opened is not None:
                print(f"  {opened}")
            print(f"{cfg.source}: ok; every file it names exists, is readable and parses")
            return ExitStatus.OK
        if args.verb == "re-enrol":
            return _re_enrol(cfg, clock)
        return _run(cfg, clock) if args.verb == "run" else _client(cfg, args, clock)
    except _VERB_ERRORS as e:
        print(f"ldp-agent: {e}", file=sys.stderr)
        return EXIT_CODES[next(kind for t, kind in _VERB_ERROR_KINDS if isinstance(e, t))]
