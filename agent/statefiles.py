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
from dataclasses import dataclass, replace
from pathlib import Path

from agent.accounting import EPSILON_SLACK, Budget
from agent.errors import StateUnreadableError, StateWriteError
from agent.manifest import ManifestDoc, ManifestEntry
from agent.mechanism_calls import fingerprint, load_permanent_state, memos_held, privatization_of
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
    UseCaseDoc,
    ledger_from_v1,
)
from protocol.errors import StateError
from protocol.interfaces import Privatization
from protocol.plain import Plain, PlainDoc
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import Registry, UseCase

__all__ = ["MANIFEST", "RE_ENROL", "Slot", "StateFiles", "budget_of", "epsilon_total", "new_use_case_doc"]

log = logging.getLogger("ldp_agent")

SUFFIX = ".sealed"
MANIFEST = "manifest" + SUFFIX
_FILE_PREFIX = "uc-"

RE_ENROL = (
    "`ldp-agent re-enrol` (with the daemon stopped) starts the affected use cases anew with new permanent "
    "randomness, carrying their ε spent forward and charging each new memo (docs/state-integrity.md)"
)
"""What the operator can do about state that stopped because files were deleted or replaced."""


def _saved_epsilon(budget: object) -> float:
    """The lifetime ε a saved accounting (``Budget.to_plain``) records, 0 if it records none."""
    value = budget.get("epsilon_total", 0.0) if isinstance(budget, dict) else 0.0
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _extends(old: Plain, new: Plain) -> bool:
    """True if ``new`` keeps every entry of ``old`` unchanged (memo tables only grow)."""
    if old == new:
        return True  # the common case (nothing drawn), decided by one comparison in C
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
    kind: Privatization
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
        ledger_note: a deleted ledger the manifest says had been written (a new one was started).
        manifest: the manifest in force (None without consent, or when it cannot be trusted).
        manifest_on_disk: the manifest as last read or written.
        slots: the registry's use cases by name, with their state (empty without consent).
        blocked: the last write failed (a full disk): why; None once a write succeeds again.
        load_blocked: the writes a load must make first (the manifest moved forward, files bound
            to it) failed: nothing is written or sent until a load succeeds.
    """

    def __init__(self, directory: Path, sealer: Sealer, rng: RandomSource) -> None:
        self.directory = directory
        self._paths: dict[str, Path] = {}
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
        self.ledger_note: str | None = None
        # Why every use case stopped at once (a missing or untrustworthy manifest), logged once.
        self.directory_broken: str | None = None
        self.schedule_device: bytes | None = None
        self.blocked: StateWriteError | None = None
        self.load_blocked: StateWriteError | None = None

    def path(self, name: str) -> Path:
        """The path of the state file ``name``."""
        # Made once per name: every step writes the manifest and a few files by path.
        found = self._paths.get(name)
        if found is None:
            found = self._paths[name] = self.directory / name
        return found

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
        self.ledger_note = None
        self.directory_broken = None
        self.load_blocked = None
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
        ledger_found = self._read_ledger()
        self.schedule_device = self.read_schedule_file().device
        manifest, created, broken = self._read_manifest()
        loaded = {name: self._load_slot(uc) for name, uc in registry.use_cases.items()}
        if manifest is not None and broken is None:
            broken = self._check_identity(manifest, created=created)
        if manifest is not None and broken is None:
            manifest, broken = self._check_generations(manifest, loaded, created=created)
        self.slots = loaded
        if broken is not None:
            # Without a trustworthy manifest no file can be shown fresh: every use case stops.
            log.error("%s", broken)
            self.directory_broken = broken
            for slot in loaded.values():
                slot.broken = slot.broken or broken
                slot.doc = None
            return
        assert manifest is not None
        if manifest.ledger and not ledger_found:
            self.ledger_note = (
                f"started anew: {self.path('ledger' + SUFFIX)} was deleted (the manifest records one was written); "
                "the list of what left the device before is lost, ε spent and permanent randomness are not"
            )
            log.error("%s", self.ledger_note)
        try:
            if manifest != self.manifest_on_disk:
                self.write_manifest(manifest)
                # Already writing: bind the files that name no device yet (after a grant). Without
                # a write, opening a state leaves every file as it is, byte for byte; they are
                # bound by the next step that writes (write_slots, write_ledger, write_schedule).
                self.manifest = manifest
                self._bind_identity(manifest)
            self.manifest = manifest
        except StateWriteError as e:
            # A full disk at start-up: the manifest must move forward before anything else is
            # written, so nothing is until a later load succeeds (agent.core retries it).
            self.manifest = None
            self.load_blocked = e
            log.error("the state cannot be written (%s): nothing is recorded or sent until it can", e)

    def _bind_consent(self, manifest: ManifestDoc) -> None:
        if self.consent is not None and self.consent.device is None:
            self.write_consent(replace(self.consent, device=manifest.device))
            self.consent = replace(self.consent, device=manifest.device)

    def _has(self, name: str) -> bool:
        return self.path(name + SUFFIX).exists()

    def _read_ledger(self) -> bool:
        """Open the ledger (a new one if there is none); True if its file was there."""
        try:
            try:
                raw = self._sealer.read(self.path("ledger" + SUFFIX), "ledger", LEDGER_VERSION)
            except StateUnreadableError as newer:
                # A ledger of version 1 (sealed with that version) is read and carried on as
                # version 2, its brokers unknown; it is written as version 2 at the next change.
                try:
                    old = self._sealer.read(self.path("ledger" + SUFFIX), "ledger", LEDGER_VERSION - 1)
                except StateUnreadableError:
                    raise newer from None
                self.ledger = ledger_from_v1(old)
                return True
            self.ledger = LedgerDoc() if raw is None else LedgerDoc.from_plain(raw)
            return raw is not None
        except (StateUnreadableError, ValueError) as e:
            self.ledger_broken = str(e)
            log.error("the ledger is unreadable (%s): nothing is published until it is repaired", e)
            return True

    def _check_identity(self, manifest: ManifestDoc, *, created: bool) -> str | None:
        """Compare the device that consent, the ledger and the schedule name with the manifest's.

        They are written under the manifest, so with the manifest missing any of them naming a
        device shows the directory is not a new device's: deleting the manifest and every
        use-case file is then refused like deleting one of them (docs/state-integrity.md).
        Returns why every use case stops, or None; a foreign ledger stops publishing only.
        """
        assert self.consent is not None
        consent_path, ledger_path = self.path("consent" + SUFFIX), self.path("ledger" + SUFFIX)
        named = [(consent_path, self.consent.device), (self.path("agent" + SUFFIX), self.schedule_device)]
        if self.ledger is not None:
            named.append((ledger_path, self.ledger.device))
        if created:
            found = [(path, device) for path, device in named if device is not None]
            if not found:
                return None
            files = ", ".join(str(path) for path, _ in found)
            return (
                f"the state manifest {self.path(MANIFEST)} is missing but {files} belong to the state of device "
                f"{found[0][1].hex()}: the manifest was deleted, with the use-case files or without them. Every "
                f"use case stops and nothing is sent rather than redraw permanent randomness or reset ε spent; "
                f"{RE_ENROL}"
            )
        for path, device in named:
            if device is None or device == manifest.device:
                continue
            if path == consent_path:
                return (
                    f"{path} belongs to the state of device {device.hex()}, the manifest {self.path(MANIFEST)} to "
                    f"device {manifest.device.hex()}: the state directory was partly replaced. Every use case "
                    f"stops; {RE_ENROL}"
                )
            if path == ledger_path:
                self.ledger_broken = (
                    f"{path} belongs to the state of device {device.hex()}, not this one ({manifest.device.hex()}); "
                    f"nothing is published; {RE_ENROL}"
                )
                log.error("%s", self.ledger_broken)
        return None

    def _bind_identity(self, manifest: ManifestDoc) -> None:
        """Bind consent, the ledger and the schedule to the manifest in force, once: after a grant
        and for files of the previous release, which name no device."""
        self._bind_consent(manifest)
        ledger = self.ledger
        if ledger is not None and self.ledger_broken is None and ledger.device is None and self._has("ledger"):
            self.write_ledger(replace(ledger, device=manifest.device))
        if self.schedule_device is None and self._has("agent"):
            self.write_schedule(self.read_schedule_file())

    def _load_slot(self, use_case: UseCase) -> Slot:
        slot = Slot(use_case, privatization_of(use_case), self.use_case_path(use_case.name))
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
            return (
                None,
                False,
                (f"the state manifest {path} is unreadable ({e.reason}); no use case can be shown fresh; {RE_ENROL}"),
            )
        except ValueError as e:
            return (
                None,
                False,
                (f"the state manifest {path} does not parse ({e}); no use case can be shown fresh; {RE_ENROL}"),
            )
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
        # The ledger of this device records the lifetime ε of every report it sent: a manifest
        # and use-case files put back together while a newer ledger stays would otherwise
        # agree with each other and enforce the older, lower ε (docs/state-integrity.md).
        sent: dict[str, float] = {}
        if self.ledger is not None and self.ledger.device in (None, manifest.device):
            sent = self.ledger.epsilon_by_use_case()
        for name, slot in slots.items():
            doc = slot.doc
            if created and doc is not None and doc.device is not None:
                return manifest, (
                    f"the state manifest {path} is missing but {slot.path} was written under one (generation "
                    f"{doc.generation}): the manifest was deleted or the state directory partly restored. Every use "
                    f"case stops rather than redraw permanent randomness; {RE_ENROL}"
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
                        f"Its permanent randomness and ε spent are not redrawn or reset; {RE_ENROL}"
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
                    f"device is {manifest.device.hex()}): it was copied in; {RE_ENROL}"
                )
                continue
            manifest = self._check_generation(name, slot, doc, entry, manifest, ledger_floor=sent.get(name, 0.0))
        return manifest, None

    def _check_generation(
        self,
        name: str,
        slot: Slot,
        doc: UseCaseDoc,
        entry: ManifestEntry | None,
        manifest: ManifestDoc,
        *,
        ledger_floor: float,
    ) -> ManifestDoc:
        """Compare the generation and ε spent of one of this device's files with its manifest entry
        and with the lifetime ε the ledger records for its reports (``ledger_floor``)."""
        expected = 0 if entry is None else entry.generation
        spent = epsilon_total(slot.use_case, doc)
        floor = 0.0 if entry is None else entry.epsilon_total
        if doc.generation < expected:
            slot.broken = (
                f"state file {slot.path} is an older copy (generation {doc.generation}; the manifest expects "
                f"{expected}): it was rolled back; {RE_ENROL}"
            )
        elif doc.generation > expected + 1:
            slot.broken = (
                f"state file {slot.path} is ahead of the manifest (generation {doc.generation}; the manifest "
                f"has {expected}): the manifest {self.path(MANIFEST)} was rolled back; {RE_ENROL}"
            )
        elif spent + EPSILON_SLACK < floor:
            slot.broken = f"state file {slot.path} has spent ε {spent:g}, less than the {floor:g} the manifest recorded"
        elif spent + EPSILON_SLACK < ledger_floor:
            slot.broken = (
                f"state file {slot.path} has spent ε {spent:g}, less than the {ledger_floor:g} the ledger "
                f"{self.path('ledger' + SUFFIX)} records for reports already sent: the state was rolled back; "
                f"{RE_ENROL}"
            )
        elif doc.generation == expected + 1:
            # The write of the file landed and the manifest's did not (a crash between the two
            # renames). Accepted exactly once: the manifest moves forward before anything else.
            log.warning("use case %s: completing a state write interrupted by a crash (%s)", name, slot.path)
            manifest = manifest.with_entry(name, ManifestEntry(doc.generation, spent))
        return manifest

    # ------------------------------------------------------------------ writing

    def _write(self, path: Path, purpose: str, version: int, document: PlainDoc) -> None:
        """Seal and write one file, keeping :attr:`blocked` up to date (the agent's back-pressure)."""
        try:
            self._sealer.write(path, purpose, version, document)
        except StateWriteError as e:
            self.blocked = e
            raise
        self.blocked = None

    def write_manifest(self, manifest: ManifestDoc) -> ManifestDoc:
        """Seal and write the manifest (marked as having a ledger once one was written under it);
        returns the manifest written."""
        if not manifest.ledger and self.ledger is not None and self.ledger.device == manifest.device:
            manifest = replace(manifest, ledger=True)
        self._write(self.path(MANIFEST), "manifest", MANIFEST_VERSION, manifest.to_plain())
        self.manifest_on_disk = manifest
        return manifest

    def probe(self) -> bool:
        """After a failed write, write the manifest as it is again: True once writes succeed."""
        if self.blocked is not None and self.manifest_on_disk is not None:
            try:
                self.write_manifest(self.manifest_on_disk)
            except StateWriteError:
                return False
        return self.blocked is None

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
            self._write(slot.path, f"usecase:{name}", USE_CASE_VERSION, doc.to_plain())
            updated = updated.with_entry(name, ManifestEntry(doc.generation, spent))
        self.manifest = self.write_manifest(updated)
        for slot, doc in writes:
            slot.doc = doc
        self._bind_consent(self.manifest)

    def write_ledger(self, ledger: LedgerDoc) -> None:
        """Seal and write the ledger bound to the manifest in force, then adopt it; the first
        ledger written under a manifest is recorded in it, so deleting the ledger is seen."""
        manifest = self.manifest
        if manifest is not None:
            ledger.device = manifest.device
        self._write(self.path("ledger" + SUFFIX), "ledger", LEDGER_VERSION, ledger.to_plain())
        self.ledger = ledger
        if manifest is not None and not manifest.ledger:
            self.manifest = self.write_manifest(manifest)

    def write_consent(self, doc: ConsentDoc) -> None:
        """Seal and write the consent record (the caller loads the state again)."""
        self._write(self.path("consent" + SUFFIX), "consent", CONSENT_VERSION, doc.to_plain())

    def read_schedule_file(self) -> AgentDoc:
        """The schedule file as it is, whatever device it names (a fresh one if missing or unreadable)."""
        try:
            raw = self._sealer.read(self.path("agent" + SUFFIX), "agent", AGENT_VERSION)
            return AgentDoc() if raw is None else AgentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            log.warning("schedule state unreadable (%s); starting a new schedule", e)
            return AgentDoc()

    def read_schedule(self) -> AgentDoc:
        """The schedule bookkeeping (a fresh one if missing, unreadable or another device's: it
        holds no randomness)."""
        doc = self.read_schedule_file()
        manifest = self.manifest
        if doc.device is not None and manifest is not None and doc.device != manifest.device:
            return AgentDoc()
        return doc

    def write_schedule(self, doc: AgentDoc) -> None:
        """Seal and write the schedule bookkeeping, bound to the manifest in force."""
        if self.manifest is not None:
            doc.device = self.manifest.device
        self._write(self.path("agent" + SUFFIX), "agent", AGENT_VERSION, doc.to_plain())
        self.schedule_device = doc.device

    # ------------------------------------------------------------------ what the files record

    def epsilon_recorded(self, name: str) -> float | None:
        """The most lifetime ε any file of the directory records for use case ``name`` (None if
        none records any): the manifest as in force and as on disk, the use-case file whatever
        its state unless it is another device's copy, and the ledger. Status never shows less
        (docs/state-integrity.md)."""
        seen: list[float] = []
        for manifest in (self.manifest, self.manifest_on_disk):
            entry = None if manifest is None else manifest.entries.get(name)
            if entry is not None:
                seen += [entry.epsilon_total, _saved_epsilon(entry.budget)]
        slot = self.slots.get(name)
        known = self.manifest or self.manifest_on_disk
        for doc in (None if slot is None else slot.doc, self.read_use_case_doc(name)):
            # Another device's copy records that device's spending, not this one's.
            if doc is not None and (known is None or doc.device in (None, known.device)):
                seen.append(_saved_epsilon(doc.budget))
        if self.ledger is not None:
            spent = self.ledger.epsilon_by_use_case().get(name)
            if spent is not None:
                seen.append(spent)
        return max(seen) if seen else None

    def memos_recorded(self, name: str) -> int:
        """The most memos any file of the directory shows use case ``name`` held (0 if none
        shows any): its file if it opens and is this device's, a removed use case's count in
        the manifest, and the most records one report of the ledger carried (each record of a
        counter's or a string's period answers from a memo of its own). A lower bound where the
        file is gone: a memo whose reports the ledger no longer lists is not seen
        (docs/state-integrity.md, "Re-enrolment")."""
        seen = [0]
        for manifest in (self.manifest, self.manifest_on_disk):
            entry = None if manifest is None else manifest.entries.get(name)
            if entry is not None and entry.memos is not None:
                seen.append(entry.memos)
        doc = self.read_use_case_doc(name)
        known = self.manifest or self.manifest_on_disk
        if doc is not None and (known is None or doc.device in (None, known.device)):
            seen.append(memos_held(doc.permanent))
        if self.ledger is not None:
            seen += [len(e.records) for e in self.ledger.entries if e.use_case == name]
        return max(seen)

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
