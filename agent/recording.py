"""Recording values: each is privatized at once or added to a counter's running total.

How a value is kept depends on when its mechanism privatizes (:mod:`agent.mechanism_calls`): a
counter's value joins the period's total per counter key, answered from the key's memo when
the period closes (000 §3.1); a string is privatized at once from its memo entry ``B'``, at
most once per period (004 §2); an event is privatized at once with fresh coins (003 §3.2.1).
A period's privatized records are a uniform reservoir of at most the daily limit, so what is
sent is a uniform sample of the period's values. Every value of a batch is checked, once,
before anything is recorded, and each use case's document changes once per batch: recording
computes a :class:`~agent.transaction.Change` (new documents, each made from a copy) that the
caller commits (:mod:`agent.transaction`). A string a discovery use case (SFP) can never
release (characters outside its alphabet, protocol/sfp.py "Alphabet") is refused with the
rest, so no ε is spent on it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from agent.device_state import DeviceState, Slot, budget_of, new_use_case_doc
from agent.errors import UseCaseStoppedError, ValueRefusedError
from agent.expiry import expired_error
from agent.mechanism_calls import check_counter_value, check_value, clamp_note, privatize, setup
from agent.state import PendingRecords, UseCaseDoc
from agent.transaction import Change
from protocol.errors import InputError
from protocol.interfaces import EstimateKind, Privatization, RecordValue, as_discovery
from protocol.plain import Plain
from protocol.randomness import RandomSource, uniform_draws
from protocol.registry import Registry

__all__ = ["MAX_SEEN_PER_PERIOD", "RecordOutcome", "Recorded", "record_each", "record_many", "reservoir_offer"]

MAX_SEEN_PER_PERIOD = 4096
"""Distinct strings remembered per period (beyond it new strings are dropped, and counted)."""

_COUNTER_PERSON = b"ldp-counter-key"
_STRING_PERSON = b"ldp-string-seen"
_STRING_MEMO = b"\0" * 32
"""Where a string use case keeps its one memo table among the permanent states."""


def _keyed_hash(key: bytes, data: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=32, person=person).digest()


def reservoir_offer(pending: PendingRecords, record: Plain, capacity: int, rng: RandomSource) -> None:
    """Offer a record to a period's reservoir (Algorithm R).

    After ``n`` offers the reservoir is a uniformly random subset of size ``min(n, capacity)``
    of the offered records, so what is sent is a uniform sample of the period's (003 §3.2.1),
    while at most ``capacity`` privatized records are ever kept.
    """
    pending.offered += 1
    if len(pending.records) < capacity:
        pending.records.append(record)
        return
    j = uniform_draws(rng, pending.offered, 1)[0]
    if j < capacity:
        pending.records[j] = record


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What happened to a recorded value: ``recorded``, or ``duplicate`` (a string already
    recorded this period: its report is already pending), or ``dropped`` (too many distinct
    strings this period).

    Attributes:
        use_case: the use case's name.
        outcome: ``recorded``, ``duplicate`` or ``dropped``.
        counter: a counter use case: the value went into the period's running total, which is
            privatized and sent once when the period ends.
        offered: event-level use cases: values recorded in this period so far (this one included).
        limit: the use case's daily record limit, the most records of the period that are sent;
            beyond it a uniformly random ``limit`` of the ``offered`` are kept (003 §3.2.1).
        note: for a counter value beyond its mechanism's range, what the clamping rule does
            (:func:`agent.mechanism_calls.clamp_note`); empty otherwise.
    """

    use_case: str
    outcome: str
    counter: bool = False
    offered: int = 0
    limit: int = 0
    note: str = ""

    @property
    def over_limit(self) -> int:
        """How many of this period's values the daily limit drops (0 while within it)."""
        return max(0, self.offered - self.limit) if not self.counter else 0


class Recorded(NamedTuple):
    """What recording a batch changes, and what happened to each value.

    Attributes:
        change: the new documents of the use cases the batch recorded into.
        outcomes: one per value recorded, in order.
        stopped: the use case of the batch that had spent its lifetime ε cap (None if none
            had): what was recorded for the use cases before it is in ``change``, and the
            caller raises this once ``change`` is committed.
    """

    change: Change
    outcomes: list[RecordOutcome]
    stopped: UseCaseStoppedError | None = None


