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

    Called at start-up and again at every reconnect, so a file that is gone or broken later
    stops the collector with the same message instead of a retry loop that names no file.

    Raises:
        ConfigError: naming the config file, the field (``mqtt.tls.ca_file``, ...) and the file.
    """
    try:
        return client_context(ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file)
    except SettingFileError as exc:
        raise ConfigError(tls.source, f"mqtt.tls.{exc.setting}", exc.problem) from None


def broker_tls_context(config: MqttConfig) -> ssl.SSLContext | None:
    """The context for one connection to the broker ``config`` names; None without ``[mqtt.tls]``.

    Raises:
        ConfigError: as :func:`tls_context`.
    """
    # Built again at every connect: a CA file that vanished since start-up raises the
    # ConfigError naming it (which ends the service) rather than an OSError retried forever.
    return None if config.tls is None else tls_context(config.tls)
