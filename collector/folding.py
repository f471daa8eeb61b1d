"""Mechanism-agnostic handling of columnar batches and aggregates.

Every mechanism's ``batch`` is a frozen dataclass of numpy arrays whose first axis is the
record (``RRBatch.bits``, ``HCMSBatch.j/ell/bits``, ``RapporBatch.cohorts/bits``, ...), and
every aggregate folds such a batch with one vectorised ``add``. Ingest therefore gathers
the batches of many reports of one (use case, period), concatenates them column by column
and folds them in a single call, instead of paying numpy's per-call overhead per report.

A batch class that does not have that shape (a field that is not an array, or arrays whose
first axis is not the record count) is still handled: its batches are kept as a list and
folded one by one. Nothing here knows a mechanism by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.plain import array_to_plain
from protocol.registry import WireMechanism

__all__ = [
    "aggregate_from_plain",
    "batch_from_plain",
    "batch_to_plain",
    "concat_batches",
    "is_columnar",
    "new_aggregate",
]


def is_columnar(batch: object) -> bool:
    """Whether ``batch`` is a dataclass whose every field is an array with one row per record."""
    if not dataclasses.is_dataclass(batch) or isinstance(batch, type):
        return False
    size = len(batch)  # type: ignore[arg-type]
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != size:
            return False
    return True


def concat_batches(batches: Sequence[Any]) -> Any | None:
    """One batch holding every record of ``batches`` in order, or None if they are not columnar."""
    if not batches:
        return None
    first = batches[0]
    if len(batches) == 1:
        return first
    if not all(type(b) is type(first) for b in batches) or not is_columnar(first):
        return None
    columns = {}
    for f in dataclasses.fields(first):
        arrays = [getattr(b, f.name) for b in batches]
        shapes = {a.shape[1:] for a in arrays}
        if len(shapes) != 1:
            return None
        columns[f.name] = np.concatenate(arrays, axis=0)
    return dataclasses.replace(first, **columns)


def batch_to_plain(batch: Any) -> dict[str, Any]:
    """A columnar batch as plain msgpack-ready data (field name -> array record)."""
    return {f.name: array_to_plain(getattr(batch, f.name)) for f in dataclasses.fields(batch)}


def batch_from_plain(template: Any, data: dict[str, Any]) -> Any:
    """Rebuild a batch saved by :func:`batch_to_plain`, using ``template``'s class.

    The data comes from our own checkpoint, written by :func:`batch_to_plain`; shapes and
    dtypes are taken as stored.
    """
    columns = {}
    for f in dataclasses.fields(template):
        rec = data[f.name]
        arr = np.frombuffer(rec["data"], dtype=np.dtype(rec["dtype"])).reshape(tuple(rec["shape"]))
        columns[f.name] = arr.astype(arr.dtype.newbyteorder("="), copy=True)
    return dataclasses.replace(template, **columns)


def new_aggregate(mechanism: WireMechanism) -> Any:
    """An empty aggregate of ``mechanism``."""
    return mechanism.new_aggregate()


def aggregate_from_plain(mechanism: WireMechanism, data: object) -> Any:
    """Restore an aggregate of ``mechanism`` saved with its ``to_plain``."""
    cls = type(mechanism.new_aggregate())
    return cls.from_plain(mechanism, data)
