"""Use cases past their end date: nothing more is recorded, and the ledger says so.

A use case's ``expires`` date (:mod:`protocol.metadata`) is enforced on the device: from
00:00 UTC on that day, ``record`` is refused with :class:`~agent.errors.UseCaseExpiredError`,
naming the date and the owner, before anything is stored or charged. What was recorded before
stays where it is and is sent when its period ends, charged as any record is when it is sent,
so the period that ended at the expiry is reported whole and nothing after it is.

The ledger notes the stop once (and the renewal, when a registry with a later date resumes
the use case): the notice is written by the first collection cycle or start that sees the date
passed, and not again while the ledger's latest notice for the use case already says it. A
renewal is the same definition (the metadata is outside the definition hash), so the use
case's state file, its memos and its ε spent are untouched (docs/deploy.md, "Owners and end
dates").
"""

from __future__ import annotations

import logging

from agent.device_state import DeviceState
from agent.errors import UseCaseExpiredError
from agent.outbox import with_notices
from agent.state import LedgerNotice
from agent.transaction import Change
from protocol.registry import Registry, UseCase

__all__ = ["EXPIRED", "RENEWED", "expired_error", "note_expiries"]

log = logging.getLogger("ldp_agent")

EXPIRED = "expired on "
"""How the ledger's notice of a stop begins (the date follows)."""

RENEWED = "renewed: "
"""How the ledger's notice of a renewal begins."""


def expired_error(use_case: UseCase) -> UseCaseExpiredError:
    """The refusal of a value for a use case past its end date, naming the date and the owner."""
    meta = use_case.metadata
    assert meta.expires is not None
    return UseCaseExpiredError(
        f"use case {use_case.name!r} expired on {meta.expires.isoformat()} (owner: {meta.describe_owner()}): "
        "nothing more is recorded for it and this value was not kept; what was recorded before is still sent. "
        "A registry with a later expires date resumes it"
    )


def note_expiries(state: DeviceState, registry: Registry, *, now: float, retention: float) -> Change:
    """The ledger's notice for each use case that expired, or was renewed, since its last notice.

    Nothing changes without consent or while the ledger cannot be read (the log says it).
    """
    if state.consent is None or state.ledger is None:
        return Change()
    latest: dict[str, str] = {}
    for notice in state.ledger.notices:
        latest[notice.use_case] = notice.text
    notices = []
    for name, uc in registry.use_cases.items():
        meta = uc.metadata
        if meta.expires is None:
            continue
        last = latest.get(name, "")
        stop = f"{EXPIRED}{meta.expires.isoformat()}"
        if meta.expired(now) and not last.startswith(stop):
            text = (
                f"{stop} (owner: {meta.describe_owner()}): values are refused from then on; those recorded "
                "before are sent when their period ends, and nothing more is charged"
            )
            notices.append(LedgerNotice(now, name, text))
        elif not meta.expired(now) and last.startswith(EXPIRED):
            text = (
                f"{RENEWED}the registry moved its end date to {meta.expires.isoformat()} (owner: "
                f"{meta.describe_owner()}): it records again, with its state and ε spent as they were"
            )
            notices.append(LedgerNotice(now, name, text))
    for notice in notices:
        log.warning("use case %s: %s", notice.use_case, notice.text)
    return Change(ledger=with_notices(state, notices, now=now, retention=retention))
