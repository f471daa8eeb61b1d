"""Re-enrolling a device whose state stopped because files were deleted or replaced
(docs/state-integrity.md, "Re-enrolment").

A stopped use case never starts over by itself: that would redraw permanent randomness for
values already reported, the averaging attack memoization exists to stop (000 §3.1, 004 §2),
and reset its ε spent. Only the operator's explicit ``ldp-agent re-enrol`` does, and on these
terms:

* each affected use case becomes a removed entry of the manifest (a tombstone) carrying the
  most ε spent that any file of the directory records for it, and is then added back by
  :func:`agent.registry_change.carried_over`, which charges a new memo its longitudinal ε at
  once against the same lifetime cap (docs/privacy-accounting.md, "Registry changes"): ε spent
  is never reset below what a remaining file records (with the ledger deleted too, nothing
  records the reports sent; docs/state-integrity.md says so), and a use case whose cap cannot
  pay for the new memo stays stopped;
* when the manifest itself is gone, unreadable or another device's, every use case is
  affected and the device gets a new identity that consent, the ledger and the schedule are
  bound to; otherwise only the stopped use cases are, under the manifest in force;
* the ledger says what was done, per use case.

Each write is atomic and a re-enrolment interrupted half-way leaves a state that stops
again, so running it once more completes it: the ε carried is read again from the same files.
Its writes are its own, in their own order (not a step's transaction, :mod:`agent.transaction`):
the manifest first, from which on the old files are a removed use case's; then consent and
the schedule bound to a new device identity; then the ledger with its notices; then the old
files unlinked. The caller loads the state again afterwards, which adds the use cases back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from agent.device_state import DeviceState, epsilon_recorded, memos_recorded
from agent.manifest import ManifestDoc, ManifestEntry, with_ledger_flag
from agent.state import DEVICE_ID_BYTES, LedgerDoc, LedgerNotice, UseCaseDoc
from agent.statefiles import SCHEDULE, StateFiles
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, random_bytes
from protocol.registry import Registry

__all__ = ["Carried", "NothingToReEnrolError", "re_enrol"]

log = logging.getLogger("ldp_agent")


class NothingToReEnrolError(Exception):
    """Every use case runs and the ledger opens: re-enrolment would only cost ε."""


@dataclass(frozen=True, slots=True)
class Carried:
    """One re-enrolled use case.

    Attributes:
        use_case: its name.
        epsilon_total: the ε spent carried forward (the most any file records; 0 if none does).
    """

    use_case: str
    epsilon_total: float


def _best_budget(files: StateFiles, name: str) -> PlainDoc | None:
    """The accounting of the use case's file if it opens (the day's counts go on), else None."""
    doc: UseCaseDoc | None = files.read_use_case_doc(name)
    return None if doc is None else dict(doc.budget)


def re_enrol(
    files: StateFiles, state: DeviceState, registry: Registry, *, now: float, rng: RandomSource
) -> list[Carried]:
    """Start the stopped use cases anew, carrying their ε spent forward (see the module's docstring).

    The caller has checked consent and loads the state again afterwards.

    Raises:
        NothingToReEnrolError: nothing is stopped.
        StateWriteError: a file cannot be written (run it again once it can).
    """
    whole = state.manifest is None
    if whole:
        old = files.manifest_on_disk
        names = set(registry.use_cases) | files.use_case_names() | set(old.entries if old else ())
        if state.ledger is not None:
            names |= set(state.ledger.epsilon_by_use_case())
        manifest = ManifestDoc(device=random_bytes(rng, DEVICE_ID_BYTES))
    else:
        assert state.manifest is not None
        names = {n for n, slot in state.slots.items() if slot.broken}
        if not names and state.ledger_broken is None:
            raise NothingToReEnrolError("nothing to re-enrol: every use case runs and the ledger opens")
        manifest = state.manifest
    carried: list[Carried] = []
    notices: list[LedgerNotice] = []
    for name in sorted(names):
        spent = epsilon_recorded(files, state, name) or 0.0
        entry = manifest.entries.get(name)
        # A memo is assumed drawn: with its file gone nothing can show it was not, and a new
        # memo is then charged rather than given for free; one per memo any file shows.
        memos = max(1, memos_recorded(files, state, name))
        manifest = manifest.with_entry(
            name,
            ManifestEntry(
                0 if entry is None else entry.generation,
                spent,
                removed=True,
                budget=_best_budget(files, name),
                memo=True,
                memos=memos,
            ),
        )
        carried.append(Carried(name, spent))
        notices.append(
            LedgerNotice(
                now,
                name,
                f"re-enrolled by the operator: its state starts anew with new permanent randomness; ε spent "
                f"{spent:.4g} is carried forward (the most any state file recorded) and, for a memoized mechanism, "
                f"a new memo is charged for each memo the files show it had drawn ({memos}, at least one)",
            )
        )
    _write(files, state, with_ledger_flag(manifest, state.ledger), notices, whole=whole, now=now)
    files.unlink([files.use_case_path(name) for name in sorted(names)])
    for item in carried:
        log.warning("use case %s re-enrolled; ε spent %.4g carried forward", item.use_case, item.epsilon_total)
    return carried


def _write(
    files: StateFiles,
    state: DeviceState,
    manifest: ManifestDoc,
    notices: list[LedgerNotice],
    *,
    whole: bool,
    now: float,
) -> None:
    """Write the manifest with the re-enrolled use cases removed, then bind consent and the
    schedule to a new identity (``whole``), then the ledger with the notices."""
    # The manifest first: from then on the old files are a removed use case's, wiped at load.
    files.write_manifest(manifest)
    if whole and state.consent is not None:
        files.write_consent(replace(state.consent, device=manifest.device))
        if files.has(SCHEDULE):
            files.write_schedule(replace(files.read_schedule(), device=manifest.device))  # rebound as it is
    ledger = None
    if state.ledger is not None and (whole or state.ledger_broken is not None or notices):
        ledger = LedgerDoc(list(state.ledger.entries), [*state.ledger.notices, *notices], device=manifest.device)
    elif state.ledger is None and state.ledger_broken is not None:
        # An unreadable ledger cannot be repaired, and without one nothing is published: the
        # operator's re-enrolment starts a new one and says so in it (the ε figures carried
        # above came from the files that do open).
        lost = LedgerNotice(
            now,
            "",
            f"the ledger could not be read ({state.ledger_broken}) and was started anew by re-enrolment; "
            "the reports that left the device before are no longer listed",
        )
        ledger = LedgerDoc(notices=[lost, *notices], device=manifest.device)
    if ledger is not None:
        files.write_ledger(ledger)
        bound = with_ledger_flag(manifest, ledger)
        if bound != manifest:
            files.write_manifest(bound)  # the ledger is now written under it (docs/state-integrity.md)
