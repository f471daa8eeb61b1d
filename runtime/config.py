"""Config files: TOML read from disk and decoded by :func:`protocol.schema.decode` into frozen dataclasses.

What the agent and the collector share about their config files: the file is read as UTF-8,
parsed as TOML and decoded by the schema; relative paths in it are relative to the file's
directory (so a config and the files it names move together); every mistake is a
:class:`~runtime.errors.ConfigFileError` naming the file and the dotted field, which each
side turns into its own ``ConfigError``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from protocol.schema import Hook, SchemaError, decode, type_name
from runtime.errors import ConfigFileError

__all__ = ["decode_config", "load_config_file", "parse_config_text", "path_hook"]

T = TypeVar("T")


def path_hook(base: Path) -> Hook:
    """Decodes a path: ``~`` expanded, a relative one taken relative to ``base``."""

    def decode_path(raw: object, where: str) -> Path:
        if not isinstance(raw, str) or not raw:
            found = f"{type_name(raw)} {raw!r}" if not isinstance(raw, dict | list) else type_name(raw)
            raise SchemaError(where, "bad-type", f"expected a path; got {found}")
        p = Path(raw).expanduser()
        return p if p.is_absolute() else base / p

    return decode_path


def decode_config(cls: type[T], data: Mapping[str, Any], *, source: str, base: Path) -> T:
    """Decode a parsed TOML document into ``cls``.

    Raises:
        ConfigFileError: naming ``source`` and the field.
    """
    try:
        return decode(cls, dict(data), hooks={Path: path_hook(base)})
    except SchemaError as e:
        raise ConfigFileError(source, e.field, e.kind, e.problem) from None


def parse_config_text(cls: type[T], text: str, *, source: str, base: Path) -> T:
    """Parse TOML text and decode it into ``cls``.

    Raises:
        ConfigFileError: naming ``source`` and the field (``""`` for a syntax error).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(source, "", "syntax", f"not valid TOML: {e}") from None
    return decode_config(cls, data, source=source, base=base)


def load_config_file(cls: type[T], path: Path) -> T:
    """Read a config file and decode it into ``cls``; relative paths are relative to its directory.

    Raises:
        ConfigFileError: the file cannot be read, is not TOML, or has a bad field.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigFileError(str(path), "", "unreadable", f"cannot read the file: {reason}") from None
    return parse_config_text(cls, text, source=str(path), base=path.resolve().parent)
