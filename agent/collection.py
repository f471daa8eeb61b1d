"""Collection cycles: close the periods that ended, keep what the limits allow, charge it, stage it.

Per use case, in one atomic write: close the periods that ended, answer them (counters from
their memo, events and strings from their reservoir), keep a uniformly random subset within
the daily limit and the lifetime ε cap (003 §3.2.1), charge the budget, and put the encoded
report in the outbox. A report is charged and staged in the same write, so a crash can never
leave a report sent but uncharged, or charged twice. A cycle computes the new documents from
copies (a :class:`~agent.transaction.Change`) and the caller commits them
(:mod:`agent.transaction`).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agent.accounting import EPSILON_SLACK, Budget, day_of
from agent.device_state import DeviceState, Slot, budget_of
from agent.mechanism_calls import counter_input, privatize, setup
from agent.state import OutboxEntry, UseCaseDoc
from agent.transaction import Change
from protocol.interfaces import Privatization
from protocol.plain import Plain
from protocol.randomness import RandomSource, sample_without_replacement
from protocol.registry import UseCase
from protocol.wire import Report, encode_report, new_report_id

__all__ = ["CycleSummary", "Staged", "collect", "stage"]

log = logging.getLogger("ldp_agent")


@dataclass(frozen=True, slots=True)
class CycleSummary:
    """What a collection cycle did.

    Attributes:
        reports: reports staged in the outbox.
        records: records they carry.
        unsent: records not sent because of the daily limit or the ε cap.
        epsilon: ε charged.
    """

    reports: int
    records: int
    unsent: int
    epsilon: float


def collect(
    state: DeviceState, *, now: float, rng: RandomSource, outbox_max_reports: int, outbox_max_age: float
) -> tuple[Change, CycleSummary]:
    """Close every ended period of every running use case: answer, sample, charge, stage.

    Args:
        state: the state in force (the caller checked consent).
        now: the wall-clock time of the cycle.
        rng: device randomness (the sample within the limits, report ids, answers from memos).
        outbox_max_reports: most reports waiting per use case; the oldest are dropped beyond it.
        outbox_max_age: seconds a report may wait before it is dropped.

    Returns:
        The new documents of the use cases the cycle changed, and what it did.
    """
    reports = records = unsent = 0
    spent = 0.0
    documents: dict[str, UseCaseDoc] = {}
    for name, slot in state.slots.items():
        if slot.broken or slot.doc is None:
            continue
        doc = copy.deepcopy(slot.doc)
        r, n, u, e = _collect_one(slot, doc, now, rng, max_reports=outbox_max_reports, max_age=outbox_max_age)
        if (doc.last_closed, doc.budget, len(doc.outbox)) != (
            slot.doc.last_closed,
            slot.doc.budget,
            len(slot.doc.outbox),
        ) or doc.dropped_reports != slot.doc.dropped_reports:
            documents[name] = doc
        reports, records, unsent, spent = reports + r, records + n, unsent + u, spent + e
    return Change(documents), CycleSummary(reports=reports, records=records, unsent=unsent, epsilon=spent)


def _collect_one(
    slot: Slot, doc: UseCaseDoc, now: float, rng: RandomSource, *, max_reports: int, max_age: float
) -> tuple[int, int, int, float]:
    """Close the slot's ended periods in ``doc``, the cycle's own copy of its document."""
    uc = slot.use_case
    budget = budget_of(uc, doc).at(day_of(now))
    was_exhausted = budget.exhausted(uc.cost)
    current = max(uc.period.index_at(now), doc.last_closed + 1)
    closing = sorted(p for p in set(doc.totals) | set(doc.pending) if p < current)
    reports = records = unsent = 0
    spent = 0.0
    for period in closing:
        definition, cost = uc.definition, uc.cost
        if slot.kind is Privatization.COUNTER:
            wire: list[Plain] = []
            for kh, total in sorted(doc.totals.pop(period).items()):
                if kh not in doc.permanent:
                    # A registry change started this key's memo anew (charged then,
                    # agent.registry_change) while its total was open: drawn now, at its first use.
                    doc.permanent[kh] = setup(uc, rng)
                # Answer from the memo (000 §3.1 step 4, §3.4); the raw total is erased with the period.
                record, _ = privatize(uc, counter_input(uc, total), doc.permanent[kh], rng)
                wire.append(record)
        else:
            pending = doc.pending.pop(period)
            wire = list(pending.records)
            # Records the reservoir already left out are unsent too (the daily limit at work).
            unsent += pending.offered - len(pending.records)
            # Privatized under the definition the period's records were made with.
            definition = pending.definition or uc.definition
            cost = uc.cost if pending.cost is None else pending.cost
        doc.last_closed = max(doc.last_closed, period)
        staged = stage(uc, budget, period, wire, definition=definition, cost=cost, now=now, rng=rng)
        budget = staged.budget
        unsent += staged.left_out
        if staged.entry is not None:
            doc.outbox.append(staged.entry)
            reports += 1
            records += staged.entry.records
            spent += staged.entry.epsilon
    doc.unsent_records += unsent
    if unsent:
        log.info("use case %s: %d records not sent (daily limit or ε cap)", uc.name, unsent)
    _trim_outbox(uc.name, doc, now, max_reports=max_reports, max_age=max_age)
    doc.budget = budget.to_plain()
    if budget.exhausted(uc.cost) and not was_exhausted:
        log.warning(
            "use case %s reached its lifetime ε cap (%g): it stops recording and reporting",
            uc.name,
            budget.epsilon_cap,
        )
    return reports, records, unsent, spent


class Staged(NamedTuple):
    """A report of a period's records, charged: what a use case's outbox and budget become.

    Attributes:
        budget: the budget with the report charged.
        entry: the report for the outbox (None when nothing could be sent).
        left_out: the records the daily limit or the lifetime ε cap left out.
    """

    budget: Budget
    entry: OutboxEntry | None
    left_out: int


def stage(
    uc: UseCase,
    budget: Budget,
    period: int,
    wire: Sequence[Plain],
    *,
    definition: bytes,
    cost: float,
    now: float,
    rng: RandomSource,
) -> Staged:
    """Charge a report of a period's records: the outbox entry and the charged budget, which the
    caller puts in the same document, so that they are written together.

    A uniformly random subset when there are more records than the daily limit and the
    lifetime ε cap allow (003 §3.2.1). The report carries ``definition``, the hash of the
    definition the records were made under, and the entry keeps the records it was made of
    for the ledger (agent.outbox).
    """
    if not wire:
        return Staged(budget, None, 0)
    left = budget.remaining()
    affordable = math.floor((left.epsilon + EPSILON_SLACK) / cost) if cost > 0 else len(wire)
    n = min(len(wire), left.records_today, affordable, uc.daily_limit)
    # The division above is in floating point: let the accountant itself decide the edge case,
    # so float rounding can never turn into a refused spend (and a crash loop) below.
    while n > 0 and not budget.fits(n, n * cost):
        n -= 1
    if n == 0:
        return Staged(budget, None, len(wire))
    chosen = sorted(sample_without_replacement(rng, len(wire), n)) if n < len(wire) else range(n)
    sent = [wire[i] for i in chosen]
    epsilon = n * cost
    budget = budget.spend(n, epsilon)
    report = Report(
        use_case=uc.name,
        definition=definition,
        period=period,
        report_id=new_report_id(rng),
        records=sent,
    )
    entry = OutboxEntry(
        report_id=report.report_id,
        period=period,
        payload=encode_report(report),
        records=n,
        epsilon=float(epsilon),
        created=float(now),
        day=budget.day,
        epsilon_today=float(budget.epsilon_today),
        epsilon_total=float(budget.epsilon_total),
        sent_records=tuple(sent),
    )
    return Staged(budget, entry, len(wire) - n)


def _trim_outbox(name: str, doc: UseCaseDoc, now: float, *, max_reports: int, max_age: float) -> None:
    fresh = [e for e in doc.outbox if now - e.created <= max_age]
    overflow = max(0, len(fresh) - max_reports)
    dropped = len(doc.outbox) - len(fresh) + overflow
    if dropped:
        log.warning("use case %s: %d unsent reports dropped from the outbox (too old or too many)", name, dropped)
        doc.dropped_reports += dropped
        doc.outbox = fresh[overflow:]
