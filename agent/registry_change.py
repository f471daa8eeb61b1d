"""Carrying the state over to a changed registry (docs/privacy-accounting.md, "Registry changes").

* A use case whose definition is unchanged keeps its file as it is, byte for byte.
* A changed one goes on from its state: records of open periods made under the old
  definition are staged at once under it; ε spent and the day's count carry over; if the
  mechanism's parameters changed under a drawn memo, a new memo is started and charged its
  longitudinal ε at once against the same lifetime cap.
* A removed one has its file wiped; the manifest keeps its ε spent (and whether it had a
  memo) so that, added back, it goes on from there instead of starting at 0.

Every change is written (the ledger's notice, the files, then the manifest) before anything
can be sent, so memory and disk agree from then on.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

from agent.accounting import EPSILON_SLACK, Budget, day_of
from agent.collection import stage
from agent.manifest import ManifestDoc, ManifestEntry
from agent.mechanism_calls import fingerprint, memo_charge, memos_held
from agent.outbox import add_notices
from agent.state import LedgerNotice, UseCaseDoc
from agent.statefiles import Slot, StateFiles, budget_of, new_use_case_doc
from protocol.interfaces import Privatization
from protocol.randomness import RandomSource
from protocol.registry import Period, Registry

__all__ = ["apply_registry"]

log = logging.getLogger("ldp_agent")


def apply_registry(
    files: StateFiles, registry: Registry, *, now: float, rng: RandomSource, ledger_retention: float
) -> None:
    """Carry the loaded state over to ``registry`` and write what changed (the manifest must be in force).

    Args:
        files: the state, just loaded under ``registry``.
        registry: the registry loaded.
        now: the wall-clock time.
        rng: device randomness (staging records of open periods, a new file's keys).
        ledger_retention: seconds the ledger keeps an entry.
    """
    manifest = files.manifest
    assert manifest is not None
    writes, notices = _carried_over(files, manifest, now, rng)
    stale = [slot.path for slot in files.slots.values() if slot.stale]
    removed = sorted(n for n, e in manifest.entries.items() if n not in registry.use_cases and not e.removed)
    for name in removed:
        entry, text = _tombstone(files, name, manifest.entries[name])
        manifest = manifest.with_entry(name, entry)
        notices.append(LedgerNotice(now, name, text))
        stale.append(files.use_case_path(name))
    if not writes and not removed and not stale:
        return
    for notice in notices:
        log.warning("use case %s: %s", notice.use_case, notice.text)
    add_notices(files, notices, now=now, retention=ledger_retention)
    files.manifest = manifest
    if writes:
        files.write_slots(writes)
    elif manifest != files.manifest_on_disk:
        files.write_manifest(manifest)
    # Last: the manifest already says these use cases are gone, so a crash before the unlink
    # leaves a file the next load recognises as wiped.
    files.unlink(stale)
    for slot in files.slots.values():
        slot.stale = False


def _carried_over(
    files: StateFiles, manifest: ManifestDoc, now: float, rng: RandomSource
) -> tuple[list[tuple[Slot, UseCaseDoc]], list[LedgerNotice]]:
    """The use cases of the registry whose state must change, the new state, and the notices."""
    writes: list[tuple[Slot, UseCaseDoc]] = []
    notices: list[LedgerNotice] = []
    for name, slot in files.slots.items():
        entry = manifest.entries.get(name)
        if slot.broken:
            continue
        if slot.doc is not None:
            carried = _changed(slot, slot.doc, now, rng)
        elif entry is not None and entry.removed:
            carried = _readded(slot, entry, now, rng)
        else:
            carried = None
        if carried is not None:
            writes.append((slot, carried[0]))
            notices.append(LedgerNotice(now, name, carried[1]))
    return writes, notices


def _changed(slot: Slot, doc: UseCaseDoc, now: float, rng: RandomSource) -> tuple[UseCaseDoc, str] | None:
    """The state carried over to the slot's definition, and the ledger's notice; None if unchanged."""
    uc = slot.use_case
    if doc.definition == uc.definition:
        return None
    same_mechanism = doc.fingerprint == fingerprint(uc)
    if doc.definition is None and same_mechanism and doc.period in (None, uc.period.value):
        # A file of the previous release, which recorded no definition, under the same mechanism
        # and period: the same use case as far as anything can tell. Adopted as it is; the
        # definition is recorded with the next write.
        doc.definition, doc.period = uc.definition, uc.period.value
        return None
    old = "an earlier definition" if doc.definition is None else f"{uc.name}@{doc.definition.hex()[:8]}"
    new = copy.deepcopy(doc)
    budget = budget_of(uc, doc).at(day_of(now))
    said = [f"the registry changed this use case from {old} to {uc.ref}"]
    staged = discarded = 0
    for period in sorted(new.pending):
        pending = new.pending.pop(period)
        definition = pending.definition or doc.definition
        if definition is None or pending.cost is None:
            # Made by the previous release under a definition nobody recorded: it cannot be
            # reported under its own, and was never charged.
            discarded += len(pending.records)
            continue
        budget, n, _, left_out = stage(
            uc, new, budget, period, pending.records, definition=definition, cost=pending.cost, now=now, rng=rng
        )
        staged += n
        new.unsent_records += left_out + pending.offered - len(pending.records)
    if staged:
        said.append(f"{staged} records of open periods staged under the old definition")
    if doc.period is not None and doc.period != uc.period.value:
        # Counter totals are kept per period of the old length: they cannot be reported under
        # the new one. Nothing of them was charged.
        discarded += sum(len(t) for t in new.totals.values())
        new.totals = {}
        old_seconds = Period(doc.period).seconds
        new.last_closed = ((doc.last_closed + 1) * old_seconds) // uc.period.seconds - 1
        said.append(f"period {doc.period} -> {uc.period.value}")
    if discarded:
        new.unsent_records += discarded
        said.append(f"{discarded} values of open periods discarded (never charged)")
    if not same_mechanism:
        charged = _new_memos(slot, new, budget, said)
        if charged is None:
            return None
        budget = charged
    new.fingerprint, new.definition, new.period = fingerprint(uc), uc.definition, uc.period.value
    new.budget = budget.to_plain()
    said.append(f"ε spent {budget.epsilon_total:.4g} of {budget.epsilon_cap:.4g}")
    return new, "; ".join(said)


def _memo_phrase(memos: int, charge: float) -> str:
    """The charge in words: ``2 new memos, each charged ε 1 (ε 2 in all)`` or ``a new memo, charged ε 1``."""
    if memos == 0:
        return "nothing charged (no memo had been drawn)"
    if memos == 1:
        return f"a new memo, charged ε {charge:.4g}"
    return f"{memos} new memos, each charged ε {charge:.4g} (ε {memos * charge:.4g} in all)"


def _new_memos(slot: Slot, new: UseCaseDoc, budget: Budget, said: list[str]) -> Budget | None:
    """Start the memos of changed parameters anew, one charge per memo redrawn; None (the slot
    stopped) if the lifetime cap cannot pay for them all.

    Every memo the state holds (one per counter key for 1BitMean and dBitFlipPM, one per value
    for RAPPOR) answered about its own value, so each new one drawn for that value adds its
    mechanism's longitudinal ε to what the reports of every generation reveal: the charges add
    up (docs/privacy-accounting.md, "Registry changes"). Memos a previous change started and
    that were never drawn are not redrawn and cost nothing more: that change paid for them.
    """
    uc = slot.use_case
    if not new.permanent:
        return budget
    # A state that holds no memo (RAPPOR's cohort and key before any value) is drawn anew for free.
    memos = memos_held(new.permanent)
    charge = memo_charge(uc)
    if not budget.fits(0, memos * charge):
        slot.broken = (
            f"the registry changed this use case's parameters under {memos} memos: "
            f"{_memo_phrase(memos, charge)} would cost more than the ε {budget.remaining().epsilon:.4g} its "
            "lifetime cap leaves; it stops (its memos are never redrawn for free)"
        )
        return None
    new.permanent = {}
    new.memo_generation += 1
    said.append(
        f"the mechanism's parameters changed under {memos} drawn memo{'' if memos == 1 else 's'} "
        f"({_memo_unit(slot)}): each is drawn anew (generation {new.memo_generation}) at its next use and can "
        f"reveal its value once more, up to the mechanism's longitudinal ε, so {_memo_phrase(memos, charge)} at "
        "once against the same lifetime cap"
    )
    return budget.spend(0, memos * charge)


def _memo_unit(slot: Slot) -> str:
    """What one memo of the slot's use case answers for."""
    return "one per distinct value" if slot.kind is Privatization.STRING else "one per counter key"


def _readded(slot: Slot, entry: ManifestEntry, now: float, rng: RandomSource) -> tuple[UseCaseDoc, str] | None:
    """A use case the registry had removed and has again: a fresh state that goes on from the
    ε spent the manifest kept (one new memo charged per memo the old state had drawn)."""
    uc = slot.use_case
    budget = budget_of(uc, UseCaseDoc(fingerprint=b"", hash_key=b"", budget=dict(entry.budget or {})))
    budget = budget.at(day_of(now))
    if budget.epsilon_total + EPSILON_SLACK < entry.epsilon_total:
        budget = replace(budget, epsilon_total=entry.epsilon_total)
    doc = new_use_case_doc(uc, rng)
    said = f"added back to the registry as {uc.ref}: its state starts anew"
    # A tombstone written before the count was kept says only whether a memo was drawn: one.
    memos = entry.memos if entry.memos is not None else int(entry.memo)
    if memos and slot.kind is not Privatization.EVENT:
        charge = memo_charge(uc)
        if not budget.fits(0, memos * charge):
            slot.broken = (
                f"added back to the registry, but {_memo_phrase(memos, charge)} for the {memos} memo"
                f"{'' if memos == 1 else 's'} its old state had drawn would cost more than the ε "
                f"{budget.remaining().epsilon:.4g} its lifetime cap leaves; it stops"
            )
            return None
        budget = budget.spend(0, memos * charge)
        doc.memo_generation = 1
        said += (
            f"; its old state had drawn {memos} memo{'' if memos == 1 else 's'} ({_memo_unit(slot)}): "
            f"{_memo_phrase(memos, charge)} at once"
        )
    doc.budget = budget.to_plain()
    return doc, f"{said}; ε spent {budget.epsilon_total:.4g} of {budget.epsilon_cap:.4g} (never reset)"


def _tombstone(files: StateFiles, name: str, entry: ManifestEntry) -> tuple[ManifestEntry, str]:
    """What the manifest keeps of a use case the registry removed, and the ledger's notice."""
    doc = files.read_use_case_doc(name)
    if doc is None:
        # Nothing readable to go by: keep the manifest's figure, and assume a memo was drawn (as
        # many as the ledger's reports show, at least one).
        memos = max(1, files.memos_recorded(name))
        tomb = ManifestEntry(entry.generation, entry.epsilon_total, removed=True, budget=None, memo=True, memos=memos)
        return (
            tomb,
            f"removed from the registry: its state was wiped; its ε spent ({entry.epsilon_total:.4g}) is kept",
        )
    saved = doc.budget.get("epsilon_total", 0.0)
    spent = max(entry.epsilon_total, float(saved) if isinstance(saved, int | float) else 0.0)
    # Memos a registry change started anew and that were never drawn were paid for by that change.
    memos = memos_held(doc.permanent)
    memo = memos > 0 or doc.memo_generation > 0
    tomb = ManifestEntry(entry.generation, spent, removed=True, budget=dict(doc.budget), memo=memo, memos=memos)
    lost = len(doc.outbox)
    text = (
        f"removed from the registry: its state was wiped (permanent randomness, open periods"
        f"{f', {lost} reports not yet delivered' if lost else ''}); its ε spent ({spent:.4g}) is kept should it "
        "come back"
    )
    return tomb, text
