"""The definitions the collector accepts, read from the registry files its config names.

``registry`` is the current registry (what agents are moving to); ``earlier_registries`` are
the files agents in the field may still run; ``retire`` gives definitions a day after which
their reports are refused. :func:`load_catalog` reads and parses every file and builds the
:class:`~protocol.catalog.Catalog` that ingest, the store, the live view, the CLI and the
HTTP API share; a file that cannot be read or parsed, or a retirement that names nothing,
is a :class:`~collector.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path

from collector.config import CollectorConfig
from collector.errors import ConfigError
from protocol.catalog import Catalog, CatalogError
from protocol.registry import Registry, RegistryError
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry, registry_field

__all__ = ["catalog_of_config", "load_catalog", "load_registry"]


def load_registry(path: Path, *, source: str | None = None, setting: str = "registry") -> Registry:
    """Read and parse one use-case registry file.

    Args:
        path: the registry file.
        source: the config file that names it, for a file that cannot be read.
        setting: the config field that names it (``registry``, ``earlier_registries[0]``).

    Raises:
        ConfigError: naming the config's field for a file that cannot be read, and the
            registry file with the dotted field (``use_cases.<name>.<field>``) for a bad one.
    """
    try:
        return read_registry(path, setting=setting)
    except SettingFileError as exc:
        raise ConfigError(source or str(path), exc.setting if source else "", exc.problem) from None
    except RegistryError as exc:
        raise ConfigError(str(path), registry_field(exc), exc.problem) from None


def load_catalog(config: CollectorConfig) -> Catalog:
    """Every definition the collector accepts: the current registry's and the earlier files'.

    Raises:
        ConfigError: a registry file cannot be read or is invalid, or a retirement names no
            definition.
    """
    current = load_registry(config.registry, source=config.source)
    earlier = [
        load_registry(path, source=config.source, setting=f"earlier_registries[{i}]")
        for i, path in enumerate(config.earlier_registries)
    ]
    try:
        return Catalog.build(current, earlier, retire=config.retire)
    except CatalogError as exc:
        raise ConfigError(config.source, exc.field, exc.problem) from None


_CACHE: dict[tuple[object, ...], Catalog] = {}
_CACHE_SIZE = 8


def catalog_of_config(config: CollectorConfig) -> Catalog:
    """:func:`load_catalog`, parsed once per modification of any of the registry files."""
    paths = (config.registry, *config.earlier_registries)
    key = (
        config.source,
        tuple(str(p) for p in paths),
        tuple(os.stat(p).st_mtime_ns for p in paths),
        tuple(sorted(config.retire.items())),
    )
    found = _CACHE.get(key)
    if found is None:
        found = load_catalog(config)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = found
    return found
