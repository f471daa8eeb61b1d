"""The collector's configuration: one TOML file decoded into frozen objects.

Every key is known: an unknown key, a wrong type or a value out of range stops start-up
with a :class:`~collector.errors.ConfigError` naming the file and the dotted field
(``collector.toml: mqtt.port: expected an integer in [1, 65535]; got 0``). Nothing falls
back silently. Relative paths are resolved against the config file's directory.

Schema (every section and key optional except ``registry``; defaults shown)::

    registry = "registry.toml"      # the current use-case registry (the one agents move to)
    earlier_registries = []         # earlier registry files agents in the field may still run
    instance = "collector"          # names this collector's rows in a shared store

    [retire]                        # definitions whose reports are refused from a UTC day on:
    # "homepage@9913d4c5" = 2026-12-15   a ref (name@hex, as check-config lists them), or
    # "homepage" = 2026-12-15            a use-case name: every definition of it

    [mqtt]
    host = "127.0.0.1"
    port = 1883
    addresses = []                  # several brokers: ["mqtt-a:8883", "mqtt-b:8883"] replaces host
                                    # and port; one session per broker, every other key shared
    client_id = "ldp-collector"     # fixed: the persistent session is keyed by it
    topic = "ldp/v1/reports/#"
    shared_group = ""               # "g" subscribes to $share/g/<topic> (MQTT 5)
    keepalive_s = 30
    session_expiry_s = 604800       # how long the broker keeps our queue while we are down
    receive_maximum = 20000         # unacknowledged QoS 1 messages the broker may send us
    max_packet_bytes = 1048576      # the broker drops larger messages before sending them
    buffer_bytes = 67108864         # stop reading the socket while this much payload is buffered
    username = ""
    password_file = ""
    reconnect_min_s = 0.05
    reconnect_max_s = 5.0
    receipt_prefix = "ldp/v1/receipts/"  # commit receipts go only to response topics under it
    [mqtt.tls]                      # present = TLS on
    ca_file = ""
    cert_file = ""
    key_file = ""

    [ingest]
    max_report_bytes = 65536        # larger payloads are rejected as "oversize"
    commit_max_reports = 4000       # also the shuffle buffer's bound
    commit_interval_s = 0.25
    retention_periods = 28          # report ids are remembered, and periods accepted, this far back
    future_periods = 1              # periods ahead of the clock still accepted (device clock skew)
    require_device_identity = false # refuse reports whose topic carries no device identity

    [store]
    path = "collector.sqlite3"      # SQLite, the embedded default; or instead:
    url = ""                        # "postgresql://USER@HOST:PORT/DB" (or "...?host=/socket/dir"):
                                    # PostgreSQL, shared by a group of collectors
    password_file = ""              # its password (never in the URL); default: the systemd
                                    # credential $CREDENTIALS_DIRECTORY/store-password if present
    compact_after = 64              # fold checkpoint deltas into the base after this many

    [http]
    enabled = true
    host = "127.0.0.1"
    port = 8650

    [estimation]
    workers = 1                     # threads computing estimates off the event loop
    memory_mib = 1024               # bound on the (use case, period) aggregates kept in memory
    confidence = 0.95               # level of the reported confidence intervals

The characters SFP discovery assembles words from are a use-case parameter
(``parameters.alphabet`` in the registry, which devices check their words against), not a
collector setting.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

from collector.errors import ConfigError
from protocol.registry import MAX_REPORT_BYTES
from protocol.schema import EMPTY_IS_NONE, Invalid, Range
from runtime.config import decode_config, load_config_file
from runtime.errors import ConfigFileError, SettingFileError
from runtime.secret_files import read_password as read_password_file

__all__ = [
    "MAX_BROKERS",
    "CollectorConfig",
    "EstimationConfig",
    "HttpConfig",
    "IngestConfig",
    "MqttConfig",
    "StoreConfig",
    "TlsConfig",
    "check_files",
    "load_config",
    "parse_config",
    "read_password",
    "read_store_password",
    "split_address",
]


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """TLS towards the broker. Empty paths mean the system trust store / no client certificate."""

    ca_file: Annotated[Path | None, EMPTY_IS_NONE] = None
    cert_file: Annotated[Path | None, EMPTY_IS_NONE] = None
    key_file: Annotated[Path | None, EMPTY_IS_NONE] = None
    source: str = field(default="<string>", metadata={"internal": True})
    """The config file these paths come from (for error messages; not a key of the file)."""

    def __post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise Invalid("key_file", "a key_file needs the cert_file it belongs to")


@dataclass(frozen=True, kw_only=True)
class MqttConfig:
    """Broker connection and subscription."""

    host: str = "127.0.0.1"
    port: Annotated[int, Range(1, 65535)] = 1883
    client_id: str = "ldp-collector"
    topic: str = "ldp/v1/reports/#"
    shared_group: Annotated[str | None, EMPTY_IS_NONE] = None
    keepalive_s: Annotated[int, Range(1, 65535)] = 30
    session_expiry_s: Annotated[int, Range(1, 0xFFFFFFFF)] = 604800
    receive_maximum: Annotated[int, Range(1, 65535)] = 20000
    max_packet_bytes: Annotated[int, Range(1024, 268435455)] = 1 << 20
    buffer_bytes: Annotated[int, Range(1 << 16, 1 << 34)] = 64 << 20
    username: Annotated[str | None, EMPTY_IS_NONE] = None
    password_file: Annotated[Path | None, EMPTY_IS_NONE] = None
    reconnect_min_s: Annotated[float, Range(0.001, 60.0)] = 0.05
    reconnect_max_s: Annotated[float, Range(0.001, 3600.0)] = 5.0
    receipt_prefix: str = "ldp/v1/receipts/"
    tls: TlsConfig | None = None
    addresses: tuple[str, ...] = ()
    """Several brokers as ``"host:port"`` (``"[::1]:1883"`` for IPv6), instead of ``host`` and
    ``port``: the collector holds one session on each, in the shared group on each, and every
    other key of the section applies to all of them (docs/deploy.md, "Several brokers")."""
    source: str = field(default="<string>", metadata={"internal": True})
    """The config file (for error messages; not a key of the file)."""

    def __post_init__(self) -> None:
        # Ranges are the decoder's (tests build out-of-range values on purpose); the rules
        # that need more than a range are checked here.
        for name, problem in (
            ("host", None if self.host else "expected a host name"),
            ("addresses", _addresses_problem(self)),
            ("client_id", _client_id_problem(self.client_id)),
            ("topic", _topic_problem(self.topic)),
            ("shared_group", None if self.shared_group is None else _group_problem(self.shared_group)),
            ("receipt_prefix", _receipt_prefix_problem(self.receipt_prefix)),
        ):
            if problem is not None:
                raise Invalid(name, problem)
        if self.reconnect_max_s < self.reconnect_min_s:
            problem = f"expected a number in [{self.reconnect_min_s:g}, 3600] (at least reconnect_min_s)"
            raise Invalid("reconnect_max_s", f"{problem}; got {self.reconnect_max_s!r}", kind="out-of-range")

    @property
    def brokers(self) -> tuple[MqttConfig, ...]:
        """One config per broker: ``addresses`` each with the rest of the section, or this one."""
        if not self.addresses:
            return (self,)
        places = map(split_address, self.addresses)
        return tuple(replace(self, host=host, port=port, addresses=()) for host, port in places)

    @property
    def topic_filter(self) -> str:
        """The filter actually subscribed: shared (``$share/<group>/...``) or plain."""
        return f"$share/{self.shared_group}/{self.topic}" if self.shared_group else self.topic


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """Validation, shuffling and commit batching."""

    max_report_bytes: Annotated[int, Range(64, 1 << 24)] = MAX_REPORT_BYTES
    commit_max_reports: Annotated[int, Range(1, 1 << 20)] = 4000
    commit_interval_s: Annotated[float, Range(0.0, 60.0, low_open=True)] = 0.25
    retention_periods: Annotated[int, Range(1, 100000)] = 28
    future_periods: Annotated[int, Range(0, 100)] = 1
    require_device_identity: bool = False
    """Refuse (``no-identity``) reports whose topic has no device level. Reports that carry
    one are held to the per-device allowance either way (docs/device-identity.md); a broker
    whose ACL admits only ``<prefix>/%u/<use_case>`` makes every report carry one."""


_DEFAULT_STORE = Path("collector.sqlite3")


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """The checkpoint database: a SQLite file (``path``) or a PostgreSQL database (``url``).

    Attributes:
        path: the SQLite file (unused when ``url`` is set).
        url: a libpq URL without password (``postgresql://USER@HOST:PORT/DB``), or None for SQLite.
        password_file: the PostgreSQL password's file, or None (then the systemd credential
            ``store-password`` if present, else none: trust, peer or ``~/.pgpass``).
        compact_after: segments of one key before they are folded into its base.
        check_interval_s: seconds between the running service's full checks of the store
            (structure and every checksum, report ids included, as at start); reads are
            checked after each read besides (``collector.live``).
    """

    path: Path = _DEFAULT_STORE
    url: Annotated[str | None, EMPTY_IS_NONE] = None
    password_file: Annotated[Path | None, EMPTY_IS_NONE] = None
    compact_after: Annotated[int, Range(1, 1 << 20)] = 64
    check_interval_s: Annotated[float, Range(1.0, 7 * 86400.0)] = 3600.0
    source: str = field(default="<string>", metadata={"internal": True})
    """The config file (for error messages; not a key of the file)."""

    def __post_init__(self) -> None:
        if self.url is not None:
            if (problem := _store_url_problem(self.url)) is not None:
                raise Invalid("url", problem)
            if self.path != _DEFAULT_STORE:
                raise Invalid("path", "give either path (SQLite) or url (PostgreSQL), not both")
        elif self.password_file is not None:
            raise Invalid("password_file", "only a PostgreSQL store (url) has a password")

    @property
    def location(self) -> str:
        """Where the store is, for logs and the status document (the URL holds no password)."""
        return self.url if self.url is not None else str(self.path)


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """The HTTP API, dashboard and metrics endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Annotated[int, Range(0, 65535)] = 8650

    def __post_init__(self) -> None:
        if not self.host:
            raise Invalid("host", "expected a host name")

    @property
    def exposure_warning(self) -> str | None:
        """What to say when the API listens beyond this machine: it has no authentication, so the
        README and docs/deploy.md ask for an authenticating reverse proxy in front of it."""
        if not self.enabled or self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127."):
            return None
        return (
            f"http.host = {self.host!r}: the HTTP API and dashboard have no authentication and are reachable "
            "beyond this machine; keep them on 127.0.0.1 behind an authenticating reverse proxy (docs/deploy.md)"
        )


