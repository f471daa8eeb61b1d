"""Deep copies of plain data (:data:`protocol.plain.Plain`), the contents of the agent's sealed
documents, without the generic machinery of ``copy.deepcopy``."""

from __future__ import annotations

import copy
from typing import Any

from protocol.plain import Plain

__all__ = ["SCALARS", "copy_plain"]

SCALARS = frozenset({bool, int, float, str, bytes, type(None)})
"""The immutable types of plain data: shared, never copied."""


def copy_plain(value: Plain) -> Plain:
    """A deep copy of plain data: new dicts, lists and tuples; the immutable scalars shared.

    What ``copy.deepcopy`` gives for these documents, at a fraction of its cost (shared
    references inside a document become separate copies; documents read from a sealed file
    have none).
    """
    if type(value) in SCALARS:
        return value
    if isinstance(value, dict):
        out: dict[Any, Plain] = {k: v if type(v) in SCALARS else copy_plain(v) for k, v in value.items()}
        return out
    if isinstance(value, list):
        return [v if type(v) in SCALARS else copy_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(copy_plain(v) for v in value)
    return copy.deepcopy(value)  # anything else (never in a document the agent writes)
