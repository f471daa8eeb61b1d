"""The device's broker identity, and the topic level that carries it.

Each device authenticates to the broker as itself: with its own user name and password, or
with a client certificate from the device CA whose common name the broker takes as the user
name (Mosquitto ``use_identity_as_username``). The broker's ACL (``pattern write
ldp/v1/reports/%u/+``) then lets it publish only to ``<prefix>/<identity>/<use_case>``, so the
identity the collector reads from the topic is the authenticated one, and the collector can
bound what each device contributes (docs/device-identity.md). The identity never enters a
report's payload (docs/design.md, invariant 4): it is transport metadata, which the collector uses for
the per-device allowance and then forgets.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.config import BrokerConfig
from agent.errors import ConfigError
from runtime.resources import RESOURCE_ERRNOS, ResourceShortageError

__all__ = ["IDENTITY_PATTERN", "check_identity", "device_identity"]

IDENTITY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A user name that is one topic level: no '/', '+', '#' (the ACL substitutes it into a topic)."""


def check_identity(identity: str) -> str | None:
    """None if ``identity`` can be a topic level, else what is wrong with it."""
    if IDENTITY_PATTERN.fullmatch(identity) is None:
        return f"{identity!r} must match {IDENTITY_PATTERN.pattern} (it becomes one topic level)"
    return None


_COMMON_NAMES: dict[Path, str] = {}
"""The common name of each certificate once read: read at start-up (the broker order depends on
it) and never again, so a connection opens no file (runtime/tls.py)."""


def _common_name(path: Path) -> str:
    found = _COMMON_NAMES.get(path)
    if found is None:
        found = _COMMON_NAMES[path] = _read_common_name(path)
    return found


def _read_common_name(path: Path) -> str:
    # Imported here: only certificate-authenticated agents need it, and it would add to every
    # agent's start (docs/benchmarks.md, "Imports a device defers or avoids").
    from cryptography import x509  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    try:
        data = path.read_bytes()
    except OSError as e:
        if e.errno in RESOURCE_ERRNOS:
            raise ResourceShortageError(f"reading cert_file {path}", e) from e
        raise
    cert = x509.load_pem_x509_certificate(data)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ValueError(f"has {len(names)} common names; a device certificate has exactly one")
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8")


def device_identity(broker: BrokerConfig, *, source: str = "<config>") -> str | None:
    """The identity the broker will see for this device: the user name, else the certificate's CN.

    Returns:
        None when the agent connects anonymously (a loopback test broker without an ACL).

    Raises:
        ConfigError: the user name or the certificate's common name cannot be a topic level,
            or the certificate cannot be read.
        ResourceShortageError: the certificate could not be read for want of a system resource.
    """
    if broker.username is not None:
        problem = check_identity(broker.username)
        if problem:
            raise ConfigError(source, "broker.username", problem)
        return broker.username
    if broker.cert_file is not None:
        try:
            name = _common_name(broker.cert_file)
        except ResourceShortageError:
            raise  # not the certificate's fault: retried
        except (OSError, ValueError) as e:
            raise ConfigError(
                source, "broker.cert_file", f"cannot read the common name of {broker.cert_file}: {e}"
            ) from None
        problem = check_identity(name)
        if problem:
            raise ConfigError(source, "broker.cert_file", f"the certificate's common name {problem}")
        return name
    return None
