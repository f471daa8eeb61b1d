"""The collector's configuration: one TOML file decoded into frozen objects.

Every key is known: an unknown key, a wrong type or a value out of range stops start-up
with a :class:`~collector.errors.ConfigError` naming the file and the dotted field
(``collector.toml: mqtt.port: expected an integer in [1, 65535], got 0``). Nothing falls
back silently. Relative paths are resolved against the config file's directory.

Schema (every section and key optional except ``registry``; defaults shown)::

    registry = "registry.toml"      # the use-case registry the agents use (same file)
    instance = "collector"          # names this collector's rows in a shared store

    [mqtt]
    host = "127.0.0.1"
    port = 1883
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
    path = "collector.sqlite3"
    compact_after = 64              # fold checkpoint deltas into the base after this many

    [http]
    enabled = true
    host = "127.0.0.1"
    port = 8650

    [estimation]
    workers = 1                     # threads computing estimates off the event loop
    memory_mib = 1024               # bound on the (use case, period) aggregates kept in memory
    confidence = 0.95               # level of the reported confidence intervals

The characters SFP discovery assembles words from are a use-case setting
(``collector.alphabet`` in the registry), not a collector one.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from collector.errors import ConfigError
from protocol.registry import MAX_REPORT_BYTES
from runtime.errors import SettingFileError
from runtime.secret_files import read_password as read_password_file

__all__ = [
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
]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """TLS towards the broker. Empty paths mean the system trust store / no client certificate."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    source: str = "<string>"
    """The config file these paths come from (for error messages; not a key of the file)."""


