"""The agent's core: consent, recording, collection cycles, the outbox and the ledger.

Synchronous and single-threaded: the daemon calls it from its event loop, the CLI calls it
directly when no daemon runs, and the fleet simulator runs many cores (each with its own
state directory, clock and seeded random source) in one process. Every change is made to a
copy of a use case's document, sealed and written atomically, and only then adopted, so
what is in memory is always what is on disk.

Order of a collection cycle (per use case, one atomic write): close the periods that ended,
answer them (counters from their memo, events and strings from their reservoir), keep a
uniformly random subset within the daily limit and the lifetime ε cap (003 §3.2.1), charge
the budget, and put the encoded report in the outbox. Publishing happens later and only
removes a report from the outbox after the broker acknowledged it (and after it entered the
ledger), so a crash at any point either loses nothing or resends identical bytes.

With commit receipts (``protocol.receipts``, DESIGN invariant 8) a report's states are:
**waiting** (in the outbox, never sent) -> **sent** (the broker acknowledged a send; still in
the outbox with the time and the number of sends; in the ledger as "sent") -> **counted** or
**refused: <reason>** (the collector's receipt arrived: the report leaves the outbox and the
ledger says so). A sent report without a receipt after ``receipt_wait`` is sent again,
byte for byte; the collector's de-duplication makes that harmless.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack

from agent.accounting import EPSILON_SLACK, Budget, day_of
from agent.errors import (
    ConsentRequiredError,
    ConsentUnreadableError,
    StateUnreadableError,
    UseCaseStoppedError,
    ValueRefusedError,
)
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
    LedgerEntry,
    LedgerNotice,
    ManifestDoc,
    ManifestEntry,
    OutboxEntry,
    PendingRecords,
    UseCaseDoc,
)
from agent.usecases import (
    Kind,
    check_counter_value,
    check_value,
    clamp_note,
    counter_input,
    fingerprint,
    kind_of,
    load_permanent_state,
    memo_charge,
    privatize,
    setup,
)
from protocol.errors import StateError
from protocol.randomness import RandomSource, sample_without_replacement, uniform_ints
from protocol.receipts import Receipt
from protocol.registry import Period, Registry, UseCase
from protocol.wire import Report, encode_report, new_report_id
from runtime.backoff import Backoff
from runtime.clock import Clock

__all__ = ["Agent", "CycleSummary", "Pending", "RecordOutcome", "receipt_wait", "reservoir_offer"]

log = logging.getLogger("ldp_agent")

MAX_SEEN_PER_PERIOD = 4096
"""Distinct strings remembered per period (beyond it new strings are dropped, and counted)."""

_COUNTER_PERSON = b"ldp-counter-key"
_STRING_PERSON = b"ldp-string-seen"
_FILE_PREFIX = "uc-"
_SUFFIX = ".sealed"
_MANIFEST = "manifest" + _SUFFIX


def _keyed_hash(key: bytes, data: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=32, person=person).digest()


def _extends(old: Any, new: Any) -> bool:
    """True if ``new`` keeps every entry of ``old`` unchanged (memo tables only grow)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _extends(v, new[k]) for k, v in old.items())
    return bool(old == new)


def receipt_wait(entry: OutboxEntry, timeout: float, cap: float) -> float:
    """Seconds after its last send before a report without a receipt is sent again.

    ``timeout`` doubles with each send, up to ``cap``, and is stretched by up to half again
    (jitter), so that devices cut off together do not all resend at the same instant. The
    jitter is drawn from the report id (uniformly random bytes) and the attempt number: it
    needs no stored state and differs between reports and attempts.
    """
    ceiling = Backoff(initial=timeout, cap=cap).ceiling(entry.attempts - 1)
    digest = hashlib.sha256(entry.report_id + entry.attempts.to_bytes(8, "big")).digest()
    fraction = int.from_bytes(digest[:4], "big") / 2**32
    return ceiling * (1.0 + fraction / 2)


def reservoir_offer(pending: PendingRecords, record: Any, capacity: int, rng: RandomSource) -> None:
    """Offer a record to a period's reservoir (Algorithm R).

    After ``n`` offers the reservoir is a uniformly random subset of size ``min(n, capacity)``
    of the offered records, so what is sent is a uniform sample of the period's (003 §3.2.1),
    while at most ``capacity`` privatized records are ever kept.
    """
    pending.offered += 1
    if len(pending.records) < capacity:
        pending.records.append(record)
        return
    j = int(uniform_ints(rng, pending.offered, 1)[0])
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
            (:func:`agent.usecases.clamp_note`); empty otherwise.
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


@dataclass(frozen=True, slots=True)
class Pending:
    """A report waiting in the outbox."""

    use_case: str
    topic: str
    entry: OutboxEntry


@dataclass
class _Slot:
    use_case: UseCase
    kind: Kind
    path: Path
    doc: UseCaseDoc | None = None
    broken: str | None = None
    stale: bool = False  # a wiped use case's file found again: removed at load


