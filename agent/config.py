"""The agent's config file (TOML), decoded into frozen typed objects.

Decoding is strict: an unknown key, a missing required key, a value of the wrong type or
out of range stops start-up with a :class:`~agent.errors.ConfigError` naming the file and
the dotted field (``broker.port``, ``probes[1].use_case``); nothing falls back silently.
``deploy/agent.example.toml`` documents every key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from agent.brokers import BrokerAddress, parse_address
from agent.errors import ConfigError
from protocol.schema import Invalid, Range, check_ranges
from runtime.config import load_config_file, parse_config_text
from runtime.errors import ConfigFileError, SettingFileError
from runtime.secret_files import read_password as read_password_file

if TYPE_CHECKING:
    import ssl

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "ActiveSecondsProbe",
    "AgentConfig",
    "ApiConfig",
    "BrokerConfig",
    "LogConfig",
    "PolicyConfig",
    "ProbeConfig",
    "ProcessNamesProbe",
    "RegistryConfig",
    "ScheduleConfig",
    "StateConfig",
    "UptimeProbe",
    "load_config",
    "parse_config",
    "read_password",
    "tls_context",
]


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise Invalid(name, f"must be a positive number; got {value!r}")


_DEFAULT_PORT = 8883
"""MQTT over TLS."""


DEFAULT_TOPIC_PREFIX = "ldp/v1/reports"
"""Where reports go unless ``[broker] topic_prefix`` says otherwise (docs/wire-format.md)."""


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    """Where and how reports are published (MQTT over TLS, QoS 1).

    Either ``host`` (with ``port``) names the one broker, or ``addresses`` lists several;
    a device tries them in the order :func:`agent.brokers.broker_order` gives it, its primary
    first (agent.publisher says when it moves on and when it comes back).

    Attributes:
        host: broker host name or address (when ``addresses`` is not given).
        port: broker TCP port (8883 is MQTT over TLS), with ``host``.
        addresses: several brokers, each ``host:port`` (``[ipv6]:port``), instead of
            ``host`` and ``port``; every other key applies to each of them.
        tls: use TLS (turn off only for a loopback test broker).
        ca_file: CA bundle to verify the broker with (system trust store when omitted).
        cert_file: client certificate, for certificate authentication.
        key_file: the client certificate's private key.
        username: user name, for password authentication.
        password_file: file holding the password (read at the first connection and kept; readable
            by its owner only).
        keepalive: MQTT keepalive in seconds.
        publish_timeout: seconds to wait for the broker's PUBACK before giving up on a try.
        backoff_initial: first reconnect delay in seconds.
        backoff_max: cap of the (jittered, exponential) reconnect delay in seconds.
        topic_prefix: reports go to ``<topic_prefix>/<identity>/<use_case>``, the identity
            being ``username`` or the certificate's common name (agent.identity).
        receipts: keep each report until the collector's commit receipt says it was counted
            or refused (MQTT 5 request/response, ``protocol.receipts``); when False a broker
            PUBACK ends a report's journey (MQTT 3.1.1, for a collector without receipts).
        receipt_prefix: the response topic is ``<receipt_prefix><identity>/<client id>``
            (``protocol.receipts.receipt_topic``); the broker ACL lets only that connection read it.
        receipt_timeout_seconds: with no receipt this long after a send, the same bytes are
            sent again; the wait doubles per attempt (jittered) up to ``receipt_backoff_max``.
        receipt_backoff_max: cap of that wait in seconds.
    """

    host: str | None = None
    port: Annotated[int, Range(1, 65535)] = _DEFAULT_PORT
    addresses: tuple[str, ...] | None = None
    tls: bool = True
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    keepalive: Annotated[int, Range(5, 3600)] = 60
    publish_timeout: float = 30.0
    backoff_initial: float = 1.0
    backoff_max: float = 300.0
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    receipts: bool = True
    receipt_prefix: str = "ldp/v1/receipts/"
    receipt_timeout_seconds: float = 120.0
    receipt_backoff_max: float = 3600.0

    source: str = field(default="<config>", metadata={"internal": True})
    """The config file (for error messages; not a key of the file)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        self._check_brokers()
        if (self.cert_file is None) != (self.key_file is None):
            raise Invalid("key_file", "cert_file and key_file go together (client certificate authentication)")
        if self.password_file is not None and self.username is None:
            raise Invalid("username", "password_file needs a username")
        if self.cert_file is not None and not self.tls:
            raise Invalid("tls", "a client certificate needs tls = true")
        for name in ("publish_timeout", "backoff_initial", "backoff_max", "receipt_timeout_seconds"):
            _positive(name, getattr(self, name))
        if self.receipt_backoff_max < self.receipt_timeout_seconds:
            raise Invalid("receipt_backoff_max", "must be at least receipt_timeout_seconds")
        if (
            not self.receipt_prefix.endswith("/")
            or self.receipt_prefix.startswith("$")
            or any(c in self.receipt_prefix for c in "#+")
        ):
            raise Invalid("receipt_prefix", "must be a topic ending in '/' without wildcards or a leading '$'")
        if self.backoff_max < self.backoff_initial:
            raise Invalid("backoff_max", "must be at least backoff_initial")
        if not self.topic_prefix or "#" in self.topic_prefix or "+" in self.topic_prefix:
            raise Invalid("topic_prefix", "must be a non-empty topic without wildcards")

    def _check_brokers(self) -> None:
        if self.addresses is None:
            if self.host is None:
                raise Invalid("host", "is required but missing; add it (or list the brokers in addresses)")
            if not self.host:
                raise Invalid("host", "must not be empty")
            return
        if self.host is not None:
            raise Invalid("addresses", f"give either host (and port) or addresses, not both; host is {self.host!r}")
        if self.port != _DEFAULT_PORT:
            raise Invalid("port", f"goes with host; with addresses each address names its port; got {self.port}")
        if not self.addresses:
            raise Invalid("addresses", "must list at least one broker as host:port; got []")
        seen: dict[tuple[str, int], str] = {}
        for i, text in enumerate(self.addresses):
            try:
                address = parse_address(text)
            except ValueError as e:
                raise Invalid(f"addresses[{i}]", str(e)) from None
            key = (address.host.lower(), address.port)
            if key in seen:
                raise Invalid(f"addresses[{i}]", f"{text!r} is listed twice (as {seen[key]!r} before)")
            seen[key] = text

    @property
    def endpoints(self) -> tuple[BrokerAddress, ...]:
        """The brokers, as listed (``host`` and ``port`` make a list of one)."""
        if self.addresses is None:
            return (BrokerAddress(self.host or "", self.port),)
        return tuple(parse_address(a) for a in self.addresses)


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    """The use-case registry shared with the collector.

    Attributes:
        path: the registry TOML file.
    """

    path: Path


