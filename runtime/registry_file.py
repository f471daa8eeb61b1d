"""Reading the use-case registry file: the I/O half of :func:`protocol.registry.parse_registry`.

``protocol`` parses bytes and does no I/O; every daemon and tool that loads the registry
reads it here, so a missing or unreadable file gives one message everywhere, and a bad
field is named by one dotted path (``use_cases.emoji.parameters.m``), whichever side
reports it.

The mechanisms a registry may name are the built-in seven
(:data:`protocol.registry.BUILTIN_MECHANISMS`) and, for an extension, the entries the
environment variable ``LDP_MECHANISMS`` names: comma-separated ``module:ATTRIBUTE`` paths to
:class:`~protocol.interfaces.MechanismEntry` objects (``tests.krr:ENTRY``). Every daemon and
tool reads registry files here, so they all see the same mechanisms.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from protocol.interfaces import MechanismEntry
from protocol.registry import BUILTIN_MECHANISMS, Registry, RegistryError, parse_registry
from runtime.errors import SettingFileError

__all__ = [
    "MAX_REGISTRY_BYTES",
    "MECHANISMS_VARIABLE",
    "mechanisms",
    "read_registry",
    "read_registry_bytes",
    "registry_field",
]

MECHANISMS_VARIABLE = "LDP_MECHANISMS"
"""The environment variable naming extension mechanisms' entries (``module:ATTRIBUTE``, comma-separated)."""

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
    return parse_registry(read_registry_bytes(path, setting=setting), source=str(path), mechanisms=mechanisms())


def mechanisms(environ: dict[str, str] | None = None) -> tuple[MechanismEntry, ...]:
    """The built-in mechanisms and those ``LDP_MECHANISMS`` names.

    Raises:
        SettingFileError: a name that does not resolve to a mechanism entry (naming the variable).
    """
    text = (os.environ if environ is None else environ).get(MECHANISMS_VARIABLE, "")
    extra: list[MechanismEntry] = []
    for path in filter(None, (p.strip() for p in text.split(","))):
        module, _, attribute = path.partition(":")
        try:
            entry = getattr(importlib.import_module(module), attribute or "ENTRY")
        except (ImportError, AttributeError) as exc:
            raise SettingFileError(MECHANISMS_VARIABLE, f"cannot load the mechanism entry {path!r}: {exc}") from None
        if not isinstance(entry, MechanismEntry):
            raise SettingFileError(MECHANISMS_VARIABLE, f"{path!r} is not a mechanism entry")
        extra.append(entry)
    return (*BUILTIN_MECHANISMS, *extra)


def registry_field(error: RegistryError) -> str:
    """The dotted path of the field a :class:`RegistryError` names, as written in the file.

    ``use_cases.emoji.parameters.m`` for a use case's field, ``use_cases.emoji`` for the
    use case as a whole, ``salt`` for a top-level key, ``""`` for the whole file.
    """
    use_case = f"use_cases.{error.use_case}" if error.use_case is not None else ""
    return ".".join(p for p in (use_case, error.field) if p)