@dataclass(frozen=True, kw_only=True)
class EstimationConfig:
    """Estimation off the event loop.

    Attributes:
        workers: threads computing estimates (numpy releases the GIL in the heavy parts, so a
            thread does not stall the event loop; 0 is taken as 1).
        memory_mib: the bound, in MiB of array memory, on the (use case, period) aggregates the
            HTTP API keeps materialised (least recently used first out). The default holds the
            current period of every use case of ``deploy/usecases.example.toml`` (about 433 MiB)
            twice over; an aggregate larger than the bound is read from the store per request.
    """

    # An alphabet is part of what an SFP use case discovers, so it moved to the registry.
    MOVED_KEYS: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "sfp_alphabet": "moved to the registry: set parameters.alphabet of each sfp use case "
            "(once collector.alphabet), and remove it here"
        }
    )

    workers: Annotated[int, Range(0, 64)] = 1
    memory_mib: Annotated[int, Range(0, 1 << 20)] = 1024
    confidence: Annotated[float, Range(0.5, 0.9999)] = 0.95


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    """The whole configuration."""

    registry: Path = field(metadata={"doc": "the path of the current use-case registry, a TOML file"})
    earlier_registries: tuple[Path, ...] = ()
    """Earlier registry files whose definitions agents in the field may still report under
    (``docs/deploy.md``, "Changing the registry on a running fleet")."""
    retire: Mapping[str, datetime.date] = field(default_factory=lambda: MappingProxyType({}))
    """Definition ref or use-case name -> the first UTC day whose periods are refused as retired."""
    instance: str = "collector"
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    estimation: EstimationConfig = field(default_factory=EstimationConfig)
    source: str = field(default="<string>", metadata={"internal": True})
    """The config file (for error messages; not a key of the file)."""

    def __post_init__(self) -> None:
        if not (self.instance and self.instance.isprintable() and len(self.instance) <= 200):
            raise Invalid("instance", "expected a short printable name")


