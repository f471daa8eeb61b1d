"""Reading the use-case registry file: the I/O half of :func:`protocol.registry.parse_registry`.

``protocol`` parses bytes and does no I/O; every daemon and tool that loads the registry
reads it here, so a missing or unreadable file gives one message everywhere, and a bad
field is named by one dotted path (``use_cases.emoji.parameters.m``), whichever side
reports it.
"""

from __future__ import annotations

from pathlib import Path

from protocol.registry import Registry, RegistryError, parse_registry
from runtime.errors import SettingFileError

__all__ = ["MAX_REGISTRY_BYTES", "read_registry", "read_registry_bytes", "registry_field"]

MAX_REGISTRY_BYTES = 16 * 1024 * 1024
"""A registry file larger than this is refused unread (the example with dictionaries is a few KiB)."""


def read_registry_bytes(path: Path, *, setting: str = "registry") -> bytes:
    """The bytes of the registry file at ``path`` (for a caller that hands them on, as the simulator does).

    Raises:
        SettingFileError: the file cannot be read (missing, permission, a directory, too large).
    """
    try:
        with path.open("rb") as f:
            data = f.read(MAX_REGISTRY_BYTES + 1)
    except OSError as e:
        raise SettingFileError(setting, f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_REGISTRY_BYTES:
        raise SettingFileError(setting, f"{path} is larger than {MAX_REGISTRY_BYTES} bytes; it is not a registry")
    return data


def read_registry(path: Path, *, setting: str = "registry") -> Registry:
    """Read and parse the registry at ``path``.

    Args:
        path: the registry file.
        setting: the setting that names it, for a :class:`SettingFileError`.

    Raises:
        SettingFileError: the file cannot be read (missing, permission, a directory, too large).
        RegistryError: its contents are not a valid registry (:func:`registry_field` names the field).
    """
    return parse_registry(read_registry_bytes(path, setting=setting), source=str(path))


def registry_field(error: RegistryError) -> str:
    """The dotted path of the field a :class:`RegistryError` names, as written in the file.

    ``use_cases.emoji.parameters.m`` for a use case's field, ``use_cases.emoji`` for the
    use case as a whole, ``salt`` for a top-level key, ``""`` for the whole file.
    """
    use_case = f"use_cases.{error.use_case}" if error.use_case is not None else ""
    return ".".join(p for p in (use_case, error.field) if p)
