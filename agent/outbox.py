"""The outbox, the ledger of what left the device, and the receipts that settle a report.

A report is staged in its use case's outbox by a collection cycle and leaves it only after
the broker acknowledged it (and after it entered the ledger), so a crash at any point either
loses nothing or resends identical bytes.

With commit receipts (``protocol.receipts``, docs/design.md, invariant 8) a report's states are:
**waiting** (in the outbox, never sent) -> **sent** (the broker acknowledged a send; still in
the outbox with the time and the number of sends; in the ledger as "sent") -> **counted** or
**refused: <reason>** (the collector's receipt arrived: the report leaves the outbox and the
ledger says so). A sent report without a receipt after :func:`receipt_wait` is sent again,
byte for byte; the collector's de-duplication makes that harmless.

A send the broker itself refuses (an MQTT 5 PUBACK reason code >= 0x80, 0x87 "not
authorized" when its ACL denies the topic) is **refused by the broker: <reason>** in the
ledger (:func:`mark_refused`). ε was charged when the report was privatized, so the report is
not dropped: it stays in the outbox, counted as a send, and is tried again only after
:func:`receipt_wait`, which doubles with each send up to its cap. Once the operator fixes the
ACL the next send goes through and the ledger says "sent", then "counted"; a report still
refused when it reaches the outbox's age limit is dropped like any other.

The ledger is always written before the outbox: a crash in between re-sends bytes the
collector de-duplicates by report id, and the ledger keeps one entry per id. Each function
here computes what a send, an acknowledgement or a receipt changes (the ledger's new entries
or statuses, the use cases' outboxes, each from a copy) as a :class:`~agent.transaction.Change`,
which the caller commits: :func:`agent.transaction.commit` writes the ledger first.

A ledger entry lists the records the report was made of, which the outbox entry holds from
the moment the report was staged (:func:`agent.collection.stage`); a report staged before the
agent last started has them only in its payload, and they are read from there by the
envelope's own reader (:func:`protocol.envelope.report_records`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.device_state import DeviceState
from agent.errors import StateUnreadableError
from agent.state import LedgerDoc, LedgerEntry, LedgerNotice, OutboxEntry, UseCaseDoc
from agent.transaction import Change
from protocol.envelope import report_records

if TYPE_CHECKING:
    from protocol.receipts import Receipt

__all__ = [
    "Pending",
    "acknowledge",
    "due",
    "ledger_entries",
    "ledger_notices",
    "mark_refused",
    "mark_sent",
    "outbox_size",
    "receipt_wait",
    "settle",
    "waiting",
    "with_notices",
]

log = logging.getLogger("ldp_agent")

BROKER_REFUSED = "refused by the broker: "
"""The ledger status of a report whose last send the broker refused, before the reason."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A report waiting in the outbox."""

    use_case: str
    topic: str
    entry: OutboxEntry


def receipt_wait(entry: OutboxEntry, timeout: float, cap: float) -> float:
    """Seconds after its last send before a report without a receipt is sent again.

    ``timeout`` doubles with each send, up to ``cap``, and is stretched by up to half again
    (jitter), so that devices cut off together do not all resend at the same instant. The
    jitter is drawn from the report id (uniformly random bytes) and the attempt number: it
    needs no stored state and differs between reports and attempts.
    """
    # Imported here: a command that only reads the state resends nothing.
    from runtime.backoff import Backoff  # noqa: PLC0415

    ceiling = Backoff(initial=timeout, cap=cap).ceiling(entry.attempts - 1)
    digest = hashlib.sha256(entry.report_id + entry.attempts.to_bytes(8, "big")).digest()
    fraction = int.from_bytes(digest[:4], "big") / 2**32
    return ceiling * (1.0 + fraction / 2)


# ---------------------------------------------------------------------- the outbox


def waiting(state: DeviceState, topic: Callable[[str], str]) -> list[Pending]:
    """Reports waiting for the broker, oldest first (none while the ledger is unreadable).

    Args:
        state: the state in force.
        topic: the MQTT topic of a use case's reports.
    """
    if state.consent is None or state.ledger_broken:
        return []
    out = [
        Pending(name, topic(name), e)
        for name, slot in state.slots.items()
        if slot.doc is not None and not slot.broken
        for e in slot.doc.outbox
    ]
    out.sort(key=lambda p: (p.entry.created, p.use_case))
    return out


def outbox_size(state: DeviceState) -> int:
    """Number of reports waiting."""
    return sum(len(s.doc.outbox) for s in state.slots.values() if s.doc is not None)