MAX_BROKERS = 64
"""The most brokers ``mqtt.addresses`` may name (each is a session, a socket and a task)."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6 address]:port"``) as (host, port).

    Raises:
        ValueError: the text is not of that form or the port is not in [1, 65535].
    """
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        sep = ""  # an IPv6 address needs its brackets to be told from the port
    if not sep or not host or any(c.isspace() or c in "/[]" for c in host) or not port.isdigit():
        raise ValueError("expected 'host:port' such as 'mqtt-a.example:8883' ('[::1]:1883' for IPv6)")
    if not 1 <= int(port) <= 65535:
        raise ValueError("expected a port in [1, 65535]")
    return host, int(port)


def _addresses_problem(mqtt: MqttConfig) -> str | None:
    if not mqtt.addresses:
        return None
    if mqtt.host != "127.0.0.1" or mqtt.port != 1883:
        return f"give either host and port (one broker) or addresses (several), not both; got host {mqtt.host!r}"
    if len(mqtt.addresses) > MAX_BROKERS:
        return f"expected at most {MAX_BROKERS} brokers; got {len(mqtt.addresses)}"
    seen: dict[tuple[str, int], str] = {}
    for address in mqtt.addresses:
        try:
            where = split_address(address)
        except ValueError as exc:
            return f"{exc}; got {address!r}"
        if where in seen:
            return f"the same broker twice: {seen[where]!r} and {address!r}"
        seen[where] = address
    return None


