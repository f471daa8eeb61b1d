"""The types of plain data: the msgpack documents the agent seals and the collector stores
(states, aggregates, parameters in plain form), and the JSON the agent answers with.

Both are recursive: a value is a scalar or a container of values. Sequences are lists and
tuples (what msgpack and ``json`` write as arrays). Maps are typed as the read-only
``Mapping``, because ``dict`` is invariant in its values: a ``dict[bytes, float]`` is a map of
plain values but not a ``dict[bytes, Plain]``; every map built here is a dict.

A sealed document's keys are strings, and inside it periods (integers) and keyed hashes
(bytes); JSON has string keys only and no bytes (the API shows bytes as hex).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

__all__ = ["Json", "JsonObject", "Plain", "PlainDoc"]

Plain: TypeAlias = (
    "bool | int | float | str | bytes | list[Plain] | tuple[Plain, ...]"
    " | Mapping[str, Plain] | Mapping[int, Plain] | Mapping[bytes, Plain] | None"
)
"""msgpack-ready data (what :meth:`agent.sealed.Sealer.seal` takes)."""

PlainDoc: TypeAlias = dict[str, Plain]
"""A document's (or a part's) plain form: what each ``to_plain`` returns (a mechanism's state,
a server aggregate, the agent's sealed documents)."""

Json: TypeAlias = "bool | int | float | str | list[Json] | tuple[Json, ...] | Mapping[str, Json] | None"
"""JSON-ready data (what ``json.dumps`` takes)."""

JsonObject: TypeAlias = dict[str, Json]
"""A JSON object: a decoded request, a reply of the local API, the status."""
