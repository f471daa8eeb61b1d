"""Errors of the collector, split by who is at fault.

* :class:`ConfigError` - the operator's configuration is wrong; start-up stops and the
  message names the file and the field.
* :class:`TransportError` - the broker connection failed in a way reconnecting cannot fix
  (refused credentials, a subscription the broker will not grant, a protocol violation).
  Transient network failures are not errors: the transport reconnects with backoff.
* :class:`StoreError` - the checkpoint database is unusable (wrong schema, another
  registry's aggregates, corruption). The collector stops rather than count into it.

Malformed reports are not collector errors: they are ``protocol.errors.MalformedReportError``,
counted by reason and acknowledged, never raised out of the ingest loop.
"""

from __future__ import annotations

__all__ = ["CollectorError", "ConfigError", "StoreError", "StoreUnavailable", "TransportError"]


class CollectorError(Exception):
    """Base class of every error raised by ``collector``."""


class ConfigError(CollectorError, ValueError):
    """A configuration file is invalid.

    Attributes:
        path: the file (or ``"<string>"``).
        field: the dotted path of the offending field (``"mqtt.port"``), or ``""``.
    """

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = path
        self.field = field
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + message)


class TransportError(CollectorError):
    """The broker refused us or broke the protocol; reconnecting will not help."""


class StoreError(CollectorError):
    """The checkpoint store cannot be used."""


class StoreDamaged(StoreError):  # noqa: N818 - a state of the store, like StoreUnavailable
    """The checkpoint store's bytes are not what was written (a failed integrity check or
    checksum): restoring a backup is the way out, so every tool exits 10 on it."""


class StoreUnavailable(StoreError):  # noqa: N818 - a state, like TimeoutError; it is an error subclass
    """The checkpoint store cannot take a commit *now*, for a cause that can go away.

    The disk is full, the database is locked by another process or read-only, an I/O error
    occurred, the file was removed or replaced under the running collector, or (PostgreSQL)
    the connection to the database server was lost or the server is restarting. Nothing of
    the failed transaction was stored; ingest keeps the batch unacknowledged, stops
    reading, reports itself unhealthy and retries with backoff (reconnecting).

    Attributes:
        cause: machine-readable: ``disk-full``, ``locked``, ``read-only``, ``io-error``,
            ``cannot-open``, ``vanished``, ``connection`` or ``resources``.
        path: the database file, or the PostgreSQL URL.
    """

    def __init__(self, cause: str, path: str, detail: str) -> None:
        self.cause = cause
        self.path = path
        super().__init__(f"{path}: {detail}")