def _topic_problem(value: str) -> str | None:
    levels = value.split("/")
    bad_hash = any("#" in lv and (lv != "#" or i != len(levels) - 1) for i, lv in enumerate(levels))
    bad_plus = any("+" in lv and lv != "+" for lv in levels)
    if not value or value.startswith("$") or bad_hash or bad_plus:
        return "expected a topic filter such as 'ldp/v1/reports/#' (no leading '$')"
    if not value.endswith("/#") or "+" in levels:
        # The levels below the prefix name the sender, to whom alone a commit receipt may go
        # (protocol/receipts.py, foreign_response_topic); a filter of another shape would hide it.
        return "expected '<prefix>/#' such as 'ldp/v1/reports/#': the levels below the prefix name the sender"
    return None


def _group_problem(value: str) -> str | None:
    if any(c in value for c in "/+#"):
        return "a shared-subscription group name cannot contain '/', '+' or '#'"
    return None


def _client_id_problem(value: str) -> str | None:
    if not value or len(value.encode()) > 65535:
        return "expected a non-empty client id"
    return None


def _store_url_problem(value: str) -> str | None:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres"):
        return "expected a PostgreSQL URL such as 'postgresql://collector@db.example:5432/ldp'"
    query = urllib.parse.parse_qs(parts.query)
    if parts.password is not None or "password" in query:
        # A config file is readable by more than the service; the password goes in a file of
        # its own (or a systemd credential) with its own permissions.
        return (
            "holds a password: remove it and put it in store.password_file (or the systemd credential store-password)"
        )
    return None


def _receipt_prefix_problem(value: str) -> str | None:
    # The broker ACL gives each connection read access to <prefix><client id> only; a prefix
    # with wildcards, or one not ending in "/", could not be matched by such a pattern.
    if not value.endswith("/") or value.startswith("$") or any(c in value for c in "+#\0"):
        return "expected a topic prefix ending in '/' such as 'ldp/v1/receipts/' (no wildcards, no leading '$')"
    return None


def parse_config(data: Mapping[str, Any], *, source: str = "<string>", base: Path | None = None) -> CollectorConfig:
    """Decode an already-parsed TOML document (:func:`protocol.schema.decode`, the reader every TOML file shares).

    Args:
        data: the TOML document as a mapping.
        source: the file name used in error messages.
        base: the directory relative paths are resolved against (default: the working directory).

    Raises:
        ConfigError: naming ``source`` and the field.
    """
    root = base or Path.cwd()
    try:
        cfg = decode_config(CollectorConfig, data, source=source, base=root)
    except ConfigFileError as exc:
        raise ConfigError(exc.path, exc.field, exc.problem) from None
    return _placed(cfg, source=source, base=root)


