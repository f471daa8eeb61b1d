"""The agent's documents copy themselves: a deep copy equal to the original, sharing nothing
that a step could change."""

from __future__ import annotations

import copy
from typing import Any

from agent.plain_copy import copy_plain
from agent.state import LedgerEntry, OutboxEntry, PendingRecords, UseCaseDoc


def _doc() -> UseCaseDoc:
    state: Any = {"alpha": 0.25, "memo": [1, 0, 1], "table": {b"x": [True, None]}}
    return UseCaseDoc(
        fingerprint=b"f" * 16,
        hash_key=b"k" * 32,
        permanent={b"a" * 32: state},
        totals={3: {b"a" * 32: 7.5}},
        pending={4: PendingRecords(records=[b"r1", [1, 2]], offered=3, seen=[b"s" * 32], definition=b"d" * 16)},
        last_closed=2,
        budget={"day": 1, "records_today": 1, "epsilon_today": 0.5, "epsilon_total": 0.5},
        outbox=[OutboxEntry(b"i" * 16, 2, b"payload", 1, 0.5, 10.0, 1, 0.5, 0.5)],
        dropped_reports=1,
        unsent_records=2,
        device=b"v" * 16,
        generation=5,
        definition=b"d" * 16,
        period="6h",
        memo_generation=1,
    )


def test_a_deep_copy_is_equal_and_independent() -> None:
    """Equal field by field; changing the copy's tables, lists and entries leaves the original."""
    doc = _doc()
    twin = copy.deepcopy(doc)
    assert twin == doc
    assert twin.to_plain() == doc.to_plain()
    state: Any = twin.permanent[b"a" * 32]
    state["memo"].append(0)
    state["table"][b"x"][0] = False
    twin.totals[3][b"a" * 32] = 0
    record: Any = twin.pending[4].records[1]
    record.append(3)
    twin.pending[4].seen.append(b"t" * 32)
    twin.outbox[0].attempts += 1
    twin.budget["day"] = 2
    assert doc == _doc()


def test_copy_plain_copies_containers_and_keeps_scalars() -> None:
    """Dicts, lists and tuples are new; the scalars are the same objects."""
    value: Any = {"a": [1, (2.0, b"x")], b"k": {"s": "t"}, 3: None}
    twin: Any = copy_plain(value)
    assert twin == value
    assert twin is not value
    assert twin["a"] is not value["a"]
    assert twin[b"k"] is not value[b"k"]


def test_a_ledger_entry_copy_is_shallow_as_before() -> None:
    """copy.copy of a ledger entry: equal, a new object, its records list shared (as the generic copy)."""
    entry = LedgerEntry(b"i" * 16, "flag", 3, [b"r"], 1.0, 2, 1.0, 3.0, 10.0, "sent")
    twin = copy.copy(entry)
    assert twin == entry
    assert twin is not entry
    assert twin.records is entry.records
