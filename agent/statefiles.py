"""The agent's state directory: its sealed files, their copies in memory, and the manifest that
shows every use-case file is the latest one (docs/state-integrity.md).

:class:`StateFiles` is the one owner of the directory. It opens the files (consent, ledger,
manifest, one per use case), compares each use-case file with the manifest, and writes a
step's use-case files and then the manifest once, adopting the new documents in memory only
after every rename is durable. The agent's other parts (recording, collection, the outbox,
registry changes) change copies of the documents and hand them to :meth:`StateFiles.write_slots`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.accounting import EPSILON_SLACK, Budget
from agent.errors import StateUnreadableError
from agent.sealed import Sealer, fsync_directory
from agent.state import (
    AGENT_VERSION,
    CONSENT_VERSION,
    DEVICE_ID_BYTES,
    LEDGER_VERSION,
    MANIFEST_VERSION,
    USE_CASE_VERSION,
    AgentDoc,
    ConsentDoc,
    LedgerDoc,
    ManifestDoc,
    ManifestEntry,
    UseCaseDoc,
)
from agent.usecases import Kind, fingerprint, kind_of, load_permanent_state
from protocol.errors import StateError
from protocol.plain import Plain, PlainDoc
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import Registry, UseCase

__all__ = ["MANIFEST", "Slot", "StateFiles", "budget_of", "epsilon_total", "new_use_case_doc"]

log = logging.getLogger("ldp_agent")

SUFFIX = ".sealed"
MANIFEST = "manifest" + SUFFIX
_FILE_PREFIX = "uc-"


def _extends(old: Plain, new: Plain) -> bool:
    """True if ``new`` keeps every entry of ``old`` unchanged (memo tables only grow)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _extends(v, new[k]) for k, v in old.items())
    return bool(old == new)


@dataclass
class Slot:
    """One use case of the registry and its state as loaded.

    Attributes:
        use_case: the registry's definition.
        kind: when its mechanism privatizes.
        path: its sealed file.
        doc: the document as on disk (None: nothing recorded yet, or it stopped).
        broken: why the use case stopped (None while it runs).
        stale: the file of a use case the registry had removed, found again: removed at load.
    """

    use_case: UseCase
    kind: Kind
    path: Path
    doc: UseCaseDoc | None = None
    broken: str | None = None
    stale: bool = False


def budget_of(use_case: UseCase, doc: UseCaseDoc) -> Budget:
    """The accounting saved in ``doc`` under ``use_case``'s limits (a fresh budget if none was saved).

    Raises:
        ValueError: if the saved accounting is malformed.
    """
    if not doc.budget:
        return Budget(daily_limit=use_case.daily_limit, epsilon_cap=use_case.lifetime_epsilon)
    return Budget.from_plain(doc.budget, daily_limit=use_case.daily_limit, epsilon_cap=use_case.lifetime_epsilon)


def epsilon_total(use_case: UseCase, doc: UseCaseDoc) -> float:
    """The lifetime ε ``doc`` has charged."""
    return float(budget_of(use_case, doc).epsilon_total)


def new_use_case_doc(
    use_case: UseCase, rng: RandomSource, *, budget: PlainDoc | None = None, last_closed: int = -1
) -> UseCaseDoc:
    """A fresh document for ``use_case``: a new secret key for its keyed hashes, nothing recorded."""
    return UseCaseDoc(
        fingerprint=fingerprint(use_case),
        hash_key=random_bytes(rng, 32),
        budget=dict(budget or {}),
        last_closed=last_closed,
        definition=use_case.definition,
        period=use_case.period.value,
    )


