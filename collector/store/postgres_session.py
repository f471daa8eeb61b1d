"""Connections to the PostgreSQL store: opening one, what a failure means, and check-config's probe.

A failure that can pass (the server restarting, a lost connection, a full disk, a lock not
granted in time) becomes :class:`~collector.errors.StoreUnavailable` with a cause; ingest
stops acknowledging and retries, and the next attempt opens a new connection. Anything else
is a :class:`~collector.errors.StoreError` and stops the collector.
"""

from __future__ import annotations

from typing import Any

import psycopg

from collector.config import StoreConfig, read_store_password
from collector.errors import ConfigError, StoreUnavailable
from collector.store.postgres_schema import SCHEMA_VERSION
from protocol.catalog import Catalog

__all__ = ["DDL_LOCK_TIMEOUT", "connect", "probe", "unavailable"]

LOCK_TIMEOUT = "60s"
"""How long a statement waits for a lock before the attempt fails as ``locked`` (and is retried)."""
DDL_LOCK_TIMEOUT = "5s"
"""The same for creating and dropping partitions, which lock their parent table: rather than
queue every commit behind a long reader of the parent (a member verifying at start), give up
and try again at the next attempt."""
IDLE_IN_TRANSACTION = "30s"
"""The server ends a session idle inside a transaction after this long. A member whose host
vanished mid-transaction would otherwise hold its locks (a use case row, report ids, the
clock) until the server's TCP keepalive gave up, hours later; no transaction here waits on
its client for more than a moment."""

# SQLSTATE codes and classes of failures that can pass, and the cause they are reported as.
_TRANSIENT_STATES: dict[str, tuple[str, str]] = {
    "53100": ("disk-full", "the database server's disk is full; free space on its file system"),
    "25006": ("read-only", "the database server accepts no writes (a standby, or default_transaction_read_only)"),
    "40001": ("locked", "a serialization failure"),
    "40P01": ("locked", "a deadlock with another transaction"),
    "55P03": ("locked", "a lock could not be taken in time (lock_timeout)"),
    "57014": ("locked", "the statement was cancelled (statement_timeout or an operator)"),
    "58030": ("io-error", "the database server reports an I/O error; check its disk"),
}
_TRANSIENT_CLASSES: dict[str, tuple[str, str]] = {
    "08": ("connection", "the connection to the database server failed"),
    "57": ("connection", "the database server is shutting down or restarting"),
    "53": ("resources", "the database server is out of a resource (memory, connections)"),
}


def connect(url: str, *, password: str | None, instance: str, readonly: bool) -> psycopg.Connection[Any]:
    """A new autocommit connection with the session settings every store connection has.

    Raises:
        psycopg.Error: the server cannot be reached or refuses us (see :func:`unavailable`).
    """
    # Any: psycopg.connect's keyword arguments, of several types.
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": 10,
        "application_name": f"ldp-collector {instance}"[:63],
        # A peer that vanished without closing (a host down, a partition) is noticed within
        # 10 + 3 x 5 = 25 s of silence, not after the kernel's default of two hours.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    if password is not None:
        kwargs["password"] = password
    conn = psycopg.connect(url, **kwargs)
    try:
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'")
        if readonly:
            conn.execute("SET default_transaction_read_only = on")
    except BaseException:
        conn.close()
        raise
    return conn


_PASSWORD_SOURCES = (
    "the password comes from store.password_file, the systemd credential store-password, "
    "or, for commands run by hand, libpq's ~/.pgpass"
)


def _refused_credentials(message: str) -> bool:
    """Whether libpq's message says the server refused our password or we sent none.

    libpq reports these at connect time without a SQLSTATE; they are not a network fault.
    """
    return "no password supplied" in message or "authentication failed" in message


def unavailable(exc: psycopg.Error, location: str) -> StoreUnavailable | None:
    """The StoreUnavailable for a failure that can pass, or None for one that cannot."""
    state = exc.sqlstate or ""
    known = _TRANSIENT_STATES.get(state) or _TRANSIENT_CLASSES.get(state[:2])
    message = str(exc)
    if known is None and isinstance(exc, psycopg.OperationalError) and not state:
        if _refused_credentials(message):
            known = ("authentication", f"the database server refused our credentials ({_PASSWORD_SOURCES})")
        else:
            known = ("connection", "the database server cannot be reached")
    if known is None and isinstance(exc, psycopg.InterfaceError):
        known = ("connection", "the connection to the database server is unusable")
    if known is None:
        return None
    cause, text = known
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnavailable(cause, location, f"{text}: {detail}")


def probe(config: StoreConfig, catalog: Catalog) -> str:
    """``ldp-collector check-config``'s line for a PostgreSQL store: reachable, and its schema.

    Raises:
        ConfigError: the server cannot be reached, refuses us, or holds a newer schema.
    """
    del catalog  # the use cases are registered by the first collector that opens the store for writing
    field = "store.url"
    password = read_store_password(config)
    assert config.url is not None
    try:
        with psycopg.connect(config.url, connect_timeout=10, password=password) as conn:
            version = conn.info.server_version
            found: int | None = None
            if conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone() == (True,):
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
                found = int(bytes(row[0]).decode()) if row is not None else -1
    except psycopg.Error as exc:
        problem = f"cannot use {config.url}: {str(exc).strip()}"
        if password is None and _refused_credentials(problem):
            # The commands an operator runs by hand do not get the service's systemd credential.
            problem += f"; no password was given ({_PASSWORD_SOURCES})"
        raise ConfigError(config.source, field, problem) from exc
    server = f"PostgreSQL {version // 10000}.{version % 10000}"
    if found is None:
        return f"{field}: {config.url}: {server}; the checkpoint schema {SCHEMA_VERSION} will be created"
    if found > SCHEMA_VERSION:
        raise ConfigError(
            config.source,
            field,
            f"{config.url} has checkpoint schema {found}, newer than the {SCHEMA_VERSION} this collector knows",
        )
    if found < 0:
        raise ConfigError(config.source, field, f"{config.url} has a table meta without a checkpoint schema version")
    return f"{field}: {config.url}: {server}, checkpoint schema {found}"