def due(pending: Sequence[Pending], now: float, timeout: float, cap: float) -> tuple[list[Pending], float | None]:
    """Of the reports ``pending``, those to send now (never sent, or sent with no receipt for
    :func:`receipt_wait`).

    Returns:
        The reports due, oldest first, and the earliest time a report not due now will be
        (None when nothing else waits).
    """
    out: list[Pending] = []
    later: float | None = None
    for p in pending:
        e = p.entry
        if e.attempts == 0:
            out.append(p)
            continue
        at = e.sent_at + receipt_wait(e, timeout, cap)
        if at <= now:
            out.append(p)
        elif later is None or at < later:
            later = at
    return out, later


def _outboxes(state: DeviceState, reports: Sequence[Pending], *, sent_at: float | None) -> dict[str, UseCaseDoc]:
    """The documents of the use cases of ``reports``, each from a copy, where those reports
    leave the outbox (``sent_at`` None: acknowledged or settled) or stay in it with the time of
    this send and one more send counted."""
    ids: dict[str, set[bytes]] = {}
    for p in reports:
        ids.setdefault(p.use_case, set()).add(p.entry.report_id)
    documents: dict[str, UseCaseDoc] = {}
    for name, these in ids.items():
        slot = state.slots.get(name)
        if slot is None or slot.doc is None or slot.broken:
            continue
        doc = copy.deepcopy(slot.doc)
        if sent_at is None:
            doc.outbox = [e for e in doc.outbox if e.report_id not in these]
        else:
            for e in doc.outbox:  # the copy's own entries
                if e.report_id in these:
                    e.sent_at = sent_at
                    e.attempts += 1
        documents[name] = doc
    return documents


# ---------------------------------------------------------------------- the ledger


def _ledger_entry(p: Pending, now: float, status: str, broker: str) -> LedgerEntry:
    """The ledger's entry of a report that left the device, with the records it was made of."""
    records = p.entry.sent_records
    return LedgerEntry(
        report_id=p.entry.report_id,
        use_case=p.use_case,
        period=p.entry.period,
        records=list(records) if records is not None else report_records(p.entry.payload),
        epsilon=p.entry.epsilon,
        day=p.entry.day,
        epsilon_today=p.entry.epsilon_today,
        epsilon_total=p.entry.epsilon_total,
        sent=now,
        status=status,
        broker=broker,
    )


def _restated(ledger: LedgerDoc, at: int, status: str, broker: str) -> None:
    """Replace entry ``at`` of the step's ledger with a copy that has ``status`` and ``broker``
    (the entry itself may be the state in force's: :func:`_current_ledger`)."""
    entry = copy.copy(ledger.entries[at])
    entry.status, entry.broker = status, broker
    ledger.entries[at] = entry


def _current_ledger(state: DeviceState, now: float, retention: float) -> LedgerDoc | None:
    """A copy of the ledger without what is older than ``retention`` seconds (None if unreadable).

    The copy's list is the step's own; its entries are shared with the state in force until a
    step changes one, which replaces it with a changed copy (:func:`_restated`): an
    acknowledgement only appends, and copying every entry of a ledger that holds weeks of
    reports was a fifth of a publish's CPU."""
    if state.ledger is None:
        return None
    return LedgerDoc(
        [e for e in state.ledger.entries if now - e.sent <= retention],
        [n for n in state.ledger.notices if now - n.at <= retention],
        device=state.ledger.device,
    )


def _readable_ledger(state: DeviceState, path: str) -> LedgerDoc:
    if state.ledger is None:
        raise StateUnreadableError(path, state.ledger_broken or "not loaded")
    return state.ledger


def ledger_entries(state: DeviceState, path: str) -> list[LedgerEntry]:
    """What left the device, oldest first (the caller checked consent).

    Raises:
        StateUnreadableError: if the ledger (its file ``path``) cannot be read.
    """
    return list(_readable_ledger(state, path).entries)


def ledger_notices(state: DeviceState, path: str) -> list[LedgerNotice]:
    """What registry changes did to the state, oldest first (the caller checked consent).

    Raises:
        StateUnreadableError: if the ledger (its file ``path``) cannot be read.
    """
    return list(_readable_ledger(state, path).notices)


def with_notices(
    state: DeviceState, notices: Sequence[LedgerNotice], *, now: float, retention: float
) -> LedgerDoc | None:
    """The ledger with ``notices`` appended (None if there are none, or if the ledger cannot be
    read: it gets none then, and the log has them)."""
    if not notices:
        return None
    ledger = _current_ledger(state, now, retention)
    if ledger is None:
        return None
    ledger.notices.extend(notices)
    return ledger


