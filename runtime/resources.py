"""A system resource that ran out, told apart from a configuration the operator must fix.

A daemon under a flood of connections, or on a machine short of memory, can fail to open a
file, a socket or a TLS context with ``EMFILE`` (its open-file limit reached), ``ENFILE`` (the
system's file table full), ``ENOMEM`` or ``ENOBUFS``. Nothing in its configuration is wrong,
and the same operation succeeds once the flood has passed: it is retried with the caller's
backoff (:mod:`runtime.backoff`), counted, and logged once, never reported as a bad setting
(docs/deploy.md, "Monitoring and the dashboard"). A file that is missing, unreadable by
permission or malformed stays the operator's to fix (:class:`runtime.errors.SettingFileError`).

* :func:`resource_shortage` says whether an exception, or one it was raised from or while
  handling, is such a failure, and names its errno;
* :class:`ResourceShortageError` is what :mod:`runtime.tls` and :mod:`runtime.secret_files`
  raise in place of a ``SettingFileError`` when a file could not be read for want of a
  resource;
* :class:`ResourceErrors` counts them per operation and errno and logs the first of each run
  of failures, and the recovery, once.
"""

from __future__ import annotations

import errno
import logging
from collections import Counter

__all__ = ["RESOURCE_ERRNOS", "ResourceErrors", "ResourceShortageError", "resource_shortage"]

RESOURCE_ERRNOS = {
    errno.EMFILE: "EMFILE",
    errno.ENFILE: "ENFILE",
    errno.ENOMEM: "ENOMEM",
    errno.ENOBUFS: "ENOBUFS",
}
"""The errnos of a resource that ran out (the ones asyncio also retries an ``accept`` on), by name."""


class ResourceShortageError(OSError):
    """Opening ``what`` failed for want of a system resource: transient, retried, not a setting at fault.

    Args:
        what: what was being opened, naming the file where there is one.
        cause: the ``OSError`` whose errno is one of :data:`RESOURCE_ERRNOS`.
    """

    def __init__(self, what: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"{what}: {cause.strerror or cause}")
        self.what = what


def resource_shortage(exc: BaseException) -> str | None:
    """The errno's name (``"EMFILE"``) if ``exc``, or an exception it was raised from or while
    handling, failed for want of a system resource; None otherwise.

    The chain is followed because libraries wrap the ``OSError`` (aiomqtt raises its own error
    ``from None``, which still keeps the original as the context).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in RESOURCE_ERRNOS:
            return RESOURCE_ERRNOS[current.errno]
        current = current.__cause__ or current.__context__
    return None


class ResourceErrors:
    """Resource shortages per operation: counted, the first of each run logged, and its end.

    One object per daemon; the collector exports :attr:`counts` as
    ``ldp_collector_resource_errors_total{operation,errno}``.

    Args:
        logger: where the two lines of each run go.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self.counts: Counter[tuple[str, str]] = Counter()
        self._failing: dict[str, int] = {}

    def failed(self, operation: str, exc: BaseException) -> bool:
        """Count ``exc`` if it is a resource shortage (True), logging the first of a run; False
        for any other error, which the caller handles as before.

        Args:
            operation: what was being done (``"mqtt-connect"``, ``"http-accept"``).
            exc: what it raised.
        """
        name = resource_shortage(exc)
        if name is None:
            return False
        self.counts[operation, name] += 1
        run = self._failing.get(operation, 0)
        self._failing[operation] = run + 1
        if run == 0:
            self._log.warning(
                "%s: a system resource ran out (%s: %s); retrying with backoff. Logged once until it succeeds "
                "again; raise the open-file limit (LimitNOFILE=) or look for what holds the files",
                operation,
                name,
                exc,
            )
        return True

    def shortage(self, operation: str, name: str) -> None:
        """Count one shortage that someone else retries and logs (asyncio's failed ``accept``)."""
        self.counts[operation, name] += 1

    def succeeded(self, operation: str) -> None:
        """``operation`` worked: a run of shortages, if there was one, has ended (logged once)."""
        run = self._failing.pop(operation, 0)
        if run:
            self._log.warning("%s works again after %d failure(s) for want of a system resource", operation, run)

    @property
    def failing(self) -> frozenset[str]:
        """The operations whose last attempt ran out of a resource."""
        return frozenset(self._failing)
