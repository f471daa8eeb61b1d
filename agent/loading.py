"""Loading the state directory: every file opened and checked against the manifest.

:func:`load` opens consent, then (with consent) the ledger, the schedule's device, the
manifest and each use case of the registry, and compares every use-case file with the
manifest (docs/design.md, invariant 2; the table of docs/state-integrity.md, "The
manifest"). It returns a :class:`~agent.device_state.DeviceState`; carrying that state over
to a changed registry is the caller's next step (:mod:`agent.registry_change`).

A load writes only when it must, and then in this order: the manifest moved forward (a file
written just before a crash is accepted once), then consent, the ledger and the schedule bound
to the manifest's device when they name none yet (after a grant, and files of the previous
release). Without a write, opening a state leaves every file as it is, byte for byte; files
of the previous release are then bound by the first step that writes
(:func:`agent.transaction.commit`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from agent.accounting import EPSILON_SLACK
from agent.device_state import RE_ENROL, DeviceState, Slot, budget_of, epsilon_total
from agent.errors import StateUnreadableError, StateWriteError
from agent.manifest import ManifestDoc, ManifestEntry, with_ledger_flag
from agent.mechanism_calls import fingerprint, load_permanent_state, privatization_of
from agent.state import DEVICE_ID_BYTES, ConsentDoc, LedgerDoc, UseCaseDoc
from agent.statefiles import CONSENT, LEDGER, MANIFEST, SCHEDULE, StateFiles
from protocol.errors import StateError
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import Registry, UseCase

__all__ = ["load"]

log = logging.getLogger("ldp_agent")


def load(files: StateFiles, registry: Registry, rng: RandomSource) -> DeviceState:
    """Open every file of the state directory and check each use case's against the manifest.

    Args:
        files: the state directory.
        registry: the registry whose use cases are loaded.
        rng: draws the device identity of a new manifest.

    A file written just before a crash moves the manifest forward at once; without a
    trustworthy manifest every use case stops. A full disk while the manifest must move
    forward gives a state with ``load_blocked`` set and no manifest in force: nothing is
    written or sent until a later load succeeds (:class:`agent.core.Agent` retries it).
    """
    consent, consent_broken = _read_consent(files)
    if consent is None:
        return DeviceState(consent_broken=consent_broken)
    ledger, ledger_found, ledger_broken = _read_ledger(files)
    schedule_device = files.read_schedule().device
    manifest, created, broken = _read_manifest(files, rng)
    slots = {name: _load_slot(files, uc) for name, uc in registry.use_cases.items()}
    if manifest is not None and broken is None:
        named = [(files.path(CONSENT), consent.device), (files.path(SCHEDULE), schedule_device)]
        if ledger is not None:
            named.append((files.path(LEDGER), ledger.device))
        broken, foreign_ledger = _check_identity(files, manifest, named, created=created)
        ledger_broken = ledger_broken or foreign_ledger
    if manifest is not None and broken is None:
        manifest, slots, broken = _check_generations(files, manifest, slots, ledger, created=created)
    state = DeviceState(consent=consent, ledger=ledger, ledger_broken=ledger_broken, slots=slots)
    if broken is not None:
        # Without a trustworthy manifest no file can be shown fresh: every use case stops.
        log.error("%s", broken)
        stopped = {name: replace(slot, broken=slot.broken or broken, doc=None) for name, slot in slots.items()}
        return replace(state, directory_broken=broken, slots=stopped)
    assert manifest is not None
    if manifest.ledger and not ledger_found:
        note = (
            f"started anew: {files.path(LEDGER)} was deleted (the manifest records one was written); "
            "the list of what left the device before is lost, ε spent and permanent randomness are not"
        )
        log.error("%s", note)
        state = replace(state, ledger_note=note)
    if manifest == files.manifest_on_disk:
        return replace(state, manifest=manifest)
    try:
        return _write_forward(files, state, manifest, schedule_device)
    except StateWriteError as e:
        # A full disk at start-up: the manifest must move forward before anything else is
        # written, so nothing is until a later load succeeds.
        log.error("the state cannot be written (%s): nothing is recorded or sent until it can", e)
        return replace(state, load_blocked=e)


def _write_forward(
    files: StateFiles, state: DeviceState, manifest: ManifestDoc, schedule_device: bytes | None
) -> DeviceState:
    """Write the manifest that moved forward, then bind consent, the ledger and the schedule
    that name no device yet to it (after a grant, and files of the previous release)."""
    manifest = with_ledger_flag(manifest, state.ledger)
    files.write_manifest(manifest)
    consent, ledger = state.consent, state.ledger
    if consent is not None and consent.device is None:
        consent = replace(consent, device=manifest.device)
        files.write_consent(consent)
    if ledger is not None and state.ledger_broken is None and ledger.device is None and files.has(LEDGER):
        ledger = replace(ledger, device=manifest.device)
        files.write_ledger(ledger)
        bound = with_ledger_flag(manifest, ledger)
        if bound != manifest:
            # The ledger is recorded in the manifest once it is written under it, so that
            # deleting it is seen (docs/state-integrity.md).
            files.write_manifest(bound)
            manifest = bound
    if schedule_device is None and files.has(SCHEDULE):
        files.write_schedule(replace(files.read_schedule(), device=manifest.device))
    return replace(state, manifest=manifest, consent=consent, ledger=ledger)


def _read_consent(files: StateFiles) -> tuple[ConsentDoc | None, str | None]:
    """The consent record, or None and why it does not open."""
    try:
        return files.read_consent(), None
    except (StateUnreadableError, ValueError) as e:
        # Most often a key that is not the one the state was sealed with: say so, rather
        # than "the user has not opted in", which sends people to grant consent again.
        log.error("consent record is unreadable (%s); nothing is recorded or sent until it opens", e)
        return None, e.reason if isinstance(e, StateUnreadableError) else str(e)


def _read_ledger(files: StateFiles) -> tuple[LedgerDoc | None, bool, str | None]:
    """The ledger (a new one if there is none), whether its file was there, and why it does not open."""
    try:
        ledger = files.read_ledger()
    except (StateUnreadableError, ValueError) as e:
        log.error("the ledger is unreadable (%s): nothing is published until it is repaired", e)
        return None, True, str(e)
    return (LedgerDoc(), False, None) if ledger is None else (ledger, True, None)


def _read_manifest(files: StateFiles, rng: RandomSource) -> tuple[ManifestDoc | None, bool, str | None]:
    """The manifest, whether it was just created, and why the whole state is suspect (or None)."""
    path = files.path(MANIFEST)
    try:
        manifest = files.read_manifest()
    except StateUnreadableError as e:
        return (
            None,
            False,
            f"the state manifest {path} is unreadable ({e.reason}); no use case can be shown fresh; {RE_ENROL}",
        )
    except ValueError as e:
        return (
            None,
            False,
            f"the state manifest {path} does not parse ({e}); no use case can be shown fresh; {RE_ENROL}",
        )
    if manifest is not None:
        return manifest, False, None
    # No manifest: a new state directory, one written before manifests existed, or a crash
    # between granting consent and writing it. _check_generations refuses files that name one.
    return ManifestDoc(device=random_bytes(rng, DEVICE_ID_BYTES)), True, None


def _load_slot(files: StateFiles, use_case: UseCase) -> Slot:
    slot = Slot(use_case, privatization_of(use_case), files.use_case_path(use_case.name))
    try:
        doc = files.read_use_case(use_case.name)
        if doc is None:
            return slot
        budget_of(use_case, doc)  # validates the saved accounting
        # Permanent state is checked against the mechanism it was drawn for; under changed
        # parameters it is replaced by a new memo (agent.registry_change), never read.
        same_mechanism = doc.fingerprint == fingerprint(use_case)
        if same_mechanism:
            for data in doc.permanent.values():
                load_permanent_state(use_case, data)  # validates the saved permanent state
    except StateUnreadableError as e:
        return replace(slot, broken=f"state unreadable: {e.reason} ({slot.path})")
    except (ValueError, StateError) as e:
        return replace(slot, broken=f"state does not parse: {e} ({slot.path})")
    if doc.definition is None and same_mechanism and doc.period in (None, use_case.period.value):
        # A file of the previous release, which recorded no definition, under the same mechanism
        # and period: the same use case as far as anything can tell. Read as the registry's
        # definition; the definition is recorded with the next write.
        doc = replace(doc, definition=use_case.definition, period=use_case.period.value)
    return replace(slot, doc=doc)


def _check_identity(
    files: StateFiles, manifest: ManifestDoc, named: list[tuple[Path, bytes | None]], *, created: bool
) -> tuple[str | None, str | None]:
    """Compare the device that consent, the schedule and the ledger name (``named``, in that
    order) with the manifest's.

    They are written under the manifest, so with the manifest missing any of them naming a
    device shows the directory is not a new device's: deleting the manifest and every
    use-case file is then refused like deleting one of them (docs/state-integrity.md).
    Returns why every use case stops (or None), and why a foreign ledger stops publishing (or None).
    """
    if created:
        found = [(path, device) for path, device in named if device is not None]
        if not found:
            return None, None
        paths = ", ".join(str(path) for path, _ in found)
        return (
            f"the state manifest {files.path(MANIFEST)} is missing but {paths} belong to the state of device "
            f"{found[0][1].hex()}: the manifest was deleted, with the use-case files or without them. Every "
            f"use case stops and nothing is sent rather than redraw permanent randomness or reset ε spent; "
            f"{RE_ENROL}"
        ), None
    foreign_ledger = None
    for path, device in named:
        if device is None or device == manifest.device:
            continue
        if path == files.path(CONSENT):
            return (
                f"{path} belongs to the state of device {device.hex()}, the manifest {files.path(MANIFEST)} to "
                f"device {manifest.device.hex()}: the state directory was partly replaced. Every use case "
                f"stops; {RE_ENROL}"
            ), None
        if path == files.path(LEDGER):
            foreign_ledger = (
                f"{path} belongs to the state of device {device.hex()}, not this one ({manifest.device.hex()}); "
                f"nothing is published; {RE_ENROL}"
            )
            log.error("%s", foreign_ledger)
    return None, foreign_ledger


def _check_generations(
    files: StateFiles, manifest: ManifestDoc, slots: dict[str, Slot], ledger: LedgerDoc | None, *, created: bool
) -> tuple[ManifestDoc, dict[str, Slot], str | None]:
    """Compare each use-case file with the manifest (docs/design.md, invariant 2).

    Stops the slots whose file is missing, older or another device's; moves the manifest one
    step forward for a file written just before a crash. Returns the manifest to keep, the
    slots and, when the manifest itself is missing while files were written under one, the
    reason every use case stops.
    """
    # The ledger of this device records the lifetime ε of every report it sent: a manifest
    # and use-case files put back together while a newer ledger stays would otherwise
    # agree with each other and enforce the older, lower ε (docs/state-integrity.md).
    sent: dict[str, float] = {}
    if ledger is not None and ledger.device in (None, manifest.device):
        sent = ledger.epsilon_by_use_case()
    checked: dict[str, Slot] = {}
    for name, slot in slots.items():
        doc = slot.doc
        if created and doc is not None and doc.device is not None:
            return (
                manifest,
                slots,
                (
                    f"the state manifest {files.path(MANIFEST)} is missing but {slot.path} was written under one "
                    f"(generation {doc.generation}): the manifest was deleted or the state directory partly restored. "
                    f"Every use case stops rather than redraw permanent randomness; {RE_ENROL}"
                ),
            )
        entry = manifest.entries.get(name)
        if slot.broken is not None:
            checked[name] = slot
            continue
        if entry is not None and entry.removed and doc is not None and not _completes_readd(doc, entry, manifest):
            # The wiped file of a use case the registry had removed (a crash before its unlink, or
            # a restored copy): it is never read again; the use case, added back, starts anew
            # from what the manifest kept (agent.registry_change).
            checked[name] = replace(slot, doc=None, stale=True)
        else:
            checked[name], manifest = _check_file(files, slot, entry, manifest, ledger_floor=sent.get(name, 0.0))
    return manifest, checked, None


def _check_file(
    files: StateFiles, slot: Slot, entry: ManifestEntry | None, manifest: ManifestDoc, *, ledger_floor: float
) -> tuple[Slot, ManifestDoc]:
    """One use case's file against its manifest entry: the slot (stopped if the file is missing,
    older or another device's) and the manifest (moved one step forward for a crash's file)."""
    doc = slot.doc
    if doc is None:
        if entry is not None and not entry.removed:
            return replace(
                slot,
                broken=(
                    f"state file {slot.path} is missing; the manifest expects generation {entry.generation}. "
                    f"Its permanent randomness and ε spent are not redrawn or reset; {RE_ENROL}"
                ),
            ), manifest
        return slot, manifest
    if doc.device is None:
        # Written before manifests existed: adopt it once, as generation 0.
        if entry is None:
            return slot, manifest.with_entry(slot.use_case.name, ManifestEntry(0, epsilon_total(slot.use_case, doc)))
        broken = (
            f"state file {slot.path} is an older copy (no generation; the manifest expects generation "
            f"{entry.generation})"
        )
        return replace(slot, broken=broken), manifest
    if doc.device != manifest.device:
        broken = (
            f"state file {slot.path} belongs to another device's state (device {doc.device.hex()}, this "
            f"device is {manifest.device.hex()}): it was copied in; {RE_ENROL}"
        )
        return replace(slot, broken=broken), manifest
    why, manifest = _check_generation(files, slot, doc, entry, manifest, ledger_floor=ledger_floor)
    return (slot if why is None else replace(slot, broken=why)), manifest


def _check_generation(
    files: StateFiles,
    slot: Slot,
    doc: UseCaseDoc,
    entry: ManifestEntry | None,
    manifest: ManifestDoc,
    *,
    ledger_floor: float,
) -> tuple[str | None, ManifestDoc]:
    """Compare the generation and ε spent of one of this device's files with its manifest entry
    and with the lifetime ε the ledger records for its reports (``ledger_floor``): why the use
    case stops (or None), and the manifest."""
    expected = 0 if entry is None else entry.generation
    spent = epsilon_total(slot.use_case, doc)
    floor = 0.0 if entry is None else entry.epsilon_total
    if doc.generation < expected:
        return (
            f"state file {slot.path} is an older copy (generation {doc.generation}; the manifest expects "
            f"{expected}): it was rolled back; {RE_ENROL}"
        ), manifest
    if doc.generation > expected + 1:
        return (
            f"state file {slot.path} is ahead of the manifest (generation {doc.generation}; the manifest "
            f"has {expected}): the manifest {files.path(MANIFEST)} was rolled back; {RE_ENROL}"
        ), manifest
    if spent + EPSILON_SLACK < floor:
        return f"state file {slot.path} has spent ε {spent:g}, less than the {floor:g} the manifest recorded", manifest
    if spent + EPSILON_SLACK < ledger_floor:
        return (
            f"state file {slot.path} has spent ε {spent:g}, less than the {ledger_floor:g} the ledger "
            f"{files.path(LEDGER)} records for reports already sent: the state was rolled back; "
            f"{RE_ENROL}"
        ), manifest
    if doc.generation == expected + 1:
        # The write of the file landed and the manifest's did not (a crash between the two
        # renames). Accepted exactly once: the manifest moves forward before anything else.
        log.warning("use case %s: completing a state write interrupted by a crash (%s)", slot.use_case.name, slot.path)
        manifest = manifest.with_entry(slot.use_case.name, ManifestEntry(doc.generation, spent))
    return None, manifest


def _completes_readd(doc: UseCaseDoc, entry: ManifestEntry, manifest: ManifestDoc) -> bool:
    """A use case added back wrote its first file and crashed before the manifest followed."""
    return doc.device == manifest.device and doc.generation == entry.generation + 1
