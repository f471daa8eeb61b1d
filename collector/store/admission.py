"""What a commit decides about its reports, the same in both store backends.

A commit hands the store a batch of reports; each backend finds, with its own SQL inside its
own transaction, the low-water marks, the report ids already stored and the allowance already
used. What it then decides is the same in SQLite and in PostgreSQL, and lives here once:

* which reports are below their use case's low-water mark (``expired``);
* which device identity each report id arrived under (:func:`senders_by_report`);
* which (use case, period, keyed tag) slot each identified report claims, and which reports
  fit the room their slot has left under :func:`~collector.store.interface.report_allowance`
  (:func:`claim_allowance`, :func:`within_room`);
* the counters and the :class:`~collector.store.interface.CommitResult` that follow
  (:class:`Verdict`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from collector.store.interface import CommitResult, FoldedReport, report_allowance
from collector.store.row_format import allowance_tag, total_counters

__all__ = ["Claims", "Slot", "Verdict", "claim_allowance", "senders_by_report", "within_room"]

Slot = tuple[int, int, bytes]
"""What the per-device allowance counts by: use case id, period, keyed tag of the identity."""


def senders_by_report(reports: Sequence[FoldedReport], senders: Sequence[bytes] | None) -> dict[bytes, bytes]:
    """Each report id's sender (the first one that names it), for the per-device allowance.

    Raises:
        ValueError: ``senders`` is not parallel to ``reports``.
    """
    sender_of: dict[bytes, bytes] = {}
    if senders is not None:
        if len(senders) != len(reports):
            raise ValueError(f"{len(senders)} senders for {len(reports)} reports")
        for r, sender in zip(reports, senders, strict=True):
            if sender:
                sender_of.setdefault(r.report_id, sender)
    return sender_of


@dataclass
class Verdict:
    """What one commit decided about its reports, step by step.

    Attributes:
        handed: reports the commit was given.
        current: those at or above their use case's low-water mark.
        expired_ids: the report ids below it (their receipts say so).
        fresh: the current reports folded (not stored before, within the allowance).
        over: reports refused as over the allowance.
        over_ids: their report ids.
    """

    handed: int
    current: list[FoldedReport]
    expired_ids: frozenset[bytes]
    fresh: list[FoldedReport] = field(default_factory=list)
    over: int = 0
    over_ids: frozenset[bytes] = frozenset()

    @classmethod
    def of(cls, reports: Sequence[FoldedReport], lows: Mapping[int, int], uc_of: Mapping[str, int]) -> Verdict:
        """The reports at or above their use case's stored low-water mark (``lows`` by use case id)."""
        current = [r for r in reports if r.period >= lows[uc_of[r.use_case.ref]]]
        expired = len(reports) - len(current)
        expired_ids = (
            frozenset(r.report_id for r in reports if r.period < lows[uc_of[r.use_case.ref]])
            if expired
            else frozenset()
        )
        return cls(len(reports), current, expired_ids)

    @property
    def expired(self) -> int:
        """Reports refused as below the low-water mark."""
        return self.handed - len(self.current)

    @property
    def duplicates(self) -> int:
        """Current reports whose id was stored already (or repeated within the commit)."""
        return len(self.current) - len(self.fresh) - self.over

    def refuse_over(self, kept: list[FoldedReport], over: int) -> list[FoldedReport]:
        """Keep ``kept`` of the fresh reports, the others being over the allowance; the refused ones."""
        before, self.fresh, self.over = self.fresh, kept, over
        if not over:
            return []
        ids = {r.report_id for r in kept}
        refused = [r for r in before if r.report_id not in ids]
        self.over_ids = frozenset(r.report_id for r in refused)
        return refused

    def counters(self, counters: Mapping[str, int], records: int) -> dict[str, int]:
        """Ingest's ``counters`` with what the commit itself decided added."""
        return total_counters(
            counters,
            fresh=len(self.fresh),
            records=records,
            expired=self.expired,
            duplicates=self.duplicates,
            over=self.over,
        )

    def result(self, records: int, start: float, keys: Sequence[tuple[str, int]]) -> CommitResult:
        """The commit's result; ``start`` is when it began (``time.perf_counter``)."""
        return CommitResult(
            len(self.fresh),
            records,
            self.duplicates,
            self.expired,
            time.perf_counter() - start,
            tuple(keys),
            self.over,
            self.expired_ids,
            self.over_ids,
        )


@dataclass
class Claims:
    """The allowance slots a commit's identified reports claim.

    Attributes:
        slots: per report (parallel to the reports judged), its slot; None for a report that
            came under no device identity.
        want: reports claiming each slot, in the order the slots first appear.
        cap: each slot's allowance.
    """

    slots: list[Slot | None]
    want: dict[Slot, int]
    cap: dict[Slot, int]


def claim_allowance(
    fresh: Sequence[FoldedReport],
    sender_of: Mapping[bytes, bytes],
    uc_of: Mapping[str, int],
    key_of: Callable[[int, int], bytes],
) -> Claims:
    """The slot each of ``fresh`` claims: its use case, period and the keyed tag of its sender.

    ``key_of(uc, period)`` is the (use case, period)'s random key; it is asked in the order the
    keys are first needed.
    """
    slots: list[Slot | None] = []
    want: dict[Slot, int] = {}
    cap: dict[Slot, int] = {}
    for r in fresh:
        sender = sender_of.get(r.report_id)
        if sender is None:
            slots.append(None)
            continue
        uc = uc_of[r.use_case.ref]
        slot = (uc, r.period, allowance_tag(sender, key_of(uc, r.period)))
        slots.append(slot)
        want[slot] = want.get(slot, 0) + 1
        cap[slot] = report_allowance(r.use_case)
    return Claims(slots, want, cap)


def within_room(
    fresh: Sequence[FoldedReport], slots: Sequence[Slot | None], room: Mapping[Slot, int]
) -> tuple[list[FoldedReport], int]:
    """The reports that fit the room their slot has left (the first ones of each slot, in order),
    and how many did not; a report with no slot is always kept."""
    left = dict(room)
    kept: list[FoldedReport] = []
    over = 0
    for r, slot in zip(fresh, slots, strict=True):
        if slot is None:
            kept.append(r)
        elif left[slot] > 0:
            left[slot] -= 1
            kept.append(r)
        else:
            over += 1
    return kept, over
