"""The TLS client context towards the MQTT broker, from the files the config names.

Each file is read and parsed on its own before the context loads it, so a problem names the
setting and the file that has it (``ssl`` alone says ``[SSL] PEM lib`` and names neither).
The daemons build the context once and reuse it for every connection (the collector at
start-up, the agent at its first connection), so a reconnect opens no file: under a flood of
connections that has filled the open-file table, rebuilding it read the CA file, failed with
``EMFILE`` and stopped the collector as if its configuration were wrong. A file that cannot
be read for want of a system resource raises :class:`~runtime.resources.ResourceShortageError`
(retried), never :class:`~runtime.errors.SettingFileError` (the operator's to fix).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from runtime.errors import SettingFileError
from runtime.resources import RESOURCE_ERRNOS, ResourceShortageError

__all__ = ["client_context"]


def _read(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        _raise_if_shortage(e, f"reading {setting} {path}")
        raise SettingFileError(setting, f"cannot read {path}: {e.strerror or e}") from None


def _raise_if_shortage(exc: Exception, what: str) -> None:
    """Raise :class:`ResourceShortageError` if ``exc`` is an ``OSError`` for want of a resource."""
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        raise ResourceShortageError(what, exc) from exc


def client_context(
    *, ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A verifying TLS 1.2+ client context.

    Args:
        ca_file: the CA bundle to verify the broker with; only it is trusted (None: the
            system trust store).
        cert_file: a client certificate (PEM), for certificate authentication.
        key_file: its unencrypted PEM private key (None: it is in ``cert_file``).

    Raises:
        SettingFileError: naming ``ca_file``, ``cert_file`` or ``key_file`` and the file.
        ResourceShortageError: a file could not be opened for want of a system resource.
    """
    if key_file is not None and cert_file is None:
        raise SettingFileError("key_file", "a key_file needs the cert_file it belongs to")
    if ca_file is not None:
        _read("ca_file", ca_file)
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (ssl.SSLError, OSError) as e:
        _raise_if_shortage(e, f"loading ca_file {ca_file}" if ca_file else "loading the system trust store")
        what = f"{ca_file} holds no PEM CA certificate" if ca_file else "cannot load the system trust store"
        raise SettingFileError("ca_file", f"{what}: {e}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is None:
        return ctx
    # Imported only for a client certificate: cryptography.x509 costs a device memory and
    # start-up time that a password login never needs (docs/benchmarks.md, "Imports a device
    # defers or avoids").
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    cert = _read("cert_file", cert_file)
    try:
        x509.load_pem_x509_certificate(cert)
    except ValueError:
        raise SettingFileError("cert_file", f"{cert_file} is not a PEM certificate") from None
    if key_file is not None:
        key = _read("key_file", key_file)
        try:
            serialization.load_pem_private_key(key, None)
        except (ValueError, TypeError):
            raise SettingFileError("key_file", f"{key_file} is not an unencrypted PEM private key") from None
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    except (ssl.SSLError, OSError) as e:
        _raise_if_shortage(e, f"loading cert_file {cert_file}")
        if key_file is None:
            raise SettingFileError("cert_file", f"{cert_file} holds no private key (give key_file): {e}") from None
        raise SettingFileError("key_file", f"{key_file} is not the private key of {cert_file}: {e}") from None
    return ctx