def record_many(
    state: DeviceState,
    registry: Registry,
    items: Iterable[tuple[str, object, str | None]],
    *,
    now: float,
    rng: RandomSource,
) -> Recorded:
    """Record several values, each use case's document changed once (the caller checked consent).

    All values are checked before anything is recorded: one bad value refuses the batch.

    Raises:
        ValueRefusedError: unknown use case, or a value that does not fit it.
        UseCaseStoppedError: the use case stopped (unreadable state, past its end date:
            ``UseCaseExpiredError``); nothing of the batch is recorded. A use case that spent
            its lifetime ε cap is :attr:`Recorded.stopped` instead.
    """
    by_slot: dict[str, list[tuple[object, RecordValue, str | None]]] = {}
    for name, value, key in items:
        slot = _slot(state, registry, name, now)
        by_slot.setdefault(name, []).append((value, _check_value(slot, value, key), key))
    outcomes: list[RecordOutcome] = []
    documents: dict[str, UseCaseDoc] = {}
    for name, values in by_slot.items():
        slot = state.slots[name]
        doc = _working(slot, rng)
        stopped = _stopped(slot, doc)
        if stopped is not None:
            return Recorded(Change(documents), outcomes, stopped)  # what was recorded before this use case is kept
        for value, checked, key in values:
            outcomes.append(_record_one(slot, doc, value, checked, key, now=now, rng=rng))
        documents[name] = doc
    return Recorded(Change(documents), outcomes)


def record_each(
    state: DeviceState,
    registry: Registry,
    items: Iterable[tuple[str, object, str | None]],
    *,
    now: float,
    rng: RandomSource,
) -> tuple[Change, list[RecordOutcome | ValueRefusedError | UseCaseStoppedError]]:
    """Record several values as one :func:`record_many` call per value would, in one change.

    Each value gets its outcome, or the error that call would have raised for it (the others
    are recorded all the same); the values are taken in order, so the device's random draws are
    those of the calls one by one. One change for all of them: each use case's file is written
    once, then the manifest once (a simulated fleet records a few values per device and cycle).
    """
    results: list[RecordOutcome | ValueRefusedError | UseCaseStoppedError] = []
    docs: dict[str, UseCaseDoc | UseCaseStoppedError] = {}
    for name, value, key in items:
        try:
            slot = _slot(state, registry, name, now)
            checked = _check_value(slot, value, key)
        except (ValueRefusedError, UseCaseStoppedError) as e:
            results.append(e)
            continue
        working = docs.get(name)
        if working is None:
            doc = _working(slot, rng)
            working = docs[name] = _stopped(slot, doc) or doc
        if isinstance(working, UseCaseStoppedError):
            results.append(working)
            continue
        results.append(_record_one(slot, working, value, checked, key, now=now, rng=rng))
    return Change({n: d for n, d in docs.items() if not isinstance(d, UseCaseStoppedError)}), results


def _working(slot: Slot, rng: RandomSource) -> UseCaseDoc:
    """A copy of the slot's document to record into (a new one, with its key, before the first value)."""
    return copy.deepcopy(slot.doc) if slot.doc is not None else new_use_case_doc(slot.use_case, rng)


def _stopped(slot: Slot, doc: UseCaseDoc) -> UseCaseStoppedError | None:
    """The error for a use case that spent its lifetime ε cap (None while it may record)."""
    budget = budget_of(slot.use_case, doc)
    if not budget.exhausted(slot.use_case.cost):
        return None
    return UseCaseStoppedError(
        f"use case {slot.use_case.name!r} has spent its lifetime ε cap ({budget.epsilon_cap:g}) and no longer records"
    )


def _record_one(
    slot: Slot, doc: UseCaseDoc, value: object, checked: RecordValue, key: str | None, *, now: float, rng: RandomSource
) -> RecordOutcome:
    """Record one value into ``doc`` (the step's own copy), ``checked`` being what :func:`_check_value` made of it."""
    period = _period_for_record(slot, doc, now)
    note = ""
    if slot.kind is Privatization.COUNTER:
        assert isinstance(checked, int | float)  # _check_value refused the rest
        outcome = _add_to_total(slot, doc, period, checked, key=key, rng=rng)
        note = clamp_note(slot.use_case, checked) or ""
    else:
        outcome = _privatize_into(slot, doc, period, value, rng)
    pending = doc.pending.get(period)
    return RecordOutcome(
        slot.use_case.name,
        outcome,
        counter=slot.kind is Privatization.COUNTER,
        offered=pending.offered if pending is not None else 0,
        limit=slot.use_case.daily_limit,
        note=note,
    )


