"""The agent's core: one device's state behind one object, :class:`Agent`.

Synchronous and single-threaded: the daemon calls it from its event loop, the CLI calls it
directly when no daemon runs, and the fleet simulator runs many cores (each with its own
state directory, clock and seeded random source) in one process.

Every step is a transaction (:mod:`agent.transaction`): its change is computed purely from the
:class:`~agent.device_state.DeviceState` in force (each use case's new document made from a
copy), written by :func:`agent.transaction.commit`, and only then adopted (:meth:`Agent._commit`),
so what is in memory is always what is on disk. The steps an application, a probe, the operator
or the schedule asks for (recording, a collection cycle, re-enrolment) first check consent and
that the state can be written, in one place (:meth:`Agent._ready`, :meth:`Agent._step`); the
publisher's steps (a send, an acknowledgement, a receipt) keep their reports for a later send
when a write fails, in one place too (:meth:`Agent._publisher_step`).

:class:`Agent` is the one object the daemon, the CLI, the API, the fleet simulator and the
tests use. Each of its jobs is a module of its own:

* :mod:`agent.statefiles` - the sealed files, each read and written on its own;
* :mod:`agent.device_state` - the state in memory, one frozen value;
* :mod:`agent.loading` - opening them and checking every use-case file against the manifest
  (docs/state-integrity.md);
* :mod:`agent.transaction` - a step's change and its commit: the use-case files, then the
  manifest;
* :mod:`agent.recording` - recording values (privatized at once, or a counter's total);
* :mod:`agent.collection` - collection cycles: closing periods, the daily limit and the ε
  cap, staging reports in the outbox;
* :mod:`agent.outbox` - the outbox, the ledger and commit receipts;
* :mod:`agent.registry_change` - carrying the state over to a changed registry
  (docs/privacy-accounting.md, "Registry changes");
* :mod:`agent.re_enrolment` - the operator's way out of state stopped by deleted or replaced
  files, carrying ε spent forward (docs/state-integrity.md);
* :mod:`agent.status` - the typed status, built here once.

Consent comes first: nothing is recorded, collected or listed before the user opted in.

A state directory that cannot be written (a full disk) bends the agent, it does not end it
(docs/state-integrity.md, "A full disk"): ``record`` is refused with
:class:`~agent.errors.StateWriteError`, a collection cycle closes nothing, nothing is
published (a send could not be recorded), and ``status`` says so; every later step tries
again, so the agent resumes by itself once a write succeeds. Nothing already written is
touched: each step is adopted in memory only after its writes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent import expiry, loading, outbox, registry_change, transaction
from agent.accounting import Budget, day_of
from agent.device_state import DeviceState, Slot, budget_of, epsilon_recorded
from agent.errors import (
    ConsentRequiredError,
    ConsentUnreadableError,
    StateWriteError,
    UseCaseStoppedError,
    ValueRefusedError,
)
from agent.outbox import Pending
from agent.sealed import Sealer
from agent.state import AgentDoc, ConsentDoc, LedgerEntry, LedgerNotice
from agent.statefiles import LEDGER, StateFiles
from agent.status import AgentStatus, UseCaseStatus
from agent.transaction import Change
from protocol.randomness import RandomSource
from protocol.registry import Registry, UseCase
from runtime.clock import Clock

if TYPE_CHECKING:
    from agent import recording
    from agent.collection import CycleSummary
    from agent.re_enrolment import Carried
    from agent.recording import RecordOutcome
    from protocol.receipts import Receipt

__all__ = ["Agent"]

log = logging.getLogger("ldp_agent")

T = TypeVar("T")


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
        self.clock = clock
        self.rng = rng
        self.topic_prefix = topic_prefix
        self.device_identity = device_identity
        self.outbox_max_reports = outbox_max_reports
        self.outbox_max_age = outbox_max_age_days * 86_400.0
        self.ledger_retention = ledger_retention_days * 86_400.0
        self._files = StateFiles(state_dir, sealer)
        self._state = DeviceState()
        self._paused_since: float | None = None
        self._load()

    def _load(self) -> None:
        """Load the state directory, carry it over to the registry, and write the ledger's
        notices of end dates; the state in force is replaced whole."""
        state = loading.load(self._files, self.registry, self.rng)
        if state.manifest is not None:
            try:
                change = registry_change.carried_over(
                    self._files,
                    state,
                    self.registry,
                    now=self.clock.time(),
                    rng=self.rng,
                    ledger_retention=self.ledger_retention,
                )
                state = transaction.commit(self._files, state, change)
            except StateWriteError as e:
                # Nothing of the carried-over state was adopted; the next step loads again.
                state = replace(state, manifest=None, load_blocked=e)
        self._state = state
        if state.manifest is not None:
            self._note_expiries()
        # One line per reason: a missing manifest stops every use case for the same reason,
        # which the journal (and a one-shot verb's stderr) should say once, not once per use case.
        by_reason: dict[str, list[str]] = {}
        for name, slot in self._state.slots.items():
            if slot.broken:
                by_reason.setdefault(str(slot.broken), []).append(name)
        for reason, names in by_reason.items():
            if reason == self._state.directory_broken:
                continue  # logged once where the state directory was read
            log.error("use case%s %s stopped: %s", "s" if len(names) > 1 else "", ", ".join(names), reason)

    def _note_expiries(self) -> None:
        """The ledger's notices of use cases that passed their end date or were renewed (agent/expiry.py)."""
        change = expiry.note_expiries(
            self._state, self.registry, now=self.clock.time(), retention=self.ledger_retention
        )
        try:
            self._commit(change)
        except StateWriteError as e:
            log.warning("a ledger notice of an end date was not written; the next cycle writes it: %s", e)

    # ------------------------------------------------------------------ the one way a step runs

    def _commit(self, change: Change) -> None:
        """Write ``change`` (agent.transaction) and adopt the state that follows.

        Raises:
            StateWriteError: a write failed; the state in force is unchanged.
        """
        self._state = transaction.commit(self._files, self._state, change)

    def _ready(self) -> None:
        """What every step that writes does first: consent, then the state writable.

        Each step tries again first what the last failed write blocked (:meth:`_writable`), so
        the agent resumes by itself when space returns.

        Raises:
            ConsentRequiredError, ConsentUnreadableError: before the user opted in, or with a key
                that does not open the state.
            StateWriteError: a load whose writes failed could not be made again: nothing can be
                written until it is.
        """
        self._require_consent()
        blocked = self._writable()
        if blocked is not None and self._state.load_blocked is not None:
            raise blocked

    def _step(self, compute: Callable[[DeviceState], tuple[Change, T]]) -> T:
        """Run one step that changes the state: :meth:`_ready`, then the change ``compute`` makes
        of the state in force, committed and adopted.

        Raises:
            as :meth:`_ready`; StateWriteError also when the step's own writes fail: nothing of
            the step was kept.
        """
        self._ready()
        change, result = compute(self._state)
        self._commit(change)
        return result

    def _publisher_step(self, compute: Callable[[DeviceState], tuple[Change, T]], fallback: T, what: str) -> T:
        """Run one step of the publisher (a send, an acknowledgement, a receipt): the change
        ``compute`` makes of the state in force, committed and adopted. A write that fails is
        logged and the step's reports stay in the outbox, to be sent again byte for byte once the
        state can be written (the collector de-duplicates them by report id); ``fallback`` is
        returned then."""
        try:
            change, result = compute(self._state)
            self._commit(change)
        except StateWriteError as e:
            log.error("%s not recorded, the reports will be sent again: %s", what, e)
            return fallback
        return result

    def _ledger_step(self, change: Callable[..., Change], items: Sequence[object], broker: str, what: str) -> None:
        """The publisher step that the outbox's ``change`` (``acknowledge``, ``mark_sent``,
        ``mark_refused``) makes of ``items`` through ``broker``, now (``what`` names it in the log)."""
        now = self.clock.time()
        retention = self.ledger_retention
        self._publisher_step(
            lambda state: (change(state, items, now=now, retention=retention, broker=broker), None), None, what
        )

    def _writable(self) -> StateWriteError | None:
        """Try again what the last failed write blocked; None once the state can be written.

        A load whose writes failed is made again; after any other failed write the manifest is
        written again as it is.
        """
        if self._state.load_blocked is not None:
            self._load()
        elif self._files.blocked is not None:
            self._files.probe()
        problem = self._state.load_blocked or self._files.blocked
        if problem is None:
            self._paused_since = None
        elif self._paused_since is None:
            self._paused_since = self.clock.time()
        return problem

    def _paused(self, cause: StateWriteError) -> StateWriteError:
        """The refusal of a value while the state cannot be written."""
        if self._paused_since is None:
            self._paused_since = self.clock.time()
        return StateWriteError(
            cause.path,
            f"{cause.reason}. Recording is paused and this value was not kept; the agent keeps running and "
            "resumes by itself once the state directory can be written again",
        )

    # ------------------------------------------------------------------ consent

    @property
    def consented(self) -> bool:
        """True once the user opted in (and until they revoke)."""
        return self._state.consent is not None

    @property
    def consent(self) -> ConsentDoc | None:
        """The consent record, or None."""
        return self._state.consent

    @property
    def consent_broken(self) -> str | None:
        """Why the consent record does not open (a key that is not the state's), or None."""
        return self._state.consent_broken

    @property
    def ledger_broken(self) -> str | None:
        """Why the ledger does not open (nothing is published meanwhile), or None."""
        return self._state.ledger_broken

    def grant_consent(self) -> ConsentDoc:
        """Opt in. Idempotent: an existing grant is kept."""
        if self._state.consent is None:
            self._files.write_consent(ConsentDoc(granted_at=self.clock.time()))
            self._load()
            log.info("consent granted")
        assert self._state.consent is not None
        return self._state.consent

    def revoke_consent(self) -> int:
        """Opt out: delete every state file (permanent state, outbox, ledger, schedule, consent).

        Returns:
            The number of files removed.
        """
        removed = self._files.remove_all()
        self._load()
        log.info("consent revoked; %d state files deleted", removed)
        return removed

    def _require_consent(self) -> None:
        if self._state.consent is None and self._state.consent_broken is not None:
            raise ConsentUnreadableError(
                f"the state key does not open the state in {self.state_dir} (consent record: "
                f"{self._state.consent_broken}): use the key it was written with (key_file or the systemd "
                "credential), or revoke consent to delete the state and start over"
            )
        if self._state.consent is None:
            raise ConsentRequiredError(
                "the user has not opted in: nothing is recorded or sent (ldp-agent consent grant)"
            )

    # ------------------------------------------------------------------ recording and collection

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
            UseCaseStoppedError: the use case stopped (ε cap spent, unreadable state, ...);
                ``UseCaseExpiredError`` past its end date (nothing stored, nothing charged).
            StateWriteError: the state cannot be written (a full disk): recording is paused,
                the value was not kept.
        """
        return self._record_many([(use_case, value, key)])[0]

    def _record_many(self, items: Iterable[tuple[str, object, str | None]]) -> list[RecordOutcome]:
        from agent import recording  # noqa: PLC0415 - a verb that only reads the state needs none of it

        def compute(state: DeviceState) -> tuple[Change, recording.Recorded]:
            recorded = recording.record_many(state, self.registry, items, now=self.clock.time(), rng=self.rng)
            return recorded.change, recorded

        try:
            recorded = self._step(compute)
        except StateWriteError as e:
            raise self._paused(e) from e
        if recorded.stopped is not None:
            raise recorded.stopped  # what was recorded for the use cases before it is kept
        return recorded.outcomes

    def record_each(
        self, items: Iterable[tuple[str, object, str | None]]
    ) -> list[RecordOutcome | ValueRefusedError | UseCaseStoppedError]:
        """Record several values as :meth:`record` would one by one, with one state write for all.

        Each value gets its outcome, or the error :meth:`record` would have raised for it
        (``ValueRefusedError``, ``UseCaseStoppedError``); the others are recorded all the same.

        Raises:
            ConsentRequiredError: before the user opted in.
            StateWriteError: the state cannot be written: recording is paused, no value was kept.
        """
        from agent import recording  # noqa: PLC0415 - as in _record_many

        try:
            return self._step(
                lambda state: recording.record_each(state, self.registry, items, now=self.clock.time(), rng=self.rng)
            )
        except StateWriteError as e:
            raise self._paused(e) from e

    def record_many(self, items: Iterable[tuple[str, object, str | None]]) -> list[RecordOutcome]:
        """Record several values with one write per use case (the probes' path).

        All values are checked before anything is written: one bad value refuses the batch.
        While the state cannot be written each value's outcome is ``paused`` (not kept), so a
        probe's sampling goes on and tries again next time.

        Raises:
            as :meth:`record`, but for StateWriteError.
        """
        items = list(items)
        try:
            return self._record_many(items)
        except StateWriteError as e:
            from agent.recording import RecordOutcome  # noqa: PLC0415 - as in _record_many

            log.warning("values not recorded: %s", e)
            return [RecordOutcome(name, "paused") for name, _, _ in items]

    def collect(self) -> CycleSummary:
        """Close every ended period: answer, sample within the limits, charge, stage in the outbox.

        Raises:
            ConsentRequiredError: before the user opted in.
        """
        # Imported here: the commands that open the state to read it need no collection cycle.
        from agent import collection  # noqa: PLC0415

        try:
            summary = self._step(
                lambda state: collection.collect(
                    state,
                    now=self.clock.time(),
                    rng=self.rng,
                    outbox_max_reports=self.outbox_max_reports,
                    outbox_max_age=self.outbox_max_age,
                )
            )
        except StateWriteError as e:
            # Nothing of the cycle was adopted: its periods stay open and the next cycle closes them.
            log.error("collection cycle not recorded (the state cannot be written), its periods stay open: %s", e)
            return collection.CycleSummary(0, 0, 0, 0.0)
        self._note_expiries()
        return summary

    def re_enrol(self) -> list[Carried]:
        """Start anew the use cases stopped by deleted or replaced state files, with new permanent
        randomness, carrying their ε spent forward and charging each new memo (the operator's
        ``ldp-agent re-enrol``; docs/state-integrity.md).

        Raises:
            ConsentRequiredError: before the user opted in.
            NothingToReEnrolError: nothing is stopped.
            StateWriteError: the state cannot be written.
        """
        from agent import re_enrolment  # noqa: PLC0415 - the re-enrol verb's alone

        self._ready()
        # Re-enrolment writes its own files in its own order (agent.re_enrolment), and the state
        # is loaded again from them.
        now = self.clock.time()
        carried = re_enrolment.re_enrol(self._files, self._state, self.registry, now=now, rng=self.rng)
        self._load()
        return carried

    # ------------------------------------------------------------------ outbox and ledger

    def topic(self, use_case: str) -> str:
        """The MQTT topic of a use case's reports."""
        if self.device_identity:
            return f"{self.topic_prefix}/{self.device_identity}/{use_case}"
        return f"{self.topic_prefix}/{use_case}"

    def outbox(self) -> list[Pending]:
        """Reports waiting for the broker, oldest first (none while the ledger is unreadable, or
        while the state cannot be written: a send could not be recorded)."""
        if self._state.consent is None or self._writable() is not None:
            return []
        return outbox.waiting(self._state, self.topic)

    @property
    def outbox_size(self) -> int:
        """Number of reports waiting."""
        return outbox.outbox_size(self._state)

    def due(self, now: float, timeout: float, cap: float) -> tuple[list[Pending], float | None]:
        """Reports to send now (never sent, or sent with no receipt for ``receipt_wait``).

        Returns:
            The reports due, oldest first, and the earliest time a report not due now will be
            (None when nothing else waits).
        """
        return outbox.due(self.outbox(), now, timeout, cap)

    def acknowledge(self, acked: Sequence[Pending], *, broker: str = "") -> None:
        """Reports the broker acknowledged (without receipts): add them to the ledger (with the
        ``broker`` that acknowledged them), then drop them from the outbox.

        The ledger is written first; a crash before the outbox write resends identical bytes
        (the collector de-duplicates by report id) and the ledger keeps one entry per id.
        """
        self._ledger_step(outbox.acknowledge, acked, broker, "acknowledgements")

    def mark_sent(self, sent: Sequence[Pending], *, broker: str = "") -> None:
        """Reports the ``broker`` acknowledged (with receipts): the ledger says "sent", and each
        stays in the outbox with the time of this send and its count, waiting for its receipt.
        """
        self._ledger_step(outbox.mark_sent, sent, broker, "sends")

    def mark_refused(self, refused: Sequence[tuple[Pending, str]], *, broker: str = "") -> None:
        """Sends the ``broker`` refused, with the reason: the ledger says "refused by the broker:
        <reason>", and each report waits in the outbox to be tried again (agent.outbox)."""
        self._ledger_step(outbox.mark_refused, refused, broker, "refused sends")

    def settle(self, receipts: Sequence[Receipt], *, broker: str = "") -> int:
        """Commit receipts arrived (through ``broker``): the ledger records the outcome and the
        broker, then the reports leave the outbox.

        A receipt for a report no longer in the outbox (a second answer to a resend) is
        ignored. Ledger first, as in :meth:`acknowledge`: a crash in between re-sends bytes
        the collector answers "counted" again.

        Returns:
            The number of reports settled.
        """
        pending = self.outbox()
        now = self.clock.time()
        retention = self.ledger_retention
        return self._publisher_step(
            lambda state: outbox.settle(state, receipts, pending, now=now, retention=retention, broker=broker),
            0,
            "receipts",
        )

    def ledger(self) -> list[LedgerEntry]:
        """What left the device, oldest first.

        Raises:
            ConsentRequiredError: before the user opted in.
            StateUnreadableError: if the ledger cannot be read.
        """
        self._require_consent()
        return outbox.ledger_entries(self._state, str(self._files.path(LEDGER)))

    def notices(self) -> list[LedgerNotice]:
        """What registry changes did to the state (new definitions, new memos, wiped use cases), oldest first.

        Raises:
            ConsentRequiredError: before the user opted in.
            StateUnreadableError: if the ledger cannot be read.
        """
        self._require_consent()
        return outbox.ledger_notices(self._state, str(self._files.path(LEDGER)))

    # ------------------------------------------------------------------ schedule and status

    def load_schedule(self) -> AgentDoc:
        """The schedule bookkeeping (a fresh one if missing, unreadable or another device's: it
        holds no randomness)."""
        doc = self._files.read_schedule()
        manifest = self._state.manifest
        if doc.device is not None and manifest is not None and doc.device != manifest.device:
            return AgentDoc()
        return doc

    def save_schedule(self, doc: AgentDoc) -> None:
        """Persist the schedule bookkeeping (only once the user opted in), bound to the manifest in force."""
        state = self._state
        if state.consent is not None and state.load_blocked is None:
            bound = doc if state.manifest is None else replace(doc, device=state.manifest.device)
            try:
                self._files.write_schedule(bound)
            except StateWriteError as e:
                log.warning("schedule not saved (it holds no randomness; the next cycle is kept in memory): %s", e)

    def use_case_status(self) -> tuple[UseCaseStatus, ...]:
        """Per use case: state, limits, spending and what waits."""
        now = self.clock.time()
        return tuple(
            self._use_case_status(uc, self._state.slots.get(name), now) for name, uc in self.registry.use_cases.items()
        )

    def _use_case_status(self, uc: UseCase, slot: Slot | None, now: float) -> UseCaseStatus:
        base = UseCaseStatus(
            use_case=uc.name,
            definition=uc.ref,
            mechanism=uc.mechanism.name,
            period=uc.period.value,
            daily_limit=uc.daily_limit,
            epsilon_per_record=uc.cost,
            epsilon_cap=uc.lifetime_epsilon,
            state="no consent",
        )
        if slot is None:
            return base
        # Never less than any file of the state directory records (docs/state-integrity.md):
        # after a rollback the manifest's figure may be older than the use-case file's.
        recorded = epsilon_recorded(self._files, self._state, uc.name)
        if slot.broken:
            return replace(base, state=f"stopped: {slot.broken}", epsilon_total=recorded)
        doc = slot.doc
        budget = (
            budget_of(uc, doc).at(day_of(now))
            if doc is not None
            else Budget(daily_limit=uc.daily_limit, epsilon_cap=uc.lifetime_epsilon)
        )
        state = "stopped: lifetime ε cap reached" if budget.exhausted(uc.cost) else "active"
        if state == "active" and uc.metadata.expired(now):
            meta = uc.metadata
            assert meta.expires is not None
            state = f"expired on {meta.expires.isoformat()} (owner: {meta.describe_owner()}): records refused"
        return replace(
            base,
            state=state,
            records_today=budget.records_today,
            epsilon_today=budget.epsilon_today,
            epsilon_total=max(budget.epsilon_total, recorded or 0.0),
            pending_records=0 if doc is None else sum(len(p.records) for p in doc.pending.values()),
            open_counters=0 if doc is None else sum(len(t) for t in doc.totals.values()),
            outbox=0 if doc is None else len(doc.outbox),
            awaiting_receipt=0 if doc is None else sum(1 for e in doc.outbox if e.attempts),
            dropped_reports=0 if doc is None else doc.dropped_reports,
            unsent_records=0 if doc is None else doc.unsent_records,
            memo_generation=0 if doc is None else doc.memo_generation,
        )

    def status(self) -> AgentStatus:
        """A snapshot for ``ldp-agent status``."""
        consent = self._state.consent
        paused = self._writable() if consent is not None else None
        schedule = self.load_schedule() if consent is not None else AgentDoc()
        return AgentStatus(
            consent=consent is not None,
            consent_granted_at=None if consent is None else consent.granted_at,
            registry=self.registry.hash_hex,
            registry_source=self.registry.source,
            next_cycle=schedule.next_cycle or None,
            last_cycle=schedule.last_cycle or None,
            cycles=schedule.cycles,
            outbox=self.outbox_size,
            ledger=self._state.ledger_broken or self._state.ledger_note or "ok",
            use_cases=self.use_case_status(),
            pid=os.getpid(),
            recording="ok" if paused is None else self._pause_text(paused),
        )

    def _pause_text(self, cause: StateWriteError) -> str:
        since = self._paused_since if self._paused_since is not None else self.clock.time()
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        return (
            f"paused since {when}: {cause}. Values are refused and nothing is sent until the state directory "
            "can be written again; the agent resumes by itself"
        )
