"""Choosing the store backend from the config."""

from __future__ import annotations

from collector.config import CollectorConfig
from collector.store.interface import Store
from protocol.catalog import Catalog
from protocol.registry import Registry

__all__ = ["describe_store", "open_store"]


def open_store(
    config: CollectorConfig, catalog: Catalog | Registry, *, instance: str | None = None, readonly: bool = False
) -> Store:
    """The checkpoint store ``[store]`` names: PostgreSQL for ``url``, else the SQLite ``path``.

    Args:
        config: the collector configuration.
        catalog: the use-case definitions accepted.
        instance: the name the commits' counters are kept under (default ``config.instance``).
        readonly: open for reading only (the CLI, the live view).

    Raises:
        ConfigError: the PostgreSQL password file cannot be read.
        StoreUnavailable: the database cannot be reached now (a restart may succeed).
        StoreError: the store cannot be used (damaged, or a newer schema).
    """
    name = config.instance if instance is None else instance
    if config.store.url is not None:
        from collector.store.postgres import PostgresStore  # noqa: PLC0415 - psycopg only when configured

        return PostgresStore(config.store, catalog, instance=name, readonly=readonly)
    from collector.store.sqlite import CheckpointStore  # noqa: PLC0415 - the package imports this module first

    return CheckpointStore(config.store.path, catalog, instance=name, readonly=readonly)


def describe_store(config: CollectorConfig, catalog: Catalog) -> str:
    """One line for ``ldp-collector check-config`` about a PostgreSQL store: reachable, and its schema.

    Raises:
        ConfigError: the store cannot be reached or used, naming ``store.url``.
    """
    from collector.store.postgres_session import probe  # noqa: PLC0415 - psycopg only when configured

    return probe(config.store, catalog)
