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
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from protocol.server.contract import Batch
from protocol.server.plain import array_to_plain

T = TypeVar("T")

__all__ = [
    "batch_from_plain",
    "batch_to_plain",
    "concat_batches",
    "is_columnar",
]


def is_columnar(batch: object, size: int | None = None) -> bool:
    """Whether ``batch`` is a dataclass whose fields are arrays (or columnar dataclasses) of one row per record."""
    if not dataclasses.is_dataclass(batch) or isinstance(batch, type):
        return False
    if size is None:
        size = len(batch)  # type: ignore[arg-type]
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, np.ndarray):
            if value.ndim == 0 or value.shape[0] != size:
                return False
        elif not is_columnar(value, size):
            return False
    return True


def _fields(batch: object) -> tuple[dataclasses.Field[object], ...]:
    if not dataclasses.is_dataclass(batch) or isinstance(batch, type):
        raise TypeError(f"a columnar batch is a dataclass instance; got {type(batch).__name__}")
    return dataclasses.fields(batch)


def _replace(template: T, columns: dict[str, object]) -> T:
    # Each batch class is a frozen dataclass whose fields are arrays (or nested batches).
    out = dataclasses.replace(template, **columns)  # type: ignore[type-var]
    if not isinstance(out, type(template)):  # pragma: no cover - replace keeps the class
        raise TypeError(f"dataclasses.replace changed the class of a {type(template).__name__}")
    return out


def _concat(batches: Sequence[T]) -> T | None:
    first = batches[0]
    columns: dict[str, object] = {}
    for f in _fields(first):
        parts = [getattr(b, f.name) for b in batches]
        if isinstance(parts[0], np.ndarray):
            if len({a.shape[1:] for a in parts}) != 1 or len({a.dtype for a in parts}) != 1:
                return None
            columns[f.name] = np.concatenate(parts, axis=0)
        else:
            joined = _concat(parts)
            if joined is None:
                return None
            columns[f.name] = joined
    return _replace(first, columns)


def concat_batches(batches: Sequence[Batch]) -> Batch | None:
    """One batch holding every record of ``batches`` in order, or None if they are not columnar."""
    if not batches:
        return None
    first = batches[0]
    if len(batches) == 1:
        return first
    if not all(type(b) is type(first) for b in batches) or not is_columnar(first):
        return None
    return _concat(batches)


def batch_to_plain(batch: object) -> dict[str, object]:
    """A columnar batch as plain msgpack-ready data (field name -> array record or nested batch)."""
    out: dict[str, object] = {}
    for f in _fields(batch):
        value = getattr(batch, f.name)
        out[f.name] = array_to_plain(value) if isinstance(value, np.ndarray) else {"fields": batch_to_plain(value)}
    return out


def batch_from_plain(template: T, data: Mapping[str, Any]) -> T:
    """Rebuild a batch saved by :func:`batch_to_plain`, using ``template``'s class (and its nested ones).

    The data comes from our own checkpoint, written by :func:`batch_to_plain`; shapes and
    dtypes are taken as stored.
    """
    columns: dict[str, object] = {}
    for f in _fields(template):
        rec = data[f.name]
        inner = getattr(template, f.name)
        if isinstance(inner, np.ndarray):
            arr = np.frombuffer(rec["data"], dtype=np.dtype(rec["dtype"])).reshape(tuple(rec["shape"]))
            columns[f.name] = arr.astype(arr.dtype.newbyteorder("="), copy=True)
        else:
            columns[f.name] = batch_from_plain(inner, rec["fields"])
    return _replace(template, columns)
