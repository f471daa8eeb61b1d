"""The TLS context of the broker connection, from the files ``[mqtt.tls]`` names."""

from __future__ import annotations

import ssl

from collector.config import MqttConfig, TlsConfig
from collector.errors import ConfigError
from runtime.errors import SettingFileError
from runtime.tls import client_context

__all__ = ["broker_tls_context", "tls_context"]


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The TLS context of the broker connection, built from the files ``[mqtt.tls]`` names.

    Built at start-up (``check-config``, and once per broker session,
    :func:`collector.mqtt.transport.broker_connector`), never at a reconnect: a reconnect under
    a full file table must not read the CA file (runtime/tls.py).

    Raises:
        ConfigError: naming the config file, the field (``mqtt.tls.ca_file``, ...) and the file.
        runtime.resources.ResourceShortageError: a file could not be read for want of a system
            resource (not the configuration's fault).
    """
    try:
        return client_context(ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file)
    except SettingFileError as exc:
        raise ConfigError(tls.source, f"mqtt.tls.{exc.setting}", exc.problem) from None


def broker_tls_context(config: MqttConfig) -> ssl.SSLContext | None:
    """The context for the connections to the broker ``config`` names; None without ``[mqtt.tls]``.

    Raises:
        ConfigError, ResourceShortageError: as :func:`tls_context`.
    """
    return None if config.tls is None else tls_context(config.tls)