class Agent:
    """One device's agent state.

    Args:
        registry: the use-case registry (already checked against the local policy).
        state_dir: where the sealed files live (created with mode 0700).
        sealer: encrypts and decrypts the files.
        clock: the wall clock.
        rng: device randomness (the OS CSPRNG; seeded only in tests and simulations).
        topic_prefix: reports go to ``<topic_prefix>/<device_identity>/<use_case>``.
        device_identity: the identity the broker authenticates this device as (its user name
            or certificate CN; the ACL admits no other); None for an anonymous test broker,
            whose topics are ``<topic_prefix>/<use_case>``.
        outbox_max_reports: most reports waiting; the oldest are dropped beyond it.
        outbox_max_age_days: reports waiting longer are dropped.
        ledger_retention_days: ledger entries older than this are pruned.
    """

    def __init__(
        self,
        *,
        registry: Registry,
        state_dir: Path,
        sealer: Sealer,
        clock: Clock,
        rng: RandomSource,
        topic_prefix: str = "ldp/v1/reports",
        device_identity: str | None = None,
        outbox_max_reports: int = 10_000,
        outbox_max_age_days: int = 14,
        ledger_retention_days: int = 30,
    ) -> None:
        self.registry = registry
        self.state_dir = state_dir
        self._sealer = sealer
        self.clock = clock
        self.rng = rng
        self.topic_prefix = topic_prefix
        self.device_identity = device_identity
        self.outbox_max_reports = outbox_max_reports
        self.outbox_max_age = outbox_max_age_days * 86_400.0
        self.ledger_retention = ledger_retention_days * 86_400.0
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        self._consent: ConsentDoc | None = None
        self._slots: dict[str, _Slot] = {}
        self._ledger: LedgerDoc | None = None
        self.ledger_broken: str | None = None
        self._manifest: ManifestDoc | None = None
        self._manifest_on_disk: ManifestDoc | None = None
        self.consent_broken: str | None = None
        self._load()

    # ------------------------------------------------------------------ files

    def _path(self, name: str) -> Path:
        return self.state_dir / name

    def _remove_stale_temporaries(self) -> None:
        # A crash between writing a temporary file and renaming it leaves it behind.
        for p in self.state_dir.glob(".*.tmp"):
            p.unlink(missing_ok=True)

    def _load(self) -> None:
        self._consent = None
        self._slots = {}
        self._ledger = None
        self.ledger_broken = None
        self._manifest = None
        self.consent_broken = None
        try:
            raw = self._sealer.read(self._path("consent" + _SUFFIX), "consent", CONSENT_VERSION)
            self._consent = None if raw is None else ConsentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            # Most often a key that is not the one the state was sealed with: say so, rather
            # than "the user has not opted in", which sends people to grant consent again.
            self.consent_broken = e.reason if isinstance(e, StateUnreadableError) else str(e)
            log.error("consent record is unreadable (%s); nothing is recorded or sent until it opens", e)
            self._consent = None
        if self._consent is None:
            return
        try:
            raw = self._sealer.read(self._path("ledger" + _SUFFIX), "ledger", LEDGER_VERSION)
            self._ledger = LedgerDoc() if raw is None else LedgerDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            self.ledger_broken = str(e)
            log.error("the ledger is unreadable (%s): nothing is published until it is repaired", e)
        manifest, created, broken = self._read_manifest()
        loaded = {name: self._load_slot(uc) for name, uc in self.registry.use_cases.items()}
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
            if manifest != self._manifest_on_disk:
                self._write_manifest(manifest)
            self._manifest = manifest
        for name, slot in loaded.items():
            self._slots[name] = slot
        if self._manifest is not None:
            self._apply_registry()
        for name, slot in self._slots.items():
            if slot.broken:
                log.error("use case %s stopped: %s", name, slot.broken)

    def _load_slot(self, use_case: UseCase) -> _Slot:
        slot = _Slot(use_case, kind_of(use_case), self._path(f"{_FILE_PREFIX}{use_case.name}{_SUFFIX}"))
        try:
            raw = self._sealer.read(slot.path, f"usecase:{use_case.name}", USE_CASE_VERSION)
            if raw is None:
                return slot
            doc = UseCaseDoc.from_plain(raw)
            self._budget(slot, doc)  # validates the saved accounting
            # Permanent state is checked against the mechanism it was drawn for; under changed
            # parameters it is replaced by a new memo (_apply_registry), never read.
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

    # ------------------------------------------------------------------ registry changes

    def _apply_registry(self) -> None:
        """Carry the state over to the registry loaded (``docs/privacy-accounting.md``, "Registry changes").

        * A use case whose definition is unchanged keeps its file as it is, byte for byte.
        * A changed one goes on from its state: records of open periods made under the old
          definition are staged at once under it; ε spent and the day's count carry over; if
          the mechanism's parameters changed under a drawn memo, a new memo is started and
          charged its longitudinal ε at once against the same lifetime cap.
        * A removed one has its file wiped; the manifest keeps its ε spent (and whether it had a
          memo) so that, added back, it goes on from there instead of starting at 0.
        Every change is written (the ledger's notice, the files, then the manifest) before
        anything can be sent, so memory and disk agree from here on.
        """
        manifest = self._manifest
        assert manifest is not None
        now = self.clock.time()
        writes, notices = self._carried_over(manifest, now)
        stale = [slot.path for slot in self._slots.values() if slot.stale]
        removed = sorted(n for n, e in manifest.entries.items() if n not in self.registry.use_cases and not e.removed)
        for name in removed:
            entry, text = self._tombstone(name, manifest.entries[name])
            manifest = manifest.with_entry(name, entry)
            notices.append(LedgerNotice(now, name, text))
            stale.append(self._path(f"{_FILE_PREFIX}{name}{_SUFFIX}"))
        if not writes and not removed and not stale:
            return
        for notice in notices:
            log.warning("use case %s: %s", notice.use_case, notice.text)
        self._add_notices(notices, now)
        self._manifest = manifest
        if writes:
            self._write_slots(writes)
        elif manifest != self._manifest_on_disk:
            self._write_manifest(manifest)
        # Last: the manifest already says these use cases are gone, so a crash before the unlink
        # leaves a file the next load recognises as wiped.
        for path in stale:
            path.unlink(missing_ok=True)
        if stale:
            fsync_directory(self.state_dir)
        for slot in self._slots.values():
            slot.stale = False

    def _carried_over(
        self, manifest: ManifestDoc, now: float
    ) -> tuple[list[tuple[_Slot, UseCaseDoc]], list[LedgerNotice]]:
        """The use cases of the registry whose state must change, the new state, and the notices."""
        writes: list[tuple[_Slot, UseCaseDoc]] = []
        notices: list[LedgerNotice] = []
        for name, slot in self._slots.items():
            entry = manifest.entries.get(name)
            if slot.broken:
                continue
            if slot.doc is not None:
                carried = self._changed(slot, slot.doc, now)
            elif entry is not None and entry.removed:
                carried = self._readded(slot, entry, now)
            else:
                carried = None
            if carried is not None:
                writes.append((slot, carried[0]))
                notices.append(LedgerNotice(now, name, carried[1]))
        return writes, notices

    def _changed(self, slot: _Slot, doc: UseCaseDoc, now: float) -> tuple[UseCaseDoc, str] | None:
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
        budget = self._budget(slot, doc).at(day_of(now))
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
            budget, n, _, left_out = self._stage(
                uc, new, budget, period, pending.records, definition=definition, cost=pending.cost, now=now
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
        if not same_mechanism and (doc.permanent or doc.memo_generation):
            charge = memo_charge(uc)
            if not budget.fits(0, charge):
                slot.broken = (
                    f"the registry changed this use case's parameters: a new memo would cost ε {charge:.4g}, more "
                    f"than the {budget.remaining().epsilon:.4g} its lifetime cap leaves; it stops (its memo is never "
                    "redrawn for free)"
                )
                return None
            budget = budget.spend(0, charge)
            new.permanent = {}
            new.memo_generation += 1
            said.append(
                f"the mechanism's parameters changed, so a new memo is drawn (generation {new.memo_generation}), "
                f"charged ε {charge:.4g} at once against the same lifetime cap"
            )
        new.fingerprint, new.definition, new.period = fingerprint(uc), uc.definition, uc.period.value
        new.budget = budget.to_plain()
        said.append(f"ε spent {budget.epsilon_total:.4g} of {budget.epsilon_cap:.4g}")
        return new, "; ".join(said)

    def _readded(self, slot: _Slot, entry: ManifestEntry, now: float) -> tuple[UseCaseDoc, str] | None:
        """A use case the registry had removed and has again: a fresh state that goes on from the
        ε spent the manifest kept (a new memo charged, where the old one had been drawn)."""
        uc = slot.use_case
        budget = self._budget(slot, UseCaseDoc(fingerprint=b"", hash_key=b"", budget=dict(entry.budget or {})))
        budget = budget.at(day_of(now))
        if budget.epsilon_total + EPSILON_SLACK < entry.epsilon_total:
            budget = replace(budget, epsilon_total=entry.epsilon_total)
        doc = self._new_doc(uc)
        said = f"added back to the registry as {uc.ref}: its state starts anew"
        if entry.memo and slot.kind is not Kind.EVENT:
            charge = memo_charge(uc)
            if not budget.fits(0, charge):
                slot.broken = (
                    f"added back to the registry, but a new memo would cost ε {charge:.4g}, more than the "
                    f"{budget.remaining().epsilon:.4g} its lifetime cap leaves; it stops"
                )
                return None
            budget = budget.spend(0, charge)
            doc.memo_generation = 1
            said += f"; a new memo is drawn, charged ε {charge:.4g} at once"
        doc.budget = budget.to_plain()
        return doc, f"{said}; ε spent {budget.epsilon_total:.4g} of {budget.epsilon_cap:.4g} (never reset)"

    def _tombstone(self, name: str, entry: ManifestEntry) -> tuple[ManifestEntry, str]:
        """What the manifest keeps of a use case the registry removed, and the ledger's notice."""
        path = self._path(f"{_FILE_PREFIX}{name}{_SUFFIX}")
        try:
            raw = self._sealer.read(path, f"usecase:{name}", USE_CASE_VERSION)
            doc = None if raw is None else UseCaseDoc.from_plain(raw)
        except (StateUnreadableError, ValueError):
            doc = None
        if doc is None:
            # Nothing readable to go by: keep the manifest's figure, and assume a memo was drawn.
            tomb = ManifestEntry(entry.generation, entry.epsilon_total, removed=True, budget=None, memo=True)
            return (
                tomb,
                f"removed from the registry: its state was wiped; its ε spent ({entry.epsilon_total:.4g}) is kept",
            )
        saved = doc.budget.get("epsilon_total", 0.0)
        spent = max(entry.epsilon_total, float(saved) if isinstance(saved, int | float) else 0.0)
        memo = bool(doc.permanent) or doc.memo_generation > 0
        tomb = ManifestEntry(entry.generation, spent, removed=True, budget=dict(doc.budget), memo=memo)
        lost = len(doc.outbox)
        text = (
            f"removed from the registry: its state was wiped (permanent randomness, open periods"
            f"{f', {lost} reports not yet delivered' if lost else ''}); its ε spent ({spent:.4g}) is kept should it "
            "come back"
        )
        return tomb, text

    def _add_notices(self, notices: Sequence[LedgerNotice], now: float) -> None:
        """Append notices to the ledger (a ledger that cannot be read gets none; the log has them)."""
        if not notices:
            return
        ledger = self._current_ledger(now)
        if ledger is None:
            return
        ledger.notices.extend(notices)
        self._write_ledger(ledger)

    def _read_manifest(self) -> tuple[ManifestDoc | None, bool, str | None]:
        """The manifest, whether it was just created, and why the whole state is suspect (or None)."""
        path = self._path(_MANIFEST)
        self._manifest_on_disk = None
        try:
            raw = self._sealer.read(path, "manifest", MANIFEST_VERSION)
            if raw is not None:
                self._manifest_on_disk = ManifestDoc.from_plain(raw)
                return self._manifest_on_disk, False, None
        except StateUnreadableError as e:
            return None, False, f"the state manifest {path} is unreadable ({e.reason}); no use case can be shown fresh"
        except ValueError as e:
            return None, False, f"the state manifest {path} does not parse ({e}); no use case can be shown fresh"
        # No manifest: a new state directory, one written before manifests existed, or a crash
        # between granting consent and writing it. _check_generations refuses files that name one.
        device = self.rng.words(2).astype("<u8").tobytes()[:DEVICE_ID_BYTES]
        return ManifestDoc(device=device), True, None

    def _check_generations(
        self, manifest: ManifestDoc, slots: dict[str, _Slot], *, created: bool
    ) -> tuple[ManifestDoc, str | None]:
        """Compare each use-case file with the manifest (DESIGN invariant 2).

        Marks the slots whose file is missing, older or another device's; moves the manifest one
        step forward for a file written just before a crash. Returns the manifest to keep and,
        when the manifest itself is missing while files were written under one, the reason every
        use case stops.
        """
        path = self._path(_MANIFEST)
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
            if (
                entry is not None
                and entry.removed
                and doc is not None
                and not self._completes_readd(doc, entry, manifest)
            ):
                # The wiped file of a use case the registry had removed (a crash before its unlink, or
                # a restored copy): it is never read again; the use case, added back, starts anew
                # from what the manifest kept (_apply_registry).
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
                    manifest = manifest.with_entry(name, ManifestEntry(0, self._epsilon_total(slot, doc)))
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
        self, name: str, slot: _Slot, doc: UseCaseDoc, entry: ManifestEntry | None, manifest: ManifestDoc
    ) -> ManifestDoc:
        """Compare the generation and ε spent of one of this device's files with its manifest entry."""
        expected = 0 if entry is None else entry.generation
        spent = self._epsilon_total(slot, doc)
        floor = 0.0 if entry is None else entry.epsilon_total
        if doc.generation < expected:
            slot.broken = (
                f"state file {slot.path} is an older copy (generation {doc.generation}; the manifest expects "
                f"{expected}): it was rolled back"
            )
        elif doc.generation > expected + 1:
            slot.broken = (
                f"state file {slot.path} is ahead of the manifest (generation {doc.generation}; the manifest "
                f"has {expected}): the manifest {self._path(_MANIFEST)} was rolled back"
            )
        elif spent + EPSILON_SLACK < floor:
            slot.broken = f"state file {slot.path} has spent ε {spent:g}, less than the {floor:g} the manifest recorded"
        elif doc.generation == expected + 1:
            # The write of the file landed and the manifest's did not (a crash between the two
            # renames). Accepted exactly once: the manifest moves forward before anything else.
            log.warning("use case %s: completing a state write interrupted by a crash (%s)", name, slot.path)
            manifest = manifest.with_entry(name, ManifestEntry(doc.generation, spent))
        return manifest

    @staticmethod
    def _completes_readd(doc: UseCaseDoc, entry: ManifestEntry, manifest: ManifestDoc) -> bool:
        """A use case added back wrote its first file and crashed before the manifest followed."""
        return doc.device == manifest.device and doc.generation == entry.generation + 1

    def _epsilon_total(self, slot: _Slot, doc: UseCaseDoc) -> float:
        return float(self._budget(slot, doc).epsilon_total)

    def _write_manifest(self, manifest: ManifestDoc) -> None:
        self._sealer.write(self._path(_MANIFEST), "manifest", MANIFEST_VERSION, manifest.to_plain())
        self._manifest_on_disk = manifest

    def _new_doc(self, use_case: UseCase, *, budget: dict[str, Any] | None = None, last_closed: int = -1) -> UseCaseDoc:
        return UseCaseDoc(
            fingerprint=fingerprint(use_case),
            hash_key=self.rng.words(4).astype("<u8").tobytes(),
            budget=dict(budget or {}),
            last_closed=last_closed,
            definition=use_case.definition,
            period=use_case.period.value,
        )

    def _budget(self, slot: _Slot, doc: UseCaseDoc) -> Budget:
        uc = slot.use_case
        if not doc.budget:
            return Budget(daily_limit=uc.daily_limit, epsilon_cap=uc.lifetime_epsilon)
        return Budget.from_plain(doc.budget, daily_limit=uc.daily_limit, epsilon_cap=uc.lifetime_epsilon)

    def _write_slots(self, writes: Sequence[tuple[_Slot, UseCaseDoc]]) -> None:
        """Write use-case documents, then the manifest once, then adopt them in memory.

        Files first, manifest second: a crash between leaves each written file exactly one
        generation ahead of the manifest (each use case is written once per call), which the
        loader accepts once (see agent.state); the reverse order would leave a file behind its
        manifest, indistinguishable from a rollback. One manifest write per step (a collection
        cycle writes every use case) keeps the cost at one extra fsync'd rename per step.
        """
        if not writes:
            return
        manifest = self._manifest
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
                # change starts a new memo only with a new memo generation, charged; _apply_registry).
                raise RuntimeError(f"use case {name}: permanent state would change; refusing to write")
            entry = manifest.entries.get(name)
            spent = self._epsilon_total(slot, doc)
            if entry is not None and spent + EPSILON_SLACK < entry.epsilon_total:
                raise RuntimeError(f"use case {name}: ε spent would go down; refusing to write")
            doc.device = manifest.device
            doc.generation = (0 if entry is None else entry.generation) + 1
            self._sealer.write(slot.path, f"usecase:{name}", USE_CASE_VERSION, doc.to_plain())
            updated = updated.with_entry(name, ManifestEntry(doc.generation, spent))
        self._write_manifest(updated)
        self._manifest = updated
        for slot, doc in writes:
            slot.doc = doc

    def _write_ledger(self, ledger: LedgerDoc) -> None:
        self._sealer.write(self._path("ledger" + _SUFFIX), "ledger", LEDGER_VERSION, ledger.to_plain())
        self._ledger = ledger

    # ------------------------------------------------------------------ consent

    @property
    def consented(self) -> bool:
        """True once the user opted in (and until they revoke)."""
        return self._consent is not None

    @property
    def consent(self) -> ConsentDoc | None:
        """The consent record, or None."""
        return self._consent

    def grant_consent(self) -> ConsentDoc:
        """Opt in. Idempotent: an existing grant is kept."""
        if self._consent is None:
            doc = ConsentDoc(granted_at=self.clock.time())
            self._sealer.write(self._path("consent" + _SUFFIX), "consent", CONSENT_VERSION, doc.to_plain())
            self._load()
            log.info("consent granted")
        assert self._consent is not None
        return self._consent

    def revoke_consent(self) -> int:
        """Opt out: delete every state file (permanent state, outbox, ledger, schedule, consent).

        Returns:
            The number of files removed.
        """
        removed = 0
        consent_path = self._path("consent" + _SUFFIX)
        # Consent goes first: a crash half-way leaves an agent that is opted out. The manifest goes
        # last, so a half-finished revocation never leaves use-case files without their manifest.
        if consent_path.exists():
            consent_path.unlink()
            removed += 1
            fsync_directory(self.state_dir)
        for p in sorted(self.state_dir.iterdir(), key=lambda p: (p.name == _MANIFEST, p.name)):
            if p.is_file() and (p.name.endswith(_SUFFIX) or p.name.endswith(".tmp")):
                p.unlink()
                removed += 1
                if p.name == _MANIFEST:
                    fsync_directory(self.state_dir)
        fsync_directory(self.state_dir)
        self._load()
        log.info("consent revoked; %d state files deleted", removed)
        return removed

    def _require_consent(self) -> None:
        if self._consent is None and self.consent_broken is not None:
            raise ConsentUnreadableError(
                f"the state key does not open the state in {self.state_dir} (consent record: "
                f"{self.consent_broken}): use the key it was written with (key_file or the systemd "
                "credential), or revoke consent to delete the state and start over"
            )
        if self._consent is None:
            raise ConsentRequiredError(
                "the user has not opted in: nothing is recorded or sent (ldp-agent consent grant)"
            )

    # ------------------------------------------------------------------ recording

    def _slot(self, name: str) -> _Slot:
        slot = self._slots.get(name)
        if slot is None:
            known = ", ".join(sorted(self.registry.use_cases))
            raise ValueRefusedError(f"unknown use case {name!r}; the registry has: {known}")
        if slot.broken:
            raise UseCaseStoppedError(f"use case {name!r} is stopped: {slot.broken}")
        return slot

    def _period_for_record(self, slot: _Slot, doc: UseCaseDoc) -> int:
        # A clock set backwards must not reopen a period that was already reported.
        return max(slot.use_case.period.index_at(self.clock.time()), doc.last_closed + 1)

    def record(self, use_case: str, value: object, *, key: str | None = None) -> RecordOutcome:
        """Record one value (privatizing it now, or adding it to a counter's running total).

        Args:
            use_case: the use case's name.
            value: the value (type and range depend on the mechanism).
            key: for counter use cases, which counter (for example the application); each
                key has its own permanent state and is reported as its own record.

        Raises:
            ConsentRequiredError: before the user opted in.
            ValueRefusedError: unknown use case, or a value that does not fit it.
            UseCaseStoppedError: the use case stopped (ε cap spent, unreadable state, ...).
        """
        return self.record_many([(use_case, value, key)])[0]

    def record_many(self, items: Iterable[tuple[str, object, str | None]]) -> list[RecordOutcome]:
        """Record several values with one write per use case (the probes' path).

        All values are checked before anything is written: one bad value refuses the batch.

        Raises:
            as :meth:`record`.
        """
        self._require_consent()
        by_slot: dict[str, list[tuple[object, str | None]]] = {}
        for name, value, key in items:
            slot = self._slot(name)
            self._check_value(slot, value, key)
            by_slot.setdefault(name, []).append((value, key))
        outcomes: list[RecordOutcome] = []
        writes: list[tuple[_Slot, UseCaseDoc]] = []
        for name, values in by_slot.items():
            slot = self._slots[name]
            doc = copy.deepcopy(slot.doc) if slot.doc is not None else self._new_doc(slot.use_case)
            budget = self._budget(slot, doc)
            if budget.exhausted(slot.use_case.cost):
                self._write_slots(writes)  # what was recorded before this use case is kept
                raise UseCaseStoppedError(
                    f"use case {name!r} has spent its lifetime ε cap ({budget.epsilon_cap:g}) and no longer records"
                )
            for value, key in values:
                outcome = self._record_into(slot, doc, value, key)
                pending = doc.pending.get(self._period_for_record(slot, doc))
                note = ""
                if slot.kind is Kind.COUNTER:
                    note = clamp_note(slot.use_case, check_counter_value(slot.use_case, value)) or ""
                outcomes.append(
                    RecordOutcome(
                        name,
                        outcome,
                        counter=slot.kind is Kind.COUNTER,
                        offered=pending.offered if pending is not None else 0,
                        limit=slot.use_case.daily_limit,
                        note=note,
                    )
                )
            writes.append((slot, doc))
        self._write_slots(writes)
        return outcomes

    def _check_value(self, slot: _Slot, value: object, key: str | None) -> None:
        uc = slot.use_case
        if not isinstance(value, str | bytes | int | float):  # bool is an int
            raise ValueRefusedError(
                f"use case {uc.name!r} ({uc.mechanism.name}) takes a number or a string; got {type(value).__name__}"
            )
        if key is not None and slot.kind is not Kind.COUNTER:
            raise ValueRefusedError(f"use case {uc.name!r} ({uc.mechanism.name}) takes no counter key")
        if key is not None and (not isinstance(key, str) or not key or len(key) > 256):
            raise ValueRefusedError(f"a counter key is a non-empty string of at most 256 characters; got {key!r}")
        check_value(uc, value)

    def _record_into(self, slot: _Slot, doc: UseCaseDoc, value: object, key: str | None) -> str:
        uc = slot.use_case
        period = self._period_for_record(slot, doc)
        if slot.kind is Kind.COUNTER:
            amount = check_counter_value(uc, value)
            kh = _keyed_hash(doc.hash_key, (key or "").encode("utf-8"), _COUNTER_PERSON)
            if kh not in doc.permanent:
                # First use of this counter key: draw its permanent state (000 §3.1 steps 2-3).
                doc.permanent[kh] = setup(uc, self.rng)
            totals = doc.totals.setdefault(period, {})
            totals[kh] = min(totals.get(kh, 0) + amount, float(1 << 53))
            return "recorded"
        pending = doc.pending.setdefault(period, PendingRecords(definition=uc.definition, cost=uc.cost))
        if slot.kind is Kind.STRING:
            assert isinstance(value, str)
            seen = _keyed_hash(doc.hash_key, value.encode("utf-8"), _STRING_PERSON)
            if seen in pending.seen:
                return "duplicate"
            if len(pending.seen) >= MAX_SEEN_PER_PERIOD:
                doc.unsent_records += 1
                return "dropped"
            stored = doc.permanent.get(b"\0" * 32)
            state = setup(uc, self.rng) if stored is None else stored
            wire, state = privatize(uc, value, state, self.rng)
            # The memo entry B' for this value is persisted in the same write as the record.
            doc.permanent[b"\0" * 32] = state
            pending.seen.append(seen)
        else:
            wire, _ = privatize(uc, value, None, self.rng)
        reservoir_offer(pending, wire, uc.daily_limit, self.rng)
        return "recorded"

    # ------------------------------------------------------------------ collection

    def collect(self) -> CycleSummary:
        """Close every ended period: answer, sample within the limits, charge, stage in the outbox.

        Raises:
            ConsentRequiredError: before the user opted in.
        """
        self._require_consent()
        reports = records = unsent = 0
        spent = 0.0
        now = self.clock.time()
        writes: list[tuple[_Slot, UseCaseDoc]] = []
        for slot in self._slots.values():
            if slot.broken or slot.doc is None:
                continue
            doc = copy.deepcopy(slot.doc)
            r, n, u, e = self._collect_one(slot, doc, now)
            if (doc.last_closed, doc.budget, len(doc.outbox)) != (
                slot.doc.last_closed,
                slot.doc.budget,
                len(slot.doc.outbox),
            ) or doc.dropped_reports != slot.doc.dropped_reports:
                writes.append((slot, doc))
            reports, records, unsent, spent = reports + r, records + n, unsent + u, spent + e
        self._write_slots(writes)
        return CycleSummary(reports=reports, records=records, unsent=unsent, epsilon=spent)

    def _collect_one(self, slot: _Slot, doc: UseCaseDoc, now: float) -> tuple[int, int, int, float]:
        uc = slot.use_case
        budget = self._budget(slot, doc).at(day_of(now))
        was_exhausted = budget.exhausted(uc.cost)
        current = max(uc.period.index_at(now), doc.last_closed + 1)
        closing = sorted(p for p in set(doc.totals) | set(doc.pending) if p < current)
        reports = records = unsent = 0
        spent = 0.0
        for period in closing:
            definition, cost = uc.definition, uc.cost
            if slot.kind is Kind.COUNTER:
                wire: list[object] = []
                for kh, total in sorted(doc.totals.pop(period).items()):
                    # Answer from the memo (000 §3.1 step 4, §3.4); the raw total is erased with the period.
                    record, _ = privatize(uc, counter_input(uc, total), doc.permanent[kh], self.rng)
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
            budget, n, epsilon, left_out = self._stage(
                uc, doc, budget, period, wire, definition=definition, cost=cost, now=now
            )
            unsent += left_out
            if n:
                reports += 1
                records += n
                spent += epsilon
        doc.unsent_records += unsent
        if unsent:
            log.info("use case %s: %d records not sent (daily limit or ε cap)", uc.name, unsent)
        self._trim_outbox(uc.name, doc, now)
        doc.budget = budget.to_plain()
        if budget.exhausted(uc.cost) and not was_exhausted:
            log.warning(
                "use case %s reached its lifetime ε cap (%g): it stops recording and reporting",
                uc.name,
                budget.epsilon_cap,
            )
        return reports, records, unsent, spent

    def _stage(
        self,
        uc: UseCase,
        doc: UseCaseDoc,
        budget: Budget,
        period: int,
        wire: Sequence[object],
        *,
        definition: bytes,
        cost: float,
        now: float,
    ) -> tuple[Budget, int, float, int]:
        """Charge a report of a period's records and put it in the outbox.

        A uniformly random subset when there are more records than the daily limit and the
        lifetime ε cap allow (003 §3.2.1). The report carries ``definition``, the hash of the
        definition the records were made under.

        Returns:
            The charged budget, the records staged, the ε charged, and the records left out.
        """
        if not wire:
            return budget, 0, 0.0, 0
        left = budget.remaining()
        affordable = math.floor((left.epsilon + EPSILON_SLACK) / cost) if cost > 0 else len(wire)
        n = min(len(wire), left.records_today, affordable, uc.daily_limit)
        # The division above is in floating point: let the accountant itself decide the edge case,
        # so float rounding can never turn into a refused spend (and a crash loop) below.
        while n > 0 and not budget.fits(n, n * cost):
            n -= 1
        if n == 0:
            return budget, 0, 0.0, len(wire)
        chosen = sorted(sample_without_replacement(self.rng, len(wire), n)) if n < len(wire) else range(n)
        sent = [wire[i] for i in chosen]
        epsilon = n * cost
        budget = budget.spend(n, epsilon)
        report = Report(
            use_case=uc.name,
            definition=definition,
            period=period,
            report_id=new_report_id(self.rng),
            records=sent,
        )
        doc.outbox.append(
            OutboxEntry(
                report_id=report.report_id,
                period=period,
                payload=encode_report(report),
                records=n,
                epsilon=float(epsilon),
                created=float(now),
                day=budget.day,
                epsilon_today=float(budget.epsilon_today),
                epsilon_total=float(budget.epsilon_total),
            )
        )
        return budget, n, epsilon, len(wire) - n

    def _trim_outbox(self, name: str, doc: UseCaseDoc, now: float) -> None:
        fresh = [e for e in doc.outbox if now - e.created <= self.outbox_max_age]
        overflow = max(0, len(fresh) - self.outbox_max_reports)
        dropped = len(doc.outbox) - len(fresh) + overflow
        if dropped:
            log.warning("use case %s: %d unsent reports dropped from the outbox (too old or too many)", name, dropped)
            doc.dropped_reports += dropped
            doc.outbox = fresh[overflow:]

    # ------------------------------------------------------------------ outbox and ledger

    def topic(self, use_case: str) -> str:
        """The MQTT topic of a use case's reports."""
        if self.device_identity:
            return f"{self.topic_prefix}/{self.device_identity}/{use_case}"
        return f"{self.topic_prefix}/{use_case}"

    def outbox(self) -> list[Pending]:
        """Reports waiting for the broker, oldest first (none while the ledger is unreadable)."""
        if self._consent is None or self.ledger_broken:
            return []
        out = [
            Pending(name, self.topic(name), e)
            for name, slot in self._slots.items()
            if slot.doc is not None and not slot.broken
            for e in slot.doc.outbox
        ]
        out.sort(key=lambda p: (p.entry.created, p.use_case))
        return out

    @property
    def outbox_size(self) -> int:
        """Number of reports waiting."""
        return sum(len(s.doc.outbox) for s in self._slots.values() if s.doc is not None)

    def due(self, now: float, timeout: float, cap: float) -> tuple[list[Pending], float | None]:
        """Reports to send now (never sent, or sent with no receipt for ``receipt_wait``).

        Returns:
            The reports due, oldest first, and the earliest time a report not due now will be
            (None when nothing else waits).
        """
        out: list[Pending] = []
        later: float | None = None
        for p in self.outbox():
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

    def _ledger_entry(self, p: Pending, now: float, status: str) -> LedgerEntry:
        body = msgpack.unpackb(p.entry.payload, raw=False)
        return LedgerEntry(
            report_id=p.entry.report_id,
            use_case=p.use_case,
            period=p.entry.period,
            records=list(body["r"]),
            epsilon=p.entry.epsilon,
            day=p.entry.day,
            epsilon_today=p.entry.epsilon_today,
            epsilon_total=p.entry.epsilon_total,
            sent=now,
            status=status,
        )

    def _current_ledger(self, now: float) -> LedgerDoc | None:
        if self._ledger is None:
            return None
        return LedgerDoc(
            [copy.copy(e) for e in self._ledger.entries if now - e.sent <= self.ledger_retention],
            [n for n in self._ledger.notices if now - n.at <= self.ledger_retention],
        )

    def acknowledge(self, acked: Sequence[Pending]) -> None:
        """Reports the broker acknowledged (without receipts): add them to the ledger, then
        drop them from the outbox.

        The ledger is written first; a crash before the outbox write resends identical bytes
        (the collector de-duplicates by report id) and the ledger keeps one entry per id.
        """
        if not acked:
            return
        now = self.clock.time()
        ledger = self._current_ledger(now)
        if ledger is None:
            return
        known = {e.report_id for e in ledger.entries}
        for p in acked:
            if p.entry.report_id in known:
                continue
            ledger.entries.append(self._ledger_entry(p, now, "sent"))
            known.add(p.entry.report_id)
        self._write_ledger(ledger)
        done: dict[str, set[bytes]] = {}
        for p in acked:
            done.setdefault(p.use_case, set()).add(p.entry.report_id)
        self._drop_from_outbox(done)

    def _drop_from_outbox(self, done: dict[str, set[bytes]]) -> None:
        writes: list[tuple[_Slot, UseCaseDoc]] = []
        for name, ids in done.items():
            slot = self._slots.get(name)
            if slot is None or slot.doc is None or slot.broken:
                continue
            doc = copy.deepcopy(slot.doc)
            doc.outbox = [e for e in doc.outbox if e.report_id not in ids]
            writes.append((slot, doc))
        self._write_slots(writes)

    def mark_sent(self, sent: Sequence[Pending]) -> None:
        """Reports the broker acknowledged (with receipts): the ledger says "sent", and each
        stays in the outbox with the time of this send and its count, waiting for its receipt.
        """
        if not sent:
            return
        now = self.clock.time()
        ledger = self._current_ledger(now)
        if ledger is None:
            return
        known = {e.report_id for e in ledger.entries}
        fresh = [p for p in sent if p.entry.report_id not in known]
        if fresh:
            ledger.entries.extend(self._ledger_entry(p, now, "sent") for p in fresh)
            self._write_ledger(ledger)
        by_case: dict[str, set[bytes]] = {}
        for p in sent:
            by_case.setdefault(p.use_case, set()).add(p.entry.report_id)
        writes: list[tuple[_Slot, UseCaseDoc]] = []
        for name, ids in by_case.items():
            slot = self._slots.get(name)
            if slot is None or slot.doc is None or slot.broken:
                continue
            doc = copy.deepcopy(slot.doc)
            for e in doc.outbox:
                if e.report_id in ids:
                    e.sent_at = now
                    e.attempts += 1
            writes.append((slot, doc))
        self._write_slots(writes)

    def settle(self, receipts: Sequence[Receipt]) -> int:
        """Commit receipts arrived: the ledger records the outcome, then the reports leave the outbox.

        A receipt for a report no longer in the outbox (a second answer to a resend) is
        ignored. Ledger first, as in :meth:`acknowledge`: a crash in between re-sends bytes
        the collector answers "counted" again.

        Returns:
            The number of reports settled.
        """
        outcome = {r.correlation: ("counted" if r.counted else f"refused: {r.reason or 'unknown'}") for r in receipts}
        waiting = [p for p in self.outbox() if p.entry.report_id in outcome]
        if not waiting:
            return 0
        now = self.clock.time()
        ledger = self._current_ledger(now)
        if ledger is None:
            return 0
        index = {e.report_id: e for e in ledger.entries}
        for p in waiting:
            status = outcome[p.entry.report_id]
            entry = index.get(p.entry.report_id)
            if entry is None:
                ledger.entries.append(self._ledger_entry(p, now, status))
            else:
                entry.status = status
            if status != "counted":
                log.warning("use case %s: the collector refused a report (%s)", p.use_case, status[9:])
        self._write_ledger(ledger)
        done: dict[str, set[bytes]] = {}
        for p in waiting:
            done.setdefault(p.use_case, set()).add(p.entry.report_id)
        self._drop_from_outbox(done)
        return len(waiting)

    def ledger(self) -> list[LedgerEntry]:
        """What left the device, oldest first.

        Raises:
            ConsentRequiredError: before the user opted in.
            StateUnreadableError: if the ledger cannot be read.
        """
        self._require_consent()
        if self._ledger is None:
            raise StateUnreadableError(str(self._path("ledger" + _SUFFIX)), self.ledger_broken or "not loaded")
        return list(self._ledger.entries)

    def notices(self) -> list[LedgerNotice]:
        """What registry changes did to the state (new definitions, new memos, wiped use cases), oldest first.

        Raises:
            ConsentRequiredError: before the user opted in.
            StateUnreadableError: if the ledger cannot be read.
        """
        self._require_consent()
        if self._ledger is None:
            raise StateUnreadableError(str(self._path("ledger" + _SUFFIX)), self.ledger_broken or "not loaded")
        return list(self._ledger.notices)

    # ------------------------------------------------------------------ schedule and status

    def load_schedule(self) -> AgentDoc:
        """The schedule bookkeeping (a fresh one if missing or unreadable: it holds no randomness)."""
        try:
            raw = self._sealer.read(self._path("agent" + _SUFFIX), "agent", AGENT_VERSION)
            return AgentDoc() if raw is None else AgentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            log.warning("schedule state unreadable (%s); starting a new schedule", e)
            return AgentDoc()

    def save_schedule(self, doc: AgentDoc) -> None:
        """Persist the schedule bookkeeping (only once the user opted in)."""
        if self._consent is not None:
            self._sealer.write(self._path("agent" + _SUFFIX), "agent", AGENT_VERSION, doc.to_plain())

    def use_case_status(self) -> list[dict[str, Any]]:
        """Per use case: state, limits, spending and what waits."""
        now = self.clock.time()
        out = []
        for name, uc in self.registry.use_cases.items():
            slot = self._slots.get(name)
            row: dict[str, Any] = {
                "use_case": name,
                "definition": uc.ref,
                "mechanism": uc.mechanism.name,
                "period": uc.period.value,
                "daily_limit": uc.daily_limit,
                "epsilon_per_record": uc.cost,
                "epsilon_cap": uc.lifetime_epsilon,
            }
            if slot is None:
                row["state"] = "no consent"
                out.append(row)
                continue
            if slot.broken:
                row["state"] = f"stopped: {slot.broken}"
                entry = None if self._manifest is None else self._manifest.entries.get(name)
                if entry is not None:
                    # What the manifest recorded: a stopped use case's ε spent is still shown, never lower.
                    row["epsilon_total"] = entry.epsilon_total
                out.append(row)
                continue
            doc = slot.doc
            budget = (
                self._budget(slot, doc).at(day_of(now))
                if doc is not None
                else Budget(daily_limit=uc.daily_limit, epsilon_cap=uc.lifetime_epsilon)
            )
            row["state"] = "stopped: lifetime ε cap reached" if budget.exhausted(uc.cost) else "active"
            row["records_today"] = budget.records_today
            row["epsilon_today"] = budget.epsilon_today
            row["epsilon_total"] = budget.epsilon_total
            row["pending_records"] = 0 if doc is None else sum(len(p.records) for p in doc.pending.values())
            row["open_counters"] = 0 if doc is None else sum(len(t) for t in doc.totals.values())
            row["outbox"] = 0 if doc is None else len(doc.outbox)
            row["awaiting_receipt"] = 0 if doc is None else sum(1 for e in doc.outbox if e.attempts)
            row["dropped_reports"] = 0 if doc is None else doc.dropped_reports
            row["unsent_records"] = 0 if doc is None else doc.unsent_records
            row["memo_generation"] = 0 if doc is None else doc.memo_generation
            out.append(row)
        return out

    def status(self) -> dict[str, Any]:
        """A snapshot for ``ldp-agent status``."""
        schedule = self.load_schedule() if self._consent is not None else AgentDoc()
        return {
            "consent": self._consent is not None,
            "consent_granted_at": None if self._consent is None else self._consent.granted_at,
            "registry": self.registry.hash_hex,
            "registry_source": self.registry.source,
            "next_cycle": schedule.next_cycle or None,
            "last_cycle": schedule.last_cycle or None,
            "cycles": schedule.cycles,
            "outbox": self.outbox_size,
            "ledger": self.ledger_broken or "ok",
            "use_cases": self.use_case_status(),
            "pid": os.getpid(),
        }