# ---------------------------------------------------------------------- sends and receipts


def acknowledge(
    state: DeviceState, acked: Sequence[Pending], *, now: float, retention: float, broker: str = ""
) -> Change:
    """Reports the ``broker`` acknowledged (without receipts): added to the ledger, then dropped
    from the outbox."""
    if not acked:
        return Change()
    ledger = _current_ledger(state, now, retention)
    if ledger is None:
        return Change()
    known = {e.report_id for e in ledger.entries}
    for p in acked:
        if p.entry.report_id in known:
            continue
        ledger.entries.append(_ledger_entry(p, now, "sent", broker))
        known.add(p.entry.report_id)
    return Change(_outboxes(state, acked, sent_at=None), ledger=ledger)


def mark_sent(state: DeviceState, sent: Sequence[Pending], *, now: float, retention: float, broker: str = "") -> Change:
    """Reports the ``broker`` acknowledged (with receipts): the ledger says "sent" (through that
    broker), and each stays in the outbox with the time of this send and its count, waiting for
    its receipt."""
    return _record_sends(state, [(p, "sent") for p in sent], now=now, retention=retention, broker=broker)


def mark_refused(
    state: DeviceState, refused: Sequence[tuple[Pending, str]], *, now: float, retention: float, broker: str = ""
) -> Change:
    """Sends the broker refused (a PUBACK reason code >= 0x80), each with the reason's name:
    the ledger says "refused by the broker: <reason>", and each report stays in the outbox as
    if sent, so that it is tried again only after :func:`receipt_wait` (ε is already spent)."""
    for p, reason in refused:
        log.warning("use case %s: the broker refused a report (%s); it is tried again later", p.use_case, reason)
    sends = [(p, BROKER_REFUSED + reason) for p, reason in refused]
    return _record_sends(state, sends, now=now, retention=retention, broker=broker)


def _record_sends(
    state: DeviceState, sends: Sequence[tuple[Pending, str]], *, now: float, retention: float, broker: str
) -> Change:
    """The ledger gets each report's status (a new entry, or a "sent" or a broker's refusal
    replaced), then each stays in the outbox with the time of this send and its count."""
    if not sends:
        return Change()
    ledger = _current_ledger(state, now, retention)
    if ledger is None:
        return Change()
    index = {e.report_id: i for i, e in enumerate(ledger.entries)}
    changed = False
    for p, status in sends:
        at = index.get(p.entry.report_id)
        if at is None:
            index[p.entry.report_id] = len(ledger.entries)
            ledger.entries.append(_ledger_entry(p, now, status, broker))
            changed = True
            continue
        entry = ledger.entries[at]
        if (entry.status == "sent" or entry.status.startswith(BROKER_REFUSED)) and (
            entry.status,
            entry.broker,
        ) != (status, broker):
            # The status and the broker of the latest send (a failover changes the broker).
            _restated(ledger, at, status, broker)
            changed = True
    documents = _outboxes(state, [p for p, _ in sends], sent_at=now)
    return Change(documents, ledger=ledger if changed else None)


def settle(
    state: DeviceState,
    receipts: Sequence[Receipt],
    pending: Sequence[Pending],
    *,
    now: float,
    retention: float,
    broker: str = "",
) -> tuple[Change, int]:
    """Commit receipts arrived: the ledger records the outcome, then the reports leave the outbox.

    Args:
        state: the state in force.
        receipts: the receipts.
        pending: the reports in the outbox (:func:`waiting`).
        now: the wall-clock time.
        retention: seconds the ledger keeps an entry.
        broker: the broker the receipts came through (the ledger records it).

    A receipt for a report no longer in the outbox (a second answer to a resend) is ignored.

    Returns:
        The change, and the number of reports it settles.
    """
    outcome = {r.correlation: ("counted" if r.counted else f"refused: {r.reason or 'unknown'}") for r in receipts}
    answered = [p for p in pending if p.entry.report_id in outcome]
    if not answered:
        return Change(), 0
    ledger = _current_ledger(state, now, retention)
    if ledger is None:
        return Change(), 0
    index = {e.report_id: i for i, e in enumerate(ledger.entries)}
    for p in answered:
        status = outcome[p.entry.report_id]
        at = index.get(p.entry.report_id)
        if at is None:
            ledger.entries.append(_ledger_entry(p, now, status, broker))
        else:
            _restated(ledger, at, status, broker)
        if status != "counted":
            log.warning("use case %s: the collector refused a report (%s)", p.use_case, status[9:])
    return Change(_outboxes(state, answered, sent_at=None), ledger=ledger), len(answered)