class StateFiles:
    """The sealed files of one state directory and what is loaded from them.

    Args:
        directory: where the sealed files live (created with mode 0700).
        sealer: encrypts and decrypts the files.
        rng: draws the device identity of a new manifest.

    Attributes:
        consent: the consent record (None before the user opted in, or while it is unreadable).
        consent_broken: why the consent record does not open (None if it does or is absent).
        ledger: the ledger (None without consent, or while it is unreadable).
        ledger_broken: why the ledger does not open.
        manifest: the manifest in force (None without consent, or when it cannot be trusted).
        manifest_on_disk: the manifest as last read or written.
        slots: the registry's use cases by name, with their state (empty without consent).
    """

    def __init__(self, directory: Path, sealer: Sealer, rng: RandomSource) -> None:
        self.directory = directory
        self._sealer = sealer
        self._rng = rng
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        self.consent: ConsentDoc | None = None
        self.slots: dict[str, Slot] = {}
        self.ledger: LedgerDoc | None = None
        self.ledger_broken: str | None = None
        self.manifest: ManifestDoc | None = None
        self.manifest_on_disk: ManifestDoc | None = None
        self.consent_broken: str | None = None

    def path(self, name: str) -> Path:
        """The path of the state file ``name``."""
        return self.directory / name

    def use_case_path(self, name: str) -> Path:
        """The sealed file of use case ``name``."""
        return self.path(f"{_FILE_PREFIX}{name}{SUFFIX}")

    def _remove_stale_temporaries(self) -> None:
        # A crash between writing a temporary file and renaming it leaves it behind.
        for p in self.directory.glob(".*.tmp"):
            p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ loading

    def load(self, registry: Registry) -> None:
        """Open every file: consent, then (with consent) the ledger, the manifest and each use
        case of ``registry``, checked against the manifest (docs/design.md, invariant 2).

        A file written just before a crash moves the manifest forward at once; without a
        trustworthy manifest every use case stops. Carrying the state over to a changed registry
        is the caller's next step (:func:`agent.registry_change.apply_registry`).
        """
        self.consent = None
        self.slots = {}
        self.ledger = None
        self.ledger_broken = None
        self.manifest = None
        self.consent_broken = None
        try:
            raw = self._sealer.read(self.path("consent" + SUFFIX), "consent", CONSENT_VERSION)
            self.consent = None if raw is None else ConsentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            # Most often a key that is not the one the state was sealed with: say so, rather
            # than "the user has not opted in", which sends people to grant consent again.
            self.consent_broken = e.reason if isinstance(e, StateUnreadableError) else str(e)
            log.error("consent record is unreadable (%s); nothing is recorded or sent until it opens", e)
            self.consent = None
        if self.consent is None:
            return
        try:
            raw = self._sealer.read(self.path("ledger" + SUFFIX), "ledger", LEDGER_VERSION)
            self.ledger = LedgerDoc() if raw is None else LedgerDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            self.ledger_broken = str(e)
            log.error("the ledger is unreadable (%s): nothing is published until it is repaired", e)
        manifest, created, broken = self._read_manifest()
        loaded = {name: self._load_slot(uc) for name, uc in registry.use_cases.items()}
        if manifest is not None and broken is None:
            manifest, broken = self._check_generations(manifest, loaded, created=created)
        if broken is not None:
            # Without a trustworthy manifest no file can be shown fresh: every use case stops.
            log.error("%s", broken)
            for slot in loaded.values():
                slot.broken = slot.broken or broken
                slot.doc = None
        else:
            assert manifest is not None
            if manifest != self.manifest_on_disk:
                self.write_manifest(manifest)
            self.manifest = manifest
        for name, slot in loaded.items():
            self.slots[name] = slot

    def _load_slot(self, use_case: UseCase) -> Slot:
        slot = Slot(use_case, kind_of(use_case), self.use_case_path(use_case.name))
        try:
            raw = self._sealer.read(slot.path, f"usecase:{use_case.name}", USE_CASE_VERSION)
            if raw is None:
                return slot
            doc = UseCaseDoc.from_plain(raw)
            budget_of(use_case, doc)  # validates the saved accounting
            # Permanent state is checked against the mechanism it was drawn for; under changed
            # parameters it is replaced by a new memo (agent.registry_change), never read.
            if doc.fingerprint == fingerprint(use_case):
                for data in doc.permanent.values():
                    load_permanent_state(use_case, data)  # validates the saved permanent state
        except StateUnreadableError as e:
            slot.broken = f"state unreadable: {e.reason} ({slot.path})"
        except (ValueError, StateError) as e:
            slot.broken = f"state does not parse: {e} ({slot.path})"
        else:
            slot.doc = doc
        return slot

    def read_use_case_doc(self, name: str) -> UseCaseDoc | None:
        """The document in use case ``name``'s file, or None if it is missing or does not open."""
        try:
            raw = self._sealer.read(self.use_case_path(name), f"usecase:{name}", USE_CASE_VERSION)
            return None if raw is None else UseCaseDoc.from_plain(raw)
        except (StateUnreadableError, ValueError):
            return None

    def _read_manifest(self) -> tuple[ManifestDoc | None, bool, str | None]:
        """The manifest, whether it was just created, and why the whole state is suspect (or None)."""
        path = self.path(MANIFEST)
        self.manifest_on_disk = None
        try:
            raw = self._sealer.read(path, "manifest", MANIFEST_VERSION)
            if raw is not None:
                self.manifest_on_disk = ManifestDoc.from_plain(raw)
                return self.manifest_on_disk, False, None
        except StateUnreadableError as e:
            return None, False, f"the state manifest {path} is unreadable ({e.reason}); no use case can be shown fresh"
        except ValueError as e:
            return None, False, f"the state manifest {path} does not parse ({e}); no use case can be shown fresh"
        # No manifest: a new state directory, one written before manifests existed, or a crash
        # between granting consent and writing it. _check_generations refuses files that name one.
        device = random_bytes(self._rng, DEVICE_ID_BYTES)
        return ManifestDoc(device=device), True, None

    # ------------------------------------------------------------------ the manifest checks

    def _check_generations(
        self, manifest: ManifestDoc, slots: dict[str, Slot], *, created: bool
    ) -> tuple[ManifestDoc, str | None]:
        """Compare each use-case file with the manifest (docs/design.md, invariant 2).

        Marks the slots whose file is missing, older or another device's; moves the manifest one
        step forward for a file written just before a crash. Returns the manifest to keep and,
        when the manifest itself is missing while files were written under one, the reason every
        use case stops.
        """
        path = self.path(MANIFEST)
        for name, slot in slots.items():
            doc = slot.doc
            if created and doc is not None and doc.device is not None:
                return manifest, (
                    f"the state manifest {path} is missing but {slot.path} was written under one (generation "
                    f"{doc.generation}): the manifest was deleted or the state directory partly restored. Every use "
                    "case stops rather than redraw permanent randomness; revoke and grant consent to start over"
                )
            entry = manifest.entries.get(name)
            if slot.broken:
                continue
            if entry is not None and entry.removed and doc is not None and not _completes_readd(doc, entry, manifest):
                # The wiped file of a use case the registry had removed (a crash before its unlink, or
                # a restored copy): it is never read again; the use case, added back, starts anew
                # from what the manifest kept (agent.registry_change).
                slot.doc = doc = None
                slot.stale = True
            if doc is None:
                if entry is not None and not entry.removed:
                    slot.broken = (
                        f"state file {slot.path} is missing; the manifest expects generation {entry.generation}. "
                        "Its permanent randomness and ε spent are not redrawn or reset"
                    )
                continue
            if doc.device is None:
                # Written before manifests existed: adopt it once, as generation 0.
                if entry is None:
                    manifest = manifest.with_entry(name, ManifestEntry(0, epsilon_total(slot.use_case, doc)))
                else:
                    slot.broken = (
                        f"state file {slot.path} is an older copy (no generation; the manifest expects "
                        f"generation {entry.generation})"
                    )
                continue
            if doc.device != manifest.device:
                slot.broken = (
                    f"state file {slot.path} belongs to another device's state (device {doc.device.hex()}, this "
                    f"device is {manifest.device.hex()}): it was copied in"
                )
                continue
            manifest = self._check_generation(name, slot, doc, entry, manifest)
        return manifest, None

    def _check_generation(
        self, name: str, slot: Slot, doc: UseCaseDoc, entry: ManifestEntry | None, manifest: ManifestDoc
    ) -> ManifestDoc:
        """Compare the generation and ε spent of one of this device's files with its manifest entry."""
        expected = 0 if entry is None else entry.generation
        spent = epsilon_total(slot.use_case, doc)
        floor = 0.0 if entry is None else entry.epsilon_total
        if doc.generation < expected:
            slot.broken = (
                f"state file {slot.path} is an older copy (generation {doc.generation}; the manifest expects "
                f"{expected}): it was rolled back"
            )
        elif doc.generation > expected + 1:
            slot.broken = (
                f"state file {slot.path} is ahead of the manifest (generation {doc.generation}; the manifest "
                f"has {expected}): the manifest {self.path(MANIFEST)} was rolled back"
            )
        elif spent + EPSILON_SLACK < floor:
            slot.broken = f"state file {slot.path} has spent ε {spent:g}, less than the {floor:g} the manifest recorded"
        elif doc.generation == expected + 1:
            # The write of the file landed and the manifest's did not (a crash between the two
            # renames). Accepted exactly once: the manifest moves forward before anything else.
            log.warning("use case %s: completing a state write interrupted by a crash (%s)", name, slot.path)
            manifest = manifest.with_entry(name, ManifestEntry(doc.generation, spent))
        return manifest

    # ------------------------------------------------------------------ writing

    def write_manifest(self, manifest: ManifestDoc) -> None:
        """Seal and write the manifest."""
        self._sealer.write(self.path(MANIFEST), "manifest", MANIFEST_VERSION, manifest.to_plain())
        self.manifest_on_disk = manifest

    def write_slots(self, writes: Sequence[tuple[Slot, UseCaseDoc]]) -> None:
        """Write use-case documents, then the manifest once, then adopt them in memory.

        Files first, manifest second: a crash between leaves each written file exactly one
        generation ahead of the manifest (each use case is written once per call), which the
        loader accepts once (see agent.state); the reverse order would leave a file behind its
        manifest, indistinguishable from a rollback. One manifest write per step (a collection
        cycle writes every use case) keeps the cost at one extra fsync'd rename per step.
        """
        if not writes:
            return
        manifest = self.manifest
        if manifest is None:
            raise RuntimeError("no state manifest; refusing to write")
        names = [slot.use_case.name for slot, _ in writes]
        if len(set(names)) != len(names):
            raise RuntimeError(f"use cases written twice in one step: {names}")
        updated = manifest
        for slot, doc in writes:
            name = slot.use_case.name
            new_memo = slot.doc is not None and doc.memo_generation == slot.doc.memo_generation + 1
            if slot.doc is not None and not new_memo and not _extends(slot.doc.permanent, doc.permanent):
                # A bug, never a runtime condition: permanent randomness is append-only (a registry
                # change starts a new memo only with a new memo generation, charged; agent.registry_change).
                raise RuntimeError(f"use case {name}: permanent state would change; refusing to write")
            entry = manifest.entries.get(name)
            spent = epsilon_total(slot.use_case, doc)
            if entry is not None and spent + EPSILON_SLACK < entry.epsilon_total:
                raise RuntimeError(f"use case {name}: ε spent would go down; refusing to write")
            doc.device = manifest.device
            doc.generation = (0 if entry is None else entry.generation) + 1
            self._sealer.write(slot.path, f"usecase:{name}", USE_CASE_VERSION, doc.to_plain())
            updated = updated.with_entry(name, ManifestEntry(doc.generation, spent))
        self.write_manifest(updated)
        self.manifest = updated
        for slot, doc in writes:
            slot.doc = doc

    def write_ledger(self, ledger: LedgerDoc) -> None:
        """Seal and write the ledger, then adopt it."""
        self._sealer.write(self.path("ledger" + SUFFIX), "ledger", LEDGER_VERSION, ledger.to_plain())
        self.ledger = ledger

    def write_consent(self, doc: ConsentDoc) -> None:
        """Seal and write the consent record (the caller loads the state again)."""
        self._sealer.write(self.path("consent" + SUFFIX), "consent", CONSENT_VERSION, doc.to_plain())

    def read_schedule(self) -> AgentDoc:
        """The schedule bookkeeping (a fresh one if missing or unreadable: it holds no randomness)."""
        try:
            raw = self._sealer.read(self.path("agent" + SUFFIX), "agent", AGENT_VERSION)
            return AgentDoc() if raw is None else AgentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            log.warning("schedule state unreadable (%s); starting a new schedule", e)
            return AgentDoc()

    def write_schedule(self, doc: AgentDoc) -> None:
        """Seal and write the schedule bookkeeping."""
        self._sealer.write(self.path("agent" + SUFFIX), "agent", AGENT_VERSION, doc.to_plain())

    # ------------------------------------------------------------------ removing

    def unlink(self, paths: list[Path]) -> None:
        """Remove files (missing ones are fine), then fsync the directory once."""
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            fsync_directory(self.directory)

    def remove_all(self) -> int:
        """Delete every state file: consent first, the manifest last. Returns how many were removed.

        Consent goes first: a crash half-way leaves an agent that is opted out. The manifest goes
        last, so a half-finished removal never leaves use-case files without their manifest.
        """
        removed = 0
        consent_path = self.path("consent" + SUFFIX)
        if consent_path.exists():
            consent_path.unlink()
            removed += 1
            fsync_directory(self.directory)
        for p in sorted(self.directory.iterdir(), key=lambda p: (p.name == MANIFEST, p.name)):
            if p.is_file() and (p.name.endswith(SUFFIX) or p.name.endswith(".tmp")):
                p.unlink()
                removed += 1
                if p.name == MANIFEST:
                    fsync_directory(self.directory)
        fsync_directory(self.directory)
        return removed


def _completes_readd(doc: UseCaseDoc, entry: ManifestEntry, manifest: ManifestDoc) -> bool:
    """A use case added back wrote its first file and crashed before the manifest followed."""
    return doc.device == manifest.device and doc.generation == entry.generation + 1
