"""Re-enrolling a device whose state stopped because files were deleted or replaced
(docs/state-integrity.md, "Re-enrolment").

A stopped use case never starts over by itself: that would redraw permanent randomness for
values already reported, the averaging attack memoization exists to stop (000 §3.1, 004 §2),
and reset its ε spent. Only the operator's explicit ``ldp-agent re-enrol`` does, and on these
terms:

* each affected use case becomes a removed entry of the manifest (a tombstone) carrying the
  most ε spent that any file of the directory records for it, and is then added back by
  :func:`agent.registry_change.apply_registry`, which charges a new memo its longitudinal ε at
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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.manifest import ManifestDoc, ManifestEntry
from agent.state import DEVICE_ID_BYTES, LedgerDoc, LedgerNotice, UseCaseDoc
from agent.statefiles import SUFFIX, StateFiles
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


def _names_on_disk(files: StateFiles) -> set[str]:
    """The use cases that have a file in the directory."""
    return {p.name[3 : -len(SUFFIX)] for p in files.directory.glob(f"uc-*{SUFFIX}")}


def _best_budget(files: StateFiles, name: str) -> PlainDoc | None:
    """The accounting of the use case's file if it opens (the day's counts go on), else None."""
    doc: UseCaseDoc | None = files.read_use_case_doc(name)
    return None if doc is None else dict(doc.budget)


def re_enrol(files: StateFiles, registry: Registry, *, now: float, rng: RandomSource) -> list[Carried]:
    """Start the stopped use cases anew, carrying their ε spent forward (see the module's docstring).

    The caller has checked consent and loads the state again afterwards.

    Raises:
        NothingToReEnrolError: nothing is stopped.
        StateWriteError: a file cannot be written (run it again once it can).
    """
    whole = files.manifest is None
    if whole:
        old = files.manifest_on_disk
        names = set(registry.use_cases) | _names_on_disk(files) | set(old.entries if old else ())
        if files.ledger is not None:
            names |= set(files.ledger.epsilon_by_use_case())
        device = random_bytes(rng, DEVICE_ID_BYTES)
        manifest = ManifestDoc(device=device)
    else:
        assert files.manifest is not None
        names = {n for n, slot in files.slots.items() if slot.broken}
        if not names and files.ledger_broken is None:
            raise NothingToReEnrolError("nothing to re-enrol: every use case runs and the ledger opens")
        manifest = files.manifest
    carried: list[Carried] = []
    notices: list[LedgerNotice] = []
    for name in sorted(names):
        spent = files.epsilon_recorded(name) or 0.0
        entry = manifest.entries.get(name)
        # A memo is assumed drawn: with its file gone nothing can show it was not, and a new
        # memo is then charged rather than given for free; one per memo any file shows.
        memos = max(1, files.memos_recorded(name))
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
    # The manifest first: from then on the old files are a removed use case's, wiped at load.
    files.manifest = files.write_manifest(manifest)
    if whole and files.consent is not None:
        consent = files.consent
        consent.device = manifest.device
        files.write_consent(consent)
        if files.path("agent" + SUFFIX).exists():
            files.write_schedule(files.read_schedule_file())  # rebound as it is
    if files.ledger is not None and (whole or files.ledger_broken is not None or notices):
        files.ledger.notices.extend(notices)
        files.write_ledger(files.ledger)
    elif files.ledger is None and files.ledger_broken is not None:
        # An unreadable ledger cannot be repaired, and without one nothing is published: the
        # operator's re-enrolment starts a new one and says so in it (the ε figures carried
        # above came from the files that do open).
        lost = LedgerNotice(
            now,
            "",
            f"the ledger could not be read ({files.ledger_broken}) and was started anew by re-enrolment; "
            "the reports that left the device before are no longer listed",
        )
        files.write_ledger(LedgerDoc(notices=[lost, *notices]))
    files.unlink([files.use_case_path(name) for name in sorted(names)])
    for item in carried:
        log.warning("use case %s re-enrolled; ε spent %.4g carried forward", item.use_case, item.epsilon_total)
    return carried