def _placed(cfg: CollectorConfig, *, source: str, base: Path) -> CollectorConfig:
    """``cfg`` with its source filled in and the default store path next to the config file."""
    tls = None if cfg.mqtt.tls is None else replace(cfg.mqtt.tls, source=source)
    store = cfg.store
    if store.url is None and not store.path.is_absolute():
        store = replace(store, path=base / store.path)
    store = replace(store, source=source)
    return replace(cfg, source=source, mqtt=replace(cfg.mqtt, tls=tls, source=source), store=store)


def read_password(mqtt: MqttConfig) -> bytes | None:
    """The broker password (``mqtt.password_file`` without its line end), or None without one.

    Raises:
        ConfigError: the file cannot be read, is readable by others, or holds no password.
    """
    if mqtt.password_file is None:
        return None
    try:
        return read_password_file(mqtt.password_file, setting="password_file")
    except SettingFileError as exc:
        raise ConfigError(mqtt.source, "mqtt.password_file", exc.problem) from None


STORE_CREDENTIAL = "store-password"
"""The systemd credential (``LoadCredential=store-password:...``) read when no password_file is set."""


def read_store_password(store: StoreConfig) -> str | None:
    """The PostgreSQL password: ``store.password_file``, else the systemd credential, else None.

    The file follows the rules of every secret file (``runtime.secret_files``: readable by its
    owner only, one line).

    Raises:
        ConfigError: the file cannot be read, is readable by others, or holds no password.
    """
    field = "store.password_file"
    path = store.password_file
    if path is None:
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if not credentials or not (Path(credentials) / STORE_CREDENTIAL).is_file():
            return None
        path = Path(credentials) / STORE_CREDENTIAL
        field = f"store.url (systemd credential {STORE_CREDENTIAL})"
    try:
        raw = read_password_file(path, setting=field)
    except SettingFileError as exc:
        raise ConfigError(store.source, field, exc.problem) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(store.source, field, f"{path} is not UTF-8 text") from None


def check_files(config: CollectorConfig) -> list[str]:
    """Check the files the config names that need no MQTT or registry code (password, store).

    Each must exist, be readable and parse: the password file; the store's directory must
    exist or be creatable. (The TLS files are checked by :func:`collector.mqtt.tls_context`,
    the registry and its dictionaries by ``ldp-collector check-config``.)

    Returns:
        One line per file checked, saying what it holds.

    Raises:
        ConfigError: naming the config file, the field and the file.
    """
    lines: list[str] = []
    if read_password(config.mqtt) is not None:
        lines.append(f"mqtt.password_file: {config.mqtt.password_file}: a password")
    if config.store.url is not None:
        if read_store_password(config.store) is not None:
            lines.append(f"store.password_file: {config.store.password_file or STORE_CREDENTIAL}: a password")
        return lines  # the database itself is checked by connecting (ldp-collector check-config)
    directory = config.store.path.parent
    existing = next((d for d in (directory, *directory.parents) if d.exists()), None)
    if existing is None or not existing.is_dir():
        problem = f"{existing} is not a directory; {config.store.path} cannot be made"
        raise ConfigError(config.source, "store.path", problem)
    if config.store.path.exists():
        if not os.access(config.store.path, os.R_OK | os.W_OK):
            raise ConfigError(config.source, "store.path", f"{config.store.path} is not readable and writable")
        lines.append(f"store.path: {config.store.path}: exists")
    else:
        lines.append(f"store.path: {config.store.path}: will be created")
    return lines


def load_config(path: str | Path) -> CollectorConfig:
    """Read and decode a collector config file.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or has a bad field.
    """
    p = Path(path)
    try:
        cfg = load_config_file(CollectorConfig, p)
    except ConfigFileError as exc:
        raise ConfigError(exc.path, exc.field, exc.problem) from None
    return _placed(cfg, source=str(p), base=p.resolve().parent)