def _slot(state: DeviceState, registry: Registry, name: str, now: float) -> Slot:
    slot = state.slots.get(name)
    if slot is None:
        known = ", ".join(sorted(registry.use_cases))
        raise ValueRefusedError(f"unknown use case {name!r}; the registry has: {known}")
    if slot.broken:
        raise UseCaseStoppedError(f"use case {name!r} is stopped: {slot.broken}")
    if slot.use_case.metadata.expired(now):
        # Before the value is looked at: past its end date nothing is stored or charged.
        raise expired_error(slot.use_case)
    return slot


def _check_value(slot: Slot, value: object, key: str | None) -> RecordValue:
    """The value as the use case's mechanism takes it, checked once for the whole path:
    a counter's increment is what its total adds and what the clamping note is about."""
    uc = slot.use_case
    if not isinstance(value, str | bytes | int | float):  # bool is an int
        raise ValueRefusedError(
            f"use case {uc.name!r} ({uc.mechanism.name}) takes a number or a string; got {type(value).__name__}"
        )
    if key is not None and slot.kind is not Privatization.COUNTER:
        raise ValueRefusedError(f"use case {uc.name!r} ({uc.mechanism.name}) takes no counter key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > 256):
        raise ValueRefusedError(f"a counter key is a non-empty string of at most 256 characters; got {key!r}")
    if slot.kind is Privatization.COUNTER:
        return check_counter_value(uc, value)
    checked = check_value(uc, value)
    if uc.mechanism.kind is EstimateKind.DISCOVERY and isinstance(value, str):
        # The collector can only ever release words it can assemble: refuse the rest before any ε is spent.
        try:
            as_discovery(uc.mechanism).check_discoverable(value)
        except InputError as exc:
            raise ValueRefusedError(f"use case {uc.name!r} ({uc.mechanism.name}) {exc}") from None
    return checked


def _period_for_record(slot: Slot, doc: UseCaseDoc, now: float) -> int:
    # A clock set backwards must not reopen a period that was already reported.
    return max(slot.use_case.period.index_at(now), doc.last_closed + 1)


def _add_to_total(
    slot: Slot, doc: UseCaseDoc, period: int, amount: int | float, *, key: str | None, rng: RandomSource
) -> str:
    """A counter's value joins its key's running total for the period."""
    kh = _keyed_hash(doc.hash_key, (key or "").encode("utf-8"), _COUNTER_PERSON)
    if kh not in doc.permanent:
        # First use of this counter key: draw its permanent state (000 §3.1 steps 2-3).
        doc.permanent[kh] = setup(slot.use_case, rng)
    totals = doc.totals.setdefault(period, {})
    totals[kh] = min(totals.get(kh, 0) + amount, float(1 << 53))
    return "recorded"


def _privatize_into(slot: Slot, doc: UseCaseDoc, period: int, value: object, rng: RandomSource) -> str:
    """An event or a string is privatized now and offered to the period's reservoir."""
    uc = slot.use_case
    pending = doc.pending.setdefault(period, PendingRecords(definition=uc.definition, cost=uc.cost))
    if slot.kind is Privatization.STRING:
        assert isinstance(value, str)
        seen = _keyed_hash(doc.hash_key, value.encode("utf-8"), _STRING_PERSON)
        if seen in pending.seen:
            return "duplicate"
        if len(pending.seen) >= MAX_SEEN_PER_PERIOD:
            doc.unsent_records += 1
            return "dropped"
        stored = doc.permanent.get(_STRING_MEMO)
        state = setup(uc, rng) if stored is None else stored
        wire, state = privatize(uc, value, state, rng)
        # The memo entry B' for this value is persisted in the same write as the record.
        doc.permanent[_STRING_MEMO] = state
        pending.seen.append(seen)
    else:
        wire, _ = privatize(uc, value, None, rng)
    reservoir_offer(pending, wire, uc.daily_limit, rng)
    return "recorded"
