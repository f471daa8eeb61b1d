"""What the agent holds of its state directory in memory: one frozen value, replaced whole.

:class:`DeviceState` is what a load found (:mod:`agent.loading`): consent, the ledger, the
manifest in force and one :class:`Slot` per use case of the registry. Nothing changes it in
place. A step computes a :class:`~agent.transaction.Change` from it, purely, and
:func:`agent.transaction.commit` writes that change and returns the next state, adopted by
:class:`agent.core.Agent` only after every write is durable (docs/state-integrity.md, "The
manifest"). The documents it holds are never changed in place either: every change works on a
copy of a document.

The functions here answer from a state and, where a stopped use case's file must be read
again, from the files: the accounting a document saved, and the most ε or memos any file
records for a use case (what status shows and what re-enrolment carries forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.accounting import Budget
from agent.errors import StateWriteError
from agent.manifest import ManifestDoc
from agent.mechanism_calls import fingerprint, memos_held
from agent.state import ConsentDoc, LedgerDoc, UseCaseDoc
from agent.statefiles import StateFiles
from protocol.interfaces import Privatization
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import UseCase

__all__ = [
    "RE_ENROL",
    "DeviceState",
    "Slot",
    "budget_of",
    "epsilon_recorded",
    "epsilon_total",
    "memos_recorded",
    "new_use_case_doc",
]

RE_ENROL = (
    "`ldp-agent re-enrol` (with the daemon stopped) starts the affected use cases anew with new permanent "
    "randomness, carrying their ε spent forward and charging each new memo (docs/state-integrity.md)"
)
"""What the operator can do about state that stopped because files were deleted or replaced."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One use case of the registry and its state as loaded.

    Attributes:
        use_case: the registry's definition.
        kind: when its mechanism privatizes.
        path: its sealed file.
        doc: the document as on disk (None: nothing recorded yet, or it stopped).
        broken: why the use case stopped (None while it runs).
        stale: the file of a use case the registry had removed, found again: removed by the
            registry change that follows the load (:mod:`agent.registry_change`).
    """

    use_case: UseCase
    kind: Privatization
    path: Path
    doc: UseCaseDoc | None = None
    broken: str | None = None
    stale: bool = False


@dataclass(frozen=True, slots=True)
class DeviceState:
    """The state directory as loaded and as written since (nothing before consent).

    Attributes:
        consent: the consent record (None before the user opted in, or while it is unreadable).
        consent_broken: why the consent record does not open (None if it does or is absent).
        ledger: the ledger (None without consent, or while it is unreadable).
        ledger_broken: why the ledger does not open, or why it is not this device's.
        ledger_note: a deleted ledger the manifest says had been written (a new one was started).
        manifest: the manifest in force (None without consent, or when it cannot be trusted).
        slots: the registry's use cases by name, with their state (empty without consent).
        directory_broken: why every use case stopped at once (a missing or untrustworthy
            manifest), logged once.
        load_blocked: the writes a load must make first (the manifest moved forward, files bound
            to it) failed: nothing is written or sent until a load succeeds.
    """

    consent: ConsentDoc | None = None
    consent_broken: str | None = None
    ledger: LedgerDoc | None = None
    ledger_broken: str | None = None
    ledger_note: str | None = None
    manifest: ManifestDoc | None = None
    slots: Mapping[str, Slot] = field(default_factory=dict)
    directory_broken: str | None = None
    load_blocked: StateWriteError | None = None

    def after(
        self,
        *,
        consent: ConsentDoc | None,
        ledger: LedgerDoc | None,
        manifest: ManifestDoc | None,
        slots: Mapping[str, Slot],
    ) -> DeviceState:
        """The state after a step wrote these (what a load found about the files stays as it was)."""
        # Field by field: every step ends here, and dataclasses.replace looks each field up by name.
        return DeviceState(
            consent=consent,
            consent_broken=self.consent_broken,
            ledger=ledger,
            ledger_broken=self.ledger_broken,
            ledger_note=self.ledger_note,
            manifest=manifest,
            slots=slots,
            directory_broken=self.directory_broken,
            load_blocked=self.load_blocked,
        )


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


def _saved_epsilon(budget: object) -> float:
    """The lifetime ε a saved accounting (``Budget.to_plain``) records, 0 if it records none."""
    value = budget.get("epsilon_total", 0.0) if isinstance(budget, dict) else 0.0
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def epsilon_recorded(files: StateFiles, state: DeviceState, name: str) -> float | None:
    """The most lifetime ε any file of the directory records for use case ``name`` (None if
    none records any): the manifest as in force and as on disk, the use-case file whatever
    its state unless it is another device's copy, and the ledger. Status never shows less
    (docs/state-integrity.md)."""
    seen: list[float] = []
    for manifest in (state.manifest, files.manifest_on_disk):
        entry = None if manifest is None else manifest.entries.get(name)
        if entry is not None:
            seen += [entry.epsilon_total, _saved_epsilon(entry.budget)]
    slot = state.slots.get(name)
    known = state.manifest or files.manifest_on_disk
    for doc in (None if slot is None else slot.doc, files.read_use_case_doc(name)):
        # Another device's copy records that device's spending, not this one's.
        if doc is not None and (known is None or doc.device in (None, known.device)):
            seen.append(_saved_epsilon(doc.budget))
    if state.ledger is not None:
        spent = state.ledger.epsilon_by_use_case().get(name)
        if spent is not None:
            seen.append(spent)
    return max(seen) if seen else None


def memos_recorded(files: StateFiles, state: DeviceState, name: str) -> int:
    """The most memos any file of the directory shows use case ``name`` held (0 if none
    shows any): its file if it opens and is this device's, a removed use case's count in
    the manifest, and the most records one report of the ledger carried (each record of a
    counter's or a string's period answers from a memo of its own). A lower bound where the
    file is gone: a memo whose reports the ledger no longer lists is not seen
    (docs/state-integrity.md, "Re-enrolment")."""
    seen = [0]
    for manifest in (state.manifest, files.manifest_on_disk):
        entry = None if manifest is None else manifest.entries.get(name)
        if entry is not None and entry.memos is not None:
            seen.append(entry.memos)
    doc = files.read_use_case_doc(name)
    known = state.manifest or files.manifest_on_disk
    if doc is not None and (known is None or doc.device in (None, known.device)):
        seen.append(memos_held(doc.permanent))
    if state.ledger is not None:
        seen += [len(e.records) for e in state.ledger.entries if e.use_case == name]
    return max(seen)
