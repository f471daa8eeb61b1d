"""Carrying the state over to a changed registry (docs/privacy-accounting.md, "Registry changes").

* A use case whose definition is unchanged keeps its file as it is, byte for byte.
* A changed one goes on from its state: records of open periods made under the old
  definition are staged at once under it; ε spent and the day's count carry over; if the
  mechanism's parameters changed under a drawn memo, a new memo is started and charged its
  longitudinal ε at once against the same lifetime cap.
* A removed one has its file wiped; the manifest keeps its ε spent (and whether it had a
  memo) so that, added back, it goes on from there instead of starting at 0.

Every change is computed as a :class:`~agent.transaction.Change` (the ledger's notices, the
new documents, the manifest with what remains of the removed use cases, the files to wipe)
and written by :func:`agent.transaction.commit` (the ledger's notice, the files, the manifest,
then the wiped files unlinked) before anything can be sent, so memory and disk agree from
then on.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

from agent.accounting import EPSILON_SLACK, Budget, day_of
from agent.device_state import DeviceState, Slot, budget_of, memos_recorded, new_use_case_doc
from agent.manifest import ManifestDoc, ManifestEntry
from agent.mechanism_calls import fingerprint, memo_charge, memos_held
from agent.outbox import with_notices
from agent.state import LedgerNotice, UseCaseDoc
from agent.statefiles import StateFiles
from agent.transaction import Change
from protocol.interfaces import Privatization
from protocol.randomness import RandomSource
from protocol.registry import Period, Registry

__all__ = ["carried_over"]

log = logging.getLogger("ldp_agent")


def carried_over(
    files: StateFiles, state: DeviceState, registry: Registry, *, now: float, rng: RandomSource, ledger_retention: float
) -> Change:
    """What carrying the loaded state over to ``registry`` changes (the manifest must be in force).

    Args:
        files: the state directory (a removed use case's file is read for what the manifest keeps).
        state: the state just loaded under ``registry``.
        registry: the registry loaded.
        now: the wall-clock time.
        rng: device randomness (staging records of open periods, a new file's keys).
        ledger_retention: seconds the ledger keeps an entry.
    """
    manifest = state.manifest
    assert manifest is not None
    documents, stopped, notices = _changes(state, manifest, now, rng)
    stale = [slot.path for slot in state.slots.values() if slot.stale]
    removed = sorted(n for n, e in manifest.entries.items() if n not in registry.use_cases and not e.removed)
    for name in removed:
        entry, text = _tombstone(files, state, name, manifest.entries[name])
        manifest = manifest.with_entry(name, entry)
        notices.append(LedgerNotice(now, name, text))
        # Unlinked by the commit after the manifest that says the use case is gone, so a crash
        # before the unlink leaves a file the next load recognises as wiped (agent.transaction).
        stale.append(files.use_case_path(name))
    if not documents and not removed and not stale:
        return Change(stopped=stopped)  # nothing to write
    for notice in notices:
        log.warning("use case %s: %s", notice.use_case, notice.text)
    return Change(
        documents,
        ledger=with_notices(state, notices, now=now, retention=ledger_retention),
        manifest=manifest,
        stopped=stopped,
        removed=tuple(stale),
    )


def _changes(
    state: DeviceState, manifest: ManifestDoc, now: float, rng: RandomSource
) -> tuple[dict[str, UseCaseDoc], dict[str, str], list[LedgerNotice]]:
    """The use cases of the registry whose state must change, the new state, those that stop
    and why, and the notices."""
    documents: dict[str, UseCaseDoc] = {}
    stopped: dict[str, str] = {}
    notices: list[LedgerNotice] = []
    for name, slot in state.slots.items():
        entry = manifest.entries.get(name)
        if slot.broken:
            continue
        if slot.doc is not None:
            carried = _changed(slot, slot.doc, now, rng)
        elif entry is not None and entry.removed:
            carried = _readded(slot, entry, now, rng)
        else:
            continue
        if isinstance(carried, str):
            stopped[name] = carried
        elif carried is not None:
            documents[name] = carried[0]
            notices.append(LedgerNotice(now, name, carried[1]))
    return documents, stopped, notices


def _changed(slot: Slot, doc: UseCaseDoc, now: float, rng: RandomSource) -> tuple[UseCaseDoc, str] | str | None:
    """The state carried over to the slot's definition, and the ledger's notice; None if
    unchanged; why it stops if its new memos cannot be paid for."""
    uc = slot.use_case
    if doc.definition == uc.definition:
        return None
    # Imported here: opening an unchanged state (every command, every start) stages nothing.
    from agent.collection import stage  # noqa: PLC0415

    same_mechanism = doc.fingerprint == fingerprint(uc)
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
        charged = stage(uc, budget, period, pending.records, definition=definition, cost=pending.cost, now=now, rng=rng)
        budget = charged.budget
        if charged.entry is not None:
            new.outbox.append(charged.entry)
            staged += charged.entry.records
        new.unsent_records += charged.left_out + pending.offered - len(pending.records)
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
        charged_memos = _new_memos(slot, new, budget, said)
        if isinstance(charged_memos, str):
            return charged_memos
        budget = charged_memos
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


def _new_memos(slot: Slot, new: UseCaseDoc, budget: Budget, said: list[str]) -> Budget | str:
    """Start the memos of changed parameters anew in ``new`` (the change's copy), one charge per
    memo redrawn; why the use case stops if the lifetime cap cannot pay for them all.

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
        return (
            f"the registry changed this use case's parameters under {memos} memos: "
            f"{_memo_phrase(memos, charge)} would cost more than the ε {budget.remaining().epsilon:.4g} its "
            "lifetime cap leaves; it stops (its memos are never redrawn for free)"
        )
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


def _readded(slot: Slot, entry: ManifestEntry, now: float, rng: RandomSource) -> tuple[UseCaseDoc, str] | str:
    """A use case the registry had removed and has again: a fresh state that goes on from the
    ε spent the manifest kept (one new memo charged per memo the old state had drawn), and the
    ledger's notice; or why it stops, if its lifetime cap cannot pay for those memos."""
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
            return (
                f"added back to the registry, but {_memo_phrase(memos, charge)} for the {memos} memo"
                f"{'' if memos == 1 else 's'} its old state had drawn would cost more than the ε "
                f"{budget.remaining().epsilon:.4g} its lifetime cap leaves; it stops"
            )
        budget = budget.spend(0, memos * charge)
        doc.memo_generation = 1
        said += (
            f"; its old state had drawn {memos} memo{'' if memos == 1 else 's'} ({_memo_unit(slot)}): "
            f"{_memo_phrase(memos, charge)} at once"
        )
    doc.budget = budget.to_plain()
    return doc, f"{said}; ε spent {budget.epsilon_total:.4g} of {budget.epsilon_cap:.4g} (never reset)"


def _tombstone(files: StateFiles, state: DeviceState, name: str, entry: ManifestEntry) -> tuple[ManifestEntry, str]:
    """What the manifest keeps of a use case the registry removed, and the ledger's notice."""
    doc = files.read_use_case_doc(name)
    if doc is None:
        # Nothing readable to go by: keep the manifest's figure, and assume a memo was drawn (as
        # many as the ledger's reports show, at least one).
        memos = max(1, memos_recorded(files, state, name))
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
