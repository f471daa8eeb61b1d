"""What a running daemon needs from its host, written once for the agent and the collector.

Above :mod:`protocol` (which it may use) and below ``agent`` and ``collector`` (which it never
imports): part of the base install, so nothing here imports a server library.
"""

__all__ = [
    "accept_errors",
    "backoff",
    "clock",
    "closing",
    "config",
    "console",
    "errors",
    "exit_status",
    "registry_file",
    "resources",
    "sd_notify",
    "secret_files",
    "tls",
]
