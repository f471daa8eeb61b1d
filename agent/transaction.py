"""The transaction of the device's state: a step's change, computed purely, sealed in one place.

Every step that changes use cases (recording values, a collection cycle closing periods and
staging reports, the broker's acknowledgements and the collector's receipts, a registry
change) goes the same way:

1. it computes a :class:`Change` from the :class:`~agent.device_state.DeviceState` in force,
   without writing anything and without changing that state: new documents for the use cases it
   changes (each computed from a copy of its document), the ledger if it changes;
2. :func:`commit` writes the change and returns the state that follows, which
   :class:`agent.core.Agent` adopts only then, so nothing drawn in a step can be published
   before every write of it is durable (docs/state-integrity.md, "The manifest").

:func:`commit` is the one place a use case's document is sealed, and it writes in this order:

* the ledger, bound to the manifest's device: the ledger before the outbox, so a crash
  between the two resends bytes the collector de-duplicates by report id while the ledger
  keeps one entry per id (:mod:`agent.outbox`); the first ledger written under a manifest is
  recorded in it at once (the manifest in force, marked as having a ledger), so deleting the
  ledger is seen from then on (docs/state-integrity.md);
* each changed use case's file at generation ``g + 1`` (each at most once per step);
* the manifest once, with the new generations: files first, so a crash between leaves a
  file exactly one generation ahead, which the loader accepts once (:mod:`agent.loading`);
* the consent record, when a use-case file was written and consent names no device yet (a
  grant of the previous release): the first step that writes binds it to the manifest, as
  docs/state-integrity.md ("Consent, the ledger and the schedule name the device") says;
* the files of use cases the step removed, unlinked last: the manifest already says they are
  gone, so a crash before the unlink leaves a file the next load recognises as wiped.

Each of these is one atomic write of one file (:class:`agent.statefiles.StateFiles`); none
has a side effect on another. The use-case files' renames are made durable together, by one
fsync of the state directory before the manifest is written (one instead of one per file: a
cycle writes every use case's file twice), so the order above holds on disk: a crash before
that fsync leaves each file at its old or its new generation, both of which the loader takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.accounting import EPSILON_SLACK
from agent.device_state import DeviceState, Slot, epsilon_total
from agent.manifest import ManifestDoc, ManifestEntry, with_ledger_flag
from agent.state import LedgerDoc, UseCaseDoc
from agent.statefiles import StateFiles
from protocol.plain import Plain

__all__ = ["Change", "commit"]


@dataclass(frozen=True, slots=True)
class Change:
    """What one step changes, computed from the state in force without writing anything.

    Attributes:
        documents: use-case name -> its new document, written in this order. Each is the
            step's own copy, which nothing else holds: the commit sets its device and
            generation, and the state that follows holds it.
        ledger: the new ledger (None: unchanged), the step's own copy too: the commit binds it
            to the manifest's device.
        manifest: the manifest to go on from (None: the one in force); a registry change
            records in it what remains of the use cases it removed.
        stopped: use cases the step stops, with the reason (a registry change whose new memos
            the lifetime cap cannot pay); they are not written.
        removed: files of removed use cases, unlinked once the manifest no longer names them.
    """

    documents: Mapping[str, UseCaseDoc] = field(default_factory=dict)
    ledger: LedgerDoc | None = None
    manifest: ManifestDoc | None = None
    stopped: Mapping[str, str] = field(default_factory=dict)
    removed: tuple[Path, ...] = ()

    @property
    def empty(self) -> bool:
        """True if the change writes nothing and changes nothing."""
        return not (self.documents or self.ledger or self.manifest or self.stopped or self.removed)


def _extends(old: Plain, new: Plain) -> bool:
    """True if ``new`` keeps every entry of ``old`` unchanged (memo tables only grow)."""
    if old == new:
        return True  # the common case (nothing drawn), decided by one comparison in C
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _extends(v, new[k]) for k, v in old.items())
    return bool(old == new)


def _checked(slot: Slot, doc: UseCaseDoc, entry: ManifestEntry | None) -> float:
    """The lifetime ε ``doc`` has spent, once it is shown to keep the slot's permanent randomness
    and ε spent: a change that would redraw the one or lower the other is a bug, never a
    runtime condition, and is refused before anything is written."""
    name = slot.use_case.name
    old = slot.doc
    new_memo = old is not None and doc.memo_generation == old.memo_generation + 1
    if old is not None and not new_memo and not _extends(old.permanent, doc.permanent):
        # Permanent randomness is append-only: a registry change starts a new memo only with a
        # new memo generation, charged (agent.registry_change).
        raise RuntimeError(f"use case {name}: permanent state would change; refusing to write")
    spent = epsilon_total(slot.use_case, doc)
    if entry is not None and spent + EPSILON_SLACK < entry.epsilon_total:
        raise RuntimeError(f"use case {name}: ε spent would go down; refusing to write")
    return spent


def commit(files: StateFiles, state: DeviceState, change: Change) -> DeviceState:
    """Write ``change`` in the order of the module's docstring and return the state that follows.

    Raises:
        StateWriteError: a write failed (a full disk); nothing of the change is adopted, and
            what was written before the failure is either ignored at the next load (the
            ledger's entries are kept once per id) or accepted once (a file one generation
            ahead of the manifest).
        RuntimeError: a bug: use-case documents without a manifest in force, permanent state
            that would change, or ε spent that would go down.
    """
    if change.empty:
        return state
    manifest = change.manifest or state.manifest
    if change.documents and manifest is None:
        raise RuntimeError("no state manifest; refusing to write")
    ledger = state.ledger
    if change.ledger is not None:
        ledger = change.ledger
        if manifest is not None:
            ledger.device = manifest.device
        files.write_ledger(ledger)
        on_disk = state.manifest
        if on_disk is not None and not on_disk.ledger:
            # The first ledger under a manifest is recorded in it at once, before the step's
            # other files: deleting the ledger is seen even if the step stops here.
            files.write_manifest(with_ledger_flag(on_disk, ledger))
    slots = dict(state.slots)
    consent = state.consent
    if manifest is not None:
        for name, doc in change.documents.items():
            entry = manifest.entries.get(name)
            slot = slots[name]
            spent = _checked(slot, doc, entry)
            doc.device = manifest.device
            doc.generation = (0 if entry is None else entry.generation) + 1
            files.write_use_case(name, doc, sync_directory=False)
            manifest = manifest.with_entry(name, ManifestEntry(doc.generation, spent))
            slots[name] = Slot(slot.use_case, slot.kind, slot.path, doc, slot.broken, slot.stale)
        if change.documents:
            files.sync()  # every use-case file's rename durable before the manifest names it
        manifest = with_ledger_flag(manifest, ledger)
        if change.documents or manifest != files.manifest_on_disk:
            files.write_manifest(manifest)
        if change.documents and consent is not None and consent.device is None:
            consent = replace(consent, device=manifest.device)
            files.write_consent(consent)
    for name, reason in change.stopped.items():
        slots[name] = replace(slots[name], broken=reason)
    if change.removed:
        files.unlink(list(change.removed))
        slots = {name: replace(slot, stale=False) if slot.stale else slot for name, slot in slots.items()}
    return state.after(consent=consent, ledger=ledger, manifest=manifest, slots=slots)
