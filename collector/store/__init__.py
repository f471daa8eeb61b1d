"""The checkpoint store: aggregates, the report ids folded into them, counters.

One contract (:class:`Store`, in :mod:`collector.store.interface`), two backends:

* :mod:`collector.store.sqlite` - :class:`CheckpointStore`, one SQLite file (WAL), the
  embedded default (``[store] path``); several collectors on one host can share the file.
* :mod:`collector.store.postgres` - :class:`PostgresStore`, a PostgreSQL database that any
  number of collectors in an MQTT shared-subscription group fold into (``[store] url``).

:mod:`collector.store.row_format` holds what both write alike (blob encoding, row checksums,
segments, allowance tags), :mod:`collector.store.admission` what a commit decides alike about
its reports (expiry, per-device allowance, counters), :mod:`collector.store.integrity` how
both check the checksums, and :mod:`collector.store.reads` what both do alike around reading.
Each backend's opening, schema migration, use-case rows and integrity checks are in
:mod:`collector.store.sqlite_setup` and :mod:`collector.store.postgres_setup`;
:mod:`collector.store.postgres_schema` holds the PostgreSQL tables and partitions,
:mod:`collector.store.postgres_session` its connections and what a failure means.
:func:`open_store` (:mod:`collector.store.factory`) chooses the backend from the config.
"""

from __future__ import annotations

from collector.store.factory import open_store
from collector.store.interface import (
    CommitResult,
    FoldedReport,
    KeyInfo,
    Store,
    report_allowance,
    use_case_fingerprint,
)
from collector.store.row_format import footprint
from collector.store.sqlite import SCHEMA_VERSION, CheckpointStore

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointStore",
    "CommitResult",
    "FoldedReport",
    "KeyInfo",
    "Store",
    "footprint",
    "open_store",
    "report_allowance",
    "use_case_fingerprint",
]