@dataclass(frozen=True, kw_only=True)
class MqttConfig:
    """Broker connection and subscription."""

    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str = "ldp-collector"
    topic: str = "ldp/v1/reports/#"
    shared_group: str | None = None
    keepalive_s: int = 30
    session_expiry_s: int = 604800
    receive_maximum: int = 20000
    max_packet_bytes: int = 1 << 20
    buffer_bytes: int = 64 << 20
    username: str | None = None
    password_file: Path | None = None
    reconnect_min_s: float = 0.05
    reconnect_max_s: float = 5.0
    receipt_prefix: str = "ldp/v1/receipts/"
    tls: TlsConfig | None = None
    source: str = "<string>"
    """The config file (for error messages; not a key of the file)."""

    @property
    def topic_filter(self) -> str:
        """The filter actually subscribed: shared (``$share/<group>/...``) or plain."""
        return f"$share/{self.shared_group}/{self.topic}" if self.shared_group else self.topic


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """Validation, shuffling and commit batching."""

    max_report_bytes: int = MAX_REPORT_BYTES
    commit_max_reports: int = 4000
    commit_interval_s: float = 0.25
    retention_periods: int = 28
    future_periods: int = 1
    require_device_identity: bool = False
    """Refuse (``no-identity``) reports whose topic has no device level. Reports that carry
    one are held to the per-device allowance either way (docs/device-identity.md); a broker
    whose ACL admits only ``<prefix>/%u/<use_case>`` makes every report carry one."""


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """The checkpoint database."""

    path: Path = Path("collector.sqlite3")
    compact_after: int = 64


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """The HTTP API, dashboard and metrics endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8650


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

    workers: int = 1
    memory_mib: int = 1024
    confidence: float = 0.95


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    """The whole configuration."""

    source: str
    registry: Path
    instance: str = "collector"
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    estimation: EstimationConfig = field(default_factory=EstimationConfig)


class _Section:
    """Typed, exhaustive reading of one TOML table: every key must be consumed."""

    def __init__(self, data: object, *, source: str, prefix: str, base: Path) -> None:
        if not isinstance(data, dict):
            raise ConfigError(source, prefix.rstrip("."), f"expected a table, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.source = source
        self.prefix = prefix
        self.base = base
        self.used: set[str] = set()

    def _fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.prefix + key, message)

    def _get(self, key: str, default: T, kind: type | tuple[type, ...], expected: str) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) and kind is not bool:
            raise self._fail(key, f"expected {expected}, got a boolean")
        if not isinstance(value, kind):
            raise self._fail(key, f"expected {expected}, got {type(value).__name__} {value!r}")
        return value

    def integer(self, key: str, default: int, *, low: int, high: int) -> int:
        expected = f"an integer in [{low}, {high}]"
        value: int = self._get(key, default, int, expected)
        if not low <= value <= high:
            raise self._fail(key, f"expected {expected}, got {value}")
        return value

    def number(self, key: str, default: float, *, low: float, high: float, open_low: bool = False) -> float:
        lo = "(" if open_low else "["
        expected = f"a number in {lo}{low:g}, {high:g}]"
        value = float(self._get(key, default, (int, float), expected))
        if not math.isfinite(value) or value > high or value < low or (open_low and value == low):
            raise self._fail(key, f"expected {expected}, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, default, bool, "true or false")
        return value

    def string(self, key: str, default: str, *, check: Callable[[str], str | None] | None = None) -> str:
        value: str = self._get(key, default, str, "a string")
        if check is not None and (problem := check(value)) is not None:
            raise self._fail(key, problem)
        return value

    def optional_string(self, key: str) -> str | None:
        value = self.string(key, "")
        return value or None

    def path(self, key: str, default: Path | None) -> Path | None:
        raw = self.string(key, "" if default is None else str(default))
        if not raw:
            return None
        p = Path(raw).expanduser()
        return p if p.is_absolute() else self.base / p

    def table(self, key: str) -> _Section | None:
        self.used.add(key)
        if key not in self.data:
            return None
        return _Section(self.data[key], source=self.source, prefix=f"{self.prefix}{key}.", base=self.base)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self._fail(unknown[0], f"unknown key (known: {', '.join(sorted(self.used))})")


def _topic_problem(value: str) -> str | None:
    levels = value.split("/")
    bad_hash = any("#" in lv and (lv != "#" or i != len(levels) - 1) for i, lv in enumerate(levels))
    bad_plus = any("+" in lv and lv != "+" for lv in levels)
    if not value or value.startswith("$") or bad_hash or bad_plus:
        return "expected a topic filter such as 'ldp/v1/reports/#' (no leading '$')"
    return None


def _group_problem(value: str) -> str | None:
    if any(c in value for c in "/+#"):
        return "a shared-subscription group name cannot contain '/', '+' or '#'"
    return None


def _client_id_problem(value: str) -> str | None:
    if not value or len(value.encode()) > 65535:
        return "expected a non-empty client id"
    return None


def _receipt_prefix_problem(value: str) -> str | None:
    # The broker ACL gives each connection read access to <prefix><client id> only; a prefix
    # with wildcards, or one not ending in "/", could not be matched by such a pattern.
    if not value.endswith("/") or value.startswith("$") or any(c in value for c in "+#\0"):
        return "expected a topic prefix ending in '/' such as 'ldp/v1/receipts/' (no wildcards, no leading '$')"
    return None


def _mqtt(section: _Section | None) -> MqttConfig:
    if section is None:
        return MqttConfig()
    d = MqttConfig()
    tls_section = section.table("tls")
    tls = None
    if tls_section is not None:
        tls = TlsConfig(
            ca_file=tls_section.path("ca_file", None),
            cert_file=tls_section.path("cert_file", None),
            key_file=tls_section.path("key_file", None),
            source=section.source,
        )
        if tls.key_file is not None and tls.cert_file is None:
            raise ConfigError(section.source, "mqtt.tls.key_file", "a key_file needs the cert_file it belongs to")
        tls_section.finish()
    low = section.number("reconnect_min_s", d.reconnect_min_s, low=0.001, high=60.0)
    cfg = MqttConfig(
        host=section.string("host", d.host, check=lambda v: None if v else "expected a host name"),
        port=section.integer("port", d.port, low=1, high=65535),
        client_id=section.string("client_id", d.client_id, check=_client_id_problem),
        topic=section.string("topic", d.topic, check=_topic_problem),
        shared_group=section.optional_string("shared_group"),
        keepalive_s=section.integer("keepalive_s", d.keepalive_s, low=1, high=65535),
        session_expiry_s=section.integer("session_expiry_s", d.session_expiry_s, low=1, high=0xFFFFFFFF),
        receive_maximum=section.integer("receive_maximum", d.receive_maximum, low=1, high=65535),
        max_packet_bytes=section.integer("max_packet_bytes", d.max_packet_bytes, low=1024, high=268435455),
        buffer_bytes=section.integer("buffer_bytes", d.buffer_bytes, low=1 << 16, high=1 << 34),
        username=section.optional_string("username"),
        password_file=section.path("password_file", None),
        reconnect_min_s=low,
        reconnect_max_s=section.number("reconnect_max_s", d.reconnect_max_s, low=low, high=3600.0),
        receipt_prefix=section.string("receipt_prefix", d.receipt_prefix, check=_receipt_prefix_problem),
        tls=tls,
        source=section.source,
    )
    if cfg.shared_group is not None and (problem := _group_problem(cfg.shared_group)):
        raise ConfigError(section.source, section.prefix + "shared_group", problem)
    section.finish()
    return cfg


def _ingest(section: _Section | None) -> IngestConfig:
    if section is None:
        return IngestConfig()
    d = IngestConfig()
    cfg = IngestConfig(
        max_report_bytes=section.integer("max_report_bytes", d.max_report_bytes, low=64, high=1 << 24),
        commit_max_reports=section.integer("commit_max_reports", d.commit_max_reports, low=1, high=1 << 20),
        commit_interval_s=section.number("commit_interval_s", d.commit_interval_s, low=0.0, high=60.0, open_low=True),
        retention_periods=section.integer("retention_periods", d.retention_periods, low=1, high=100000),
        future_periods=section.integer("future_periods", d.future_periods, low=0, high=100),
        require_device_identity=section.boolean("require_device_identity", d.require_device_identity),
    )
    section.finish()
    return cfg


def _store(section: _Section | None, base: Path) -> StoreConfig:
    if section is None:
        return StoreConfig(path=base / StoreConfig().path)
    path = section.path("path", StoreConfig().path)
    if path is None:
        raise ConfigError(section.source, section.prefix + "path", "expected a file path")
    cfg = StoreConfig(path=path, compact_after=section.integer("compact_after", 64, low=1, high=1 << 20))
    section.finish()
    return cfg


def _http(section: _Section | None) -> HttpConfig:
    if section is None:
        return HttpConfig()
    d = HttpConfig()
    cfg = HttpConfig(
        enabled=section.boolean("enabled", d.enabled),
        host=section.string("host", d.host, check=lambda v: None if v else "expected a host name"),
        port=section.integer("port", d.port, low=0, high=65535),
    )
    section.finish()
    return cfg


def _estimation(section: _Section | None) -> EstimationConfig:
    if section is None:
        return EstimationConfig()
    d = EstimationConfig()
    if "sfp_alphabet" in section.data:
        # An alphabet is part of what an SFP use case discovers, so it moved to the registry.
        raise section._fail(
            "sfp_alphabet", "moved to the registry: set collector.alphabet of each sfp use case, and remove it here"
        )
    cfg = EstimationConfig(
        workers=section.integer("workers", d.workers, low=0, high=64),
        memory_mib=section.integer("memory_mib", d.memory_mib, low=0, high=1 << 20),
        confidence=section.number("confidence", d.confidence, low=0.5, high=0.9999),
    )
    section.finish()
    return cfg


def parse_config(data: Mapping[str, Any], *, source: str = "<string>", base: Path | None = None) -> CollectorConfig:
    """Decode an already-parsed TOML document.

    Args:
        data: the TOML document as a mapping.
        source: the file name used in error messages.
        base: the directory relative paths are resolved against (default: the working directory).

    Raises:
        ConfigError: naming ``source`` and the field.
    """
    root = _Section(dict(data), source=source, prefix="", base=base or Path.cwd())
    registry = root.path("registry", None)
    if registry is None:
        raise ConfigError(source, "registry", "required: the path of the use-case registry (TOML)")
    cfg = CollectorConfig(
        source=source,
        registry=registry,
        instance=root.string(
            "instance",
            "collector",
            check=lambda v: None if v and v.isprintable() and len(v) <= 200 else "expected a short printable name",
        ),
        mqtt=_mqtt(root.table("mqtt")),
        ingest=_ingest(root.table("ingest")),
        store=_store(root.table("store"), root.base),
        http=_http(root.table("http")),
        estimation=_estimation(root.table("estimation")),
    )
    root.finish()
    return cfg


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
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), "", f"cannot read the file: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), "", f"not valid TOML: {exc}") from exc
    return parse_config(data, source=str(p), base=p.resolve().parent)