@dataclass(frozen=True, kw_only=True)
class StateConfig:
    """The encrypted state directory and its key.

    Exactly one of ``key_file`` and ``key_credential`` is given.

    Attributes:
        directory: where sealed state, outbox and ledger live (created with mode 0700).
        key_file: a file holding the 32-byte AES-256 key (raw or 64 hex digits), mode 0600.
        key_credential: the name of a systemd credential (``$CREDENTIALS_DIRECTORY/<name>``).
        create_key: create ``key_file`` (mode 0600, from the OS CSPRNG) when it is missing.
        ledger_retention_days: ledger entries older than this are pruned.
        outbox_max_reports: at most this many reports wait; the oldest are dropped beyond it.
        outbox_max_age_days: reports waiting longer than this are dropped (and counted).
    """

    directory: Path
    key_file: Path | None = None
    key_credential: str | None = None
    create_key: bool = False
    ledger_retention_days: int = 30
    outbox_max_reports: int = 10_000
    outbox_max_age_days: int = 14

    def __post_init__(self) -> None:
        if (self.key_file is None) == (self.key_credential is None):
            raise Invalid("key_file", "give exactly one of key_file and key_credential")
        if self.create_key and self.key_file is None:
            raise Invalid("create_key", "only a key_file can be created")
        if self.key_credential is not None and ("/" in self.key_credential or not self.key_credential):
            raise Invalid("key_credential", "must be a credential name, not a path")
        for name in ("ledger_retention_days", "outbox_max_reports", "outbox_max_age_days"):
            if getattr(self, name) < 1:
                raise Invalid(name, f"must be at least 1; got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class ApiConfig:
    """The local Unix-socket API applications record values through.

    Attributes:
        socket: path of the socket.
        socket_mode: its permission bits (the group may record values).
    """

    socket: Path
    socket_mode: int = 0o660

    def __post_init__(self) -> None:
        if not 0 <= self.socket_mode <= 0o777:
            raise Invalid("socket_mode", f"must be permission bits (0 to 0o777); got {self.socket_mode:o}")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """When collection cycles run.

    Attributes:
        interval_hours: cycles run at UTC multiples of this (6: 00, 06, 12, 18); divides 24.
        jitter_seconds: each cycle starts a uniformly random delay in ``[0, jitter)`` later.
        probe_interval_seconds: how often the counter probes sample between cycles.
    """

    interval_hours: int = 6
    jitter_seconds: float = 1800.0
    probe_interval_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.interval_hours not in (1, 2, 3, 4, 6, 8, 12, 24):
            raise Invalid("interval_hours", f"must divide 24; got {self.interval_hours}")
        if not (math.isfinite(self.jitter_seconds) and 0 <= self.jitter_seconds < self.interval_hours * 3600):
            raise Invalid("jitter_seconds", "must be in [0, interval)")
        _positive("probe_interval_seconds", self.probe_interval_seconds)


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The device owner's local caps: a registry asking for more is refused.

    Attributes:
        max_epsilon_report: largest ε one report may cost.
        max_epsilon_lifetime: largest lifetime ε cap a use case may ask for.
        max_daily_limit: largest daily record limit a use case may ask for.
        min_period_hours: shortest collection period a use case may ask for.
        min_rappor_f: smallest RAPPOR permanent-randomization probability ``f``.
        max_rappor_epsilon_infinity: largest RAPPOR longitudinal ε∞.
        max_one_bit_mean_epsilon: largest ε of 1BitMean's memoized bits.
    """

    max_epsilon_report: float = 8.0
    max_epsilon_lifetime: float = 100_000.0
    max_daily_limit: int = 1_000
    min_period_hours: float = 6.0
    min_rappor_f: float = 0.25
    max_rappor_epsilon_infinity: float = 10.0
    max_one_bit_mean_epsilon: float = 4.0

    def __post_init__(self) -> None:
        for name in (
            "max_epsilon_report",
            "max_epsilon_lifetime",
            "min_period_hours",
            "max_rappor_epsilon_infinity",
            "max_one_bit_mean_epsilon",
        ):
            _positive(name, getattr(self, name))
        if self.max_daily_limit < 1:
            raise Invalid("max_daily_limit", "must be at least 1")
        if not 0 <= self.min_rappor_f <= 1:
            raise Invalid("min_rappor_f", "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class UptimeProbe:
    """Seconds the host was up, accrued into a counter use case.

    Attributes:
        use_case: the counter use case the seconds go to.
    """

    kind: ClassVar[str] = "uptime"
    use_case: str


@dataclass(frozen=True, kw_only=True)
class ProcessNamesProbe:
    """Names of the running processes (``/proc/<pid>/comm``), each once per cycle.

    Attributes:
        use_case: the string use case the names go to.
        max_names: at most this many distinct names per sample (a bound on work).
    """

    kind: ClassVar[str] = "process-names"
    use_case: str
    max_names: int = 512

    def __post_init__(self) -> None:
        if self.max_names < 1:
            raise Invalid("max_names", "must be at least 1")


@dataclass(frozen=True, kw_only=True)
class ActiveSecondsProbe:
    """Active seconds per application or per systemd unit, accrued into counter use cases.

    Attributes:
        source: ``"systemd"`` - a unit counts as active while its cgroup is populated
            (``<cgroup_root>/<unit>/cgroup.events``); ``"file"`` - ``path`` is a TOML
            file ``{name = cumulative_seconds}`` kept by a usage tracker, read as deltas.
        targets: unit or application name -> counter use case.
        path: the counter file (``source = "file"``).
        cgroup_root: where unit cgroups live (``source = "systemd"``).
    """

    kind: ClassVar[str] = "active-seconds"
    source: Literal["systemd", "file"]
    targets: Mapping[str, str]
    path: Path | None = None
    cgroup_root: Path = Path("/sys/fs/cgroup/system.slice")

    def __post_init__(self) -> None:
        if not self.targets:
            raise Invalid("targets", "name at least one unit or application")
        if (self.source == "file") != (self.path is not None):
            raise Invalid("path", 'source = "file" needs a path (and only it takes one)')


ProbeConfig = UptimeProbe | ProcessNamesProbe | ActiveSecondsProbe


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """Logging.

    Attributes:
        level: minimum level written to stderr (the journal under systemd).
    """

    level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """The whole config file."""

    broker: BrokerConfig
    registry: RegistryConfig
    state: StateConfig
    api: ApiConfig
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    probes: tuple[ProbeConfig, ...] = ()
    log: LogConfig = field(default_factory=LogConfig)
    source: Path | None = field(default=None, metadata={"internal": True})
    """The file this config was read from (not a key of the file)."""

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for probe in self.probes:
            # Several targets of one active-seconds probe may share a use case (one counter key each).
            names = set(probe.targets.values()) if isinstance(probe, ActiveSecondsProbe) else {probe.use_case}
            for name in sorted(names):
                if name in seen:
                    raise Invalid("probes", f"use case {name!r} is fed by two probes")
                seen.add(name)


# ----------------------------------------------------------------------------- decoding


def parse_config(text: str, *, path: str = "<config>", base: Path | None = None) -> AgentConfig:
    """Decode config text (:func:`protocol.schema.decode`, the reader every TOML file shares).

    Args:
        text: TOML text.
        path: the file name used in error messages.
        base: directory relative paths are resolved against (default: the current one).

    Raises:
        ConfigError: naming ``path`` and the field.
    """
    try:
        return parse_config_text(AgentConfig, text, source=path, base=base or Path.cwd())
    except ConfigFileError as e:
        raise ConfigError(e.path, e.field, e.problem) from None


def load_config(path: Path) -> AgentConfig:
    """Read and decode a config file.

    Raises:
        ConfigError: if the file cannot be read or does not decode.
    """
    try:
        cfg = load_config_file(AgentConfig, path)
    except ConfigFileError as e:
        raise ConfigError(e.path, e.field, e.problem) from None
    return replace(cfg, source=path, broker=replace(cfg.broker, source=str(path)))


def tls_context(broker: BrokerConfig) -> ssl.SSLContext | None:
    """The TLS context of the broker connection, from the files ``[broker]`` names (None without TLS).

    Built at the first connection and kept for every later one (``agent.mqtt``), so a
    reconnect opens no file; a file gone or broken by then stops the agent with the same
    message ``check-config`` gives, and one that cannot be read for want of a system resource
    (``EMFILE``, ...) raises :class:`runtime.resources.ResourceShortageError`, retried.

    Raises:
        ConfigError: naming the config file, the field (``broker.ca_file``, ...) and the file.
    """
    if not broker.tls:
        return None
    from runtime.tls import client_context  # noqa: PLC0415 - only a TLS connection needs it

    try:
        return client_context(ca_file=broker.ca_file, cert_file=broker.cert_file, key_file=broker.key_file)
    except SettingFileError as e:
        raise ConfigError(broker.source, f"broker.{e.setting}", e.problem) from None


def read_password(broker: BrokerConfig) -> str | None:
    """The broker password (``password_file`` without its line end), or None without one.

    Raises:
        ConfigError: the file cannot be read, is readable by others, is empty or not UTF-8.
    """
    if broker.password_file is None:
        return None
    try:
        data = read_password_file(broker.password_file, setting="password_file")
    except SettingFileError as e:
        raise ConfigError(broker.source, "broker.password_file", e.problem) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(broker.source, "broker.password_file", f"{broker.password_file} is not UTF-8") from None
